"""scripts/test-run: the timing report of `make test` and the README's cost table made from it."""
import json
import time
from pathlib import Path
import unit_support

REPO = Path(__file__).resolve().parents[2]


def _load():
    return unit_support.load_script("test_run_script", REPO / "scripts" / "test-run")


tr = _load()


def test_scenario_rows_carry_results_times_and_cache_lines(tmp_path):
    (tmp_path / "a.result").write_text("a pass 120\n")
    (tmp_path / "a.log").write_text("x\n  │ hmk-bed-cache: hit engine-abc\nhmk-bed-cache: hit engine-abc\n")
    (tmp_path / "b.result").write_text("b fail 300\n")
    (tmp_path / "b.log").write_text("hmk-bed-cache: miss engine-def\nhmk-bed-cache: store engine-def\n")
    (tmp_path / "c.result").write_text("garbage\n")
    rows = tr._scenarios(tmp_path)
    assert [r["name"] for r in rows] == ["b", "a"]  # longest first, malformed result left out
    assert rows[1]["cache"] == {"hit": ["engine-abc"], "miss": [], "store": []}
    assert rows[0]["result"] == "fail" and rows[0]["cache"]["miss"] == ["engine-def"]


def test_readme_block_is_rewritten_and_checked(tmp_path, monkeypatch):
    report = {"commit": "abc", "started": "2026-12-02T21:00:00Z", "cold": False, "cores": 2, "rc": 0,
              "total_seconds": 1500, "parts": [{"name": "lint", "seconds": 60, "rc": 0, "cache": ""},
                                               {"name": "image", "seconds": 0, "rc": 0, "cache": "hit"}],
              "scenarios": [{"name": "a", "result": "pass", "seconds": 99,
                             "cache": {"hit": ["engine-k"], "miss": [], "store": []}}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(report))
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{tr.BEGIN}\nold\n{tr.END}\ntail\n")
    monkeypatch.setattr(tr, "REPO", tmp_path)
    assert tr.readme(str(path), check=True) == 1
    assert tr.readme(str(path), check=False) == 0
    text = readme.read_text()
    assert "25:00 (1500 s)" in text and "| `image` | 0 | hit |" in text and "| a | pass | 99 | engine-k | - |" in text
    assert text.startswith("head\n") and text.endswith("tail\n") and "old" not in text
    assert tr.readme(str(path), check=True) == 0


def _fake_repo(tmp_path, monkeypatch):
    # Each target records when it started and ended, so the test sees whether two ran at once.
    (tmp_path / "Makefile").write_text(
        "slow1:\n\t@date +%s.%N > s1.start; sleep 1; echo one; date +%s.%N > s1.end\n"
        "slow2:\n\t@date +%s.%N > s2.start; sleep 1; echo two; date +%s.%N > s2.end\n"
        "bad:\n\t@echo broken; exit 3\n"
        "after:\n\t@touch after.ran\n")
    monkeypatch.setattr(tr, "REPO", tmp_path)
    monkeypatch.setattr(tr, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(tr, "_commit", lambda: "abc")
    monkeypatch.setenv("HMK_TEST_LOGS", str(tmp_path / "logs"))


def test_parts_joined_by_plus_run_at_once_and_each_is_timed(tmp_path, monkeypatch, capsys):
    _fake_repo(tmp_path, monkeypatch)
    assert tr.run(["slow1+slow2", "after"]) == 0
    starts = [float((tmp_path / f"s{i}.start").read_text()) for i in (1, 2)]
    ends = [float((tmp_path / f"s{i}.end").read_text()) for i in (1, 2)]
    assert max(starts) < min(ends)  # the second started before the first ended
    report = json.loads((tmp_path / "reports" / "timing.json").read_text())
    assert [(p["name"], p["rc"]) for p in report["parts"]] == [("slow1", 0), ("slow2", 0), ("after", 0)]
    out = capsys.readouterr().out
    # Each member's output is printed whole, after its own header, never interleaved.
    assert out.index("output of slow1") < out.index("one") < out.index("output of slow2") < out.index("two")


def test_a_failed_member_stops_the_run_after_its_group(tmp_path, monkeypatch):
    _fake_repo(tmp_path, monkeypatch)
    assert tr.run(["slow1+bad", "after"]) == 2  # make exits 2 when a recipe fails
    report = json.loads((tmp_path / "reports" / "timing.json").read_text())
    assert [(p["name"], p["rc"]) for p in report["parts"]] == [("slow1", 0), ("bad", 2)]
    assert not (tmp_path / "after.ran").exists()


def test_cpu_busy_share_is_measured_from_proc_stat_and_shown_per_part():
    before = tr._cpu_times()
    sum(i * i for i in range(200000))  # some work between the two readings...
    time.sleep(0.05)  # ...and a wait longer than the kernel's 10-ms tick, so that the total has moved
    after = tr._cpu_times()
    assert 0 < before[0] <= before[1] and after[1] > before[1]
    share = tr._busy_pct(before, after)
    assert share is not None and 0 <= share <= 100
    # Idle and iowait are not busy: 300 of 1000 jiffies busy is 30 %; no elapsed jiffies gives no figure.
    assert tr._busy_pct((100, 1000), (400, 2000)) == 30
    assert tr._busy_pct((5, 10), (5, 10)) is None
    report = {"commit": "abc", "started": "2026-12-03T16:00:00Z", "cold": True, "cores": 2, "rc": 0,
              "total_seconds": 60, "scenarios": [],
              "parts": [{"name": "unit", "seconds": 50, "rc": 0, "cache": "", "cpu_busy_pct": 97},
                        {"name": "old", "seconds": 10, "rc": 0, "cache": ""}]}
    table = tr.render(report)
    assert "| `unit` | 50 |  | 97 % |" in table
    assert "| `old` | 10 |  |  |" in table  # a report from before the column still renders
