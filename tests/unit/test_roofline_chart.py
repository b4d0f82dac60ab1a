"""validate's roofline chart and its before/after-tuning section: what the chart shows (ceilings, the published band,
the profile's seed points at their models' GB per token, the measured, before and tuned points), the PNG drawn by
the hmk_roofline_chart module (a real image: signature, size, decodable), and the tuning section that only counts
for the deployment it tuned."""
import importlib.util
import struct
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


val = _load("validate_filters_for_chart", REPO / "plugins" / "filter" / "validate.py")
chart = _load("hmk_roofline_chart", REPO / "plugins" / "modules" / "hmk_roofline_chart.py")
SEEDS = yaml.safe_load((REPO / "roles" / "validate" / "vars" / "main.yml").read_text())["__validate_seed_figures_builtin"]
GB = 1000 ** 3


def report(tg=15.0, gb_per_token=10.8, tuning=None, meaningful=True):
    line = val.roofline(int(gb_per_token * GB), 300.0, 460.8, tg)
    return {"host": "epyc-node", "profile": "genoa-1x4090",
            "model": {"path": "/srv/models/DeepSeek-R1-IQ4_XS-00001-of-00010.gguf", "numbers_meaningful": meaningful,
                      "meaning": "model of 330.6 GiB" if meaningful else "tiny"},
            "memory_bandwidth": {"measured": {"available": True, "read_gbps": 300.0},
                                 "theoretical": {"available": True, "gbps": 460.8}},
            "roofline": line, "bench": {"tg": {"available": True, "tps": tg}},
            "tuning": tuning or val.unavailable("not tuned")}


def tune_json(sha="abc", ok=True):
    return {"deployment_sha256": sha, "ok": ok, "date": "2026-12-02T10:00:00Z", "build": "55d3c05bf7b3-0a1b2c3d",
            "objective": {"kind": "tg", "prompt_tokens": 2048, "gen_tokens": 128}, "gain": 0.12,
            "changed_flags": ["inference_service_threads"], "trials": [{}] * 9, "stopped": "every candidate measured",
            "baseline": {"pp_tps": 250.0, "tg_tps": 13.0, "score": 13.0},
            "best": {"pp_tps": 248.0, "tg_tps": 14.6, "score": 14.6}}


def test_every_seed_figure_sits_at_its_model_s_gb_per_token_from_the_brief():
    expected = {"DeepSeek-R1.*IQ4_XS": 10.8, "DeepSeek-R1.*Q4_K_M": 12.3, "Qwen3-235B-A22B.*Q4_K_M": 8.6}
    for entry in SEEDS:
        assert entry["gb_per_token"] == expected[entry["model_pattern"]], entry


def test_the_chart_shows_both_ceilings_the_published_band_and_the_profile_s_seeds():
    spec = val.chart_spec(report(), SEEDS, "genoa-1x4090")
    assert [b["kind"] for b in spec["bandwidths"]] == ["theoretical", "measured"]
    assert spec["band"] == [0.35, 0.55]
    published = [p for p in spec["points"] if p["kind"] == "published"]
    # every seed of the profile, whatever its model: mainline and ik on R1, KTransformers at tg 14
    assert sorted((p["gb_per_token"], p["tps"]) for p in published) == [(10.8, 15.8), (12.3, 9.4), (12.3, 14.0)]
    (measured,) = [p for p in spec["points"] if p["kind"] == "measured"]
    assert measured["gb_per_token"] == 10.8 and measured["tps"] == 15.0
    assert val.chart_spec(report(), SEEDS, "milan-4x4090")["points"][0]["tps"] == 9.2


def test_after_tuning_the_chart_shows_the_point_before_and_the_tuned_one():
    line = val.roofline(int(10.8 * GB), 300.0, 460.8, 15.0)
    tuning = val.tuning_section(tune_json("abc"), "abc", line, 15.0)
    spec = val.chart_spec(report(tuning=tuning), SEEDS, "genoa-1x4090")
    kinds = {p["kind"]: p["tps"] for p in spec["points"] if p["kind"] != "published"}
    assert kinds == {"before": 13.0, "tuned": 15.0}


def test_the_tuning_section_counts_only_for_the_deployment_it_tuned():
    line = val.roofline(int(10.8 * GB), 300.0, 460.8, 15.0)
    section = val.tuning_section(tune_json("abc"), "abc", line, 15.0)
    assert section["available"] is True
    ceiling = 300.0 * GB / int(10.8 * GB)
    assert section["before"]["efficiency_vs_measured"] == round(13.0 / ceiling, 4)
    assert section["tuned"]["efficiency_vs_theoretical"] == round(14.6 / (460.8 * GB / int(10.8 * GB)), 4)
    assert section["validated"]["tg_tps"] == 15.0
    other = val.tuning_section(tune_json("abc"), "def", line, 15.0)
    assert other["available"] is False and "another deployment" in other["reason"]
    assert val.tuning_section({}, "abc", line, 15.0)["reason"].startswith("this deployment was not tuned")
    assert "no working flags" in val.tuning_section(tune_json("abc", ok=False), "abc", line, 15.0)["reason"]


def test_the_markdown_report_shows_before_and_after_against_the_roofline_and_links_the_chart():
    rep = val.report({"host": "n", "hardware": {}, "deployment": {"model": "/m/tiny-x.gguf"}, "tuning": tune_json("s"),
                      "deployment_sha256": "s", "min_meaningful_bytes": 1, "tiny_pattern": "^tiny-"})
    rep["chart"] = "validate-roofline.png"
    text = val.report_markdown(rep)
    assert "| before tuning (search baseline) | 13.0 |" in text
    assert "| tuned (search winner) | 14.6 |" in text
    assert "![roofline](validate-roofline.png)" in text
    assert val.report_markdown(dict(rep, tuning=val.unavailable("x"), chart={"available": False})).count("roofline](") == 0


def _png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_the_chart_is_a_real_png_of_the_asked_size(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is pinned in requirements.txt")
    line = val.roofline(int(10.8 * GB), 300.0, 460.8, 15.0)
    spec = val.chart_spec(report(tuning=val.tuning_section(tune_json("abc"), "abc", line, 15.0)), SEEDS, "genoa-1x4090")
    path = tmp_path / "validate-roofline.png"
    chart.draw(spec, str(path), 1000, 650)
    assert _png_size(path) == (1000, 650)
    import matplotlib.image
    pixels = matplotlib.image.imread(str(path))
    assert pixels.shape[:2] == (650, 1000) and pixels.std() > 0.05  # something is drawn, not a blank canvas
    again = tmp_path / "again.png"
    chart.draw(spec, str(again), 1000, 650)
    assert again.read_bytes() == path.read_bytes()  # no timestamp: an unchanged report redraws the same bytes


def test_a_tiny_model_s_chart_says_its_numbers_are_not_meaningful(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is pinned in requirements.txt")
    spec = val.chart_spec(report(tg=1200.0, gb_per_token=0.004, meaningful=False), SEEDS, "lab-twin")
    assert spec["note"].startswith("not meaningful") and [p["kind"] for p in spec["points"]] == ["measured"]
    chart.draw(spec, str(tmp_path / "t.png"), 640, 400)
    assert _png_size(tmp_path / "t.png") == (640, 400)
