"""A model sync's progress on the controller (issue 29 item 4): hmk_model_fetch's own log lines, written by the real
Syncer and ProgressLog here (not a copy of their format), read back by module_utils' describe_sync_log as
`<model>: <bytes> of <bytes> (<pct>), <rate>, <time> left`; the node lock that keeps one model's sync at a time
when the role starts one background job per model."""
import grp
import hashlib
import http.server
import json
import os
import pwd
import re
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_sync as hmk

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = "tiny-qwen3moe"
MIB = 1024 * 1024


class SteppedSource:
    """A source that sends each file in two halves and has the real ProgressLog write its progress line in between,
    as its thread does every progress_interval seconds."""
    location = "/srv/models/%s" % MODEL

    def __init__(self, data, fail=None):
        self.data, self.fail, self.log = data, fail, None

    def describe(self, relpath):
        return "%s/%s" % (self.location, relpath)

    def fetch(self, relpath, partial, size, digest):
        body = self.data[relpath]
        offset = os.path.getsize(partial) if os.path.exists(partial) else 0
        half = offset + (size - offset) // 2
        with open(partial, "ab") as handle:
            for step, chunk in enumerate((body[offset:half], body[half:size])):
                handle.write(chunk)
                handle.flush()
                digest.update(chunk)
                if step == 0:
                    self.log._report()
        if relpath == self.fail:
            raise hmk.SyncError("%s: connection reset after %d bytes" % (relpath, size - offset))
        return digest, size - offset


@pytest.fixture
def clock(monkeypatch):
    """ProgressLog's rate is bytes over time.time() between track and report: one second per call here."""
    ticks = iter(range(10 ** 6, 10 ** 7))
    monkeypatch.setattr(hmk.time, "time", lambda: float(next(ticks)))


def run_sync(tmp_path, sizes, resume=None, fail=None):
    """Runs a real Syncer (parallel 1, so the lines come in a known order) and returns the log's lines."""
    data = {name: os.urandom(size) for name, size in sizes.items()}
    files = [{"name": name, "size": size, "sha256": hashlib.sha256(data[name]).hexdigest()}
             for name, size in sizes.items()]
    source = SteppedSource(data, fail=fail)
    log_path = str(tmp_path / "hmk-model-sync.log")
    source.log = hmk.ProgressLog(log_path, MODEL, 0)
    dest = tmp_path / "models" / MODEL
    for name, length in (resume or {}).items():
        staging = tmp_path / "models" / ".staging" / MODEL
        staging.mkdir(parents=True, exist_ok=True)
        (staging / (name + ".partial")).write_bytes(data[name][:length])
    syncer = hmk.Syncer(MODEL, str(dest), str(tmp_path / "state"), str(tmp_path / "quarantine"), files, source,
                        parallel=1, log=source.log, owner=os.getuid(), group=os.getgid())
    syncer.run()
    with open(log_path) as handle:
        return handle.read().splitlines()


def test_the_real_lines_have_the_format_the_reader_knows(tmp_path, clock):
    lines = run_sync(tmp_path, {"a.bin": 4 * MIB})
    texts = [line.split(" ", 2)[2] for line in lines]
    assert [line.split(" ", 2)[1] for line in lines] == [MODEL] * 4
    assert texts[0].startswith("sync of 1 file(s), %d bytes missing, " % (4 * MIB))
    assert texts[1] == "a.bin: fetching %d bytes from /srv/models/%s/a.bin" % (4 * MIB, MODEL)
    # One second after the track, half the file: 2 MiB/s, 1 s for the other half.
    assert texts[2] == "a.bin: %d/%d bytes (50.0%%) at 2.1 MB/s, ETA 0m01s" % (2 * MIB, 4 * MIB)
    assert texts[3].startswith("a.bin: verified (sha256 ") and texts[3].endswith(") and published")


def test_a_sync_half_way_shows_bytes_rate_and_time_left(tmp_path, clock):
    lines = run_sync(tmp_path, {"a.bin": 4 * MIB})
    assert hmk.describe_sync_log(lines[:3], MODEL) == "%s: 2.0 MiB of 4.0 MiB (50%%), 2.0 MiB/s, 1s left" % MODEL
    assert hmk.describe_sync_log(lines, MODEL) == "%s: 4.0 MiB of 4.0 MiB (100%%)" % MODEL


def test_files_done_count_and_the_active_files_rate_is_the_rate(tmp_path, clock):
    lines = run_sync(tmp_path, {"a.bin": 2 * MIB, "b.bin": 6 * MIB})
    # a.bin published, b.bin half-way (3 MiB): 5 of 8 MiB; at b's 3 MiB/s (3.1 MB/s in the log) the 3 MiB left take
    # 1.01 s, shown as 2s.
    at = next(i for i, line in enumerate(lines) if "b.bin: 3145728/" in line)
    assert hmk.describe_sync_log(lines[:at + 1], MODEL) == "%s: 5.0 MiB of 8.0 MiB (62%%), 3.0 MiB/s, 2s left" % MODEL


def test_a_resumed_file_counts_only_the_bytes_that_were_missing(tmp_path, clock):
    lines = run_sync(tmp_path, {"a.bin": 8 * MIB}, resume={"a.bin": 4 * MIB})
    assert " resuming at byte %d of %d " % (4 * MIB, 8 * MIB) in lines[1]
    assert hmk.describe_sync_log(lines[:3], MODEL) == "%s: 2.0 MiB of 4.0 MiB (50%%), 2.0 MiB/s, 1s left" % MODEL


def test_a_failed_file_is_named_in_the_count(tmp_path, clock):
    lines = run_sync(tmp_path, {"a.bin": 2 * MIB, "b.bin": 2 * MIB}, fail="a.bin")
    assert any(line.split(" ", 2)[2].startswith("ERROR a.bin: ") for line in lines)
    described = hmk.describe_sync_log(lines[:-1], MODEL)
    # a.bin's bytes as far as its last progress line went (the log says no more), b.bin half-way.
    assert described == "%s: 2.0 MiB of 4.0 MiB (50%%), 977 KiB/s, 3s left, 1 file(s) failed" % MODEL


def test_other_models_and_earlier_runs_are_not_this_run(tmp_path, clock):
    lines = run_sync(tmp_path, {"a.bin": 4 * MIB})
    other = [line.replace(" %s " % MODEL, " other-model ", 1) for line in lines]
    # Another model's complete sync interleaved, and this model's own last run before the job started.
    earlier = ["2020-01-01T00:00:00Z %s sync of 1 file(s), 9 bytes missing, 5 bytes free at /x, from /y" % MODEL]
    mixed = earlier + [line for pair in zip(lines[:3], other) for line in pair]
    since = hmk.calendar.timegm(time.strptime(lines[0][:20], "%Y-%m-%dT%H:%M:%SZ"))
    assert hmk.describe_sync_log(mixed, MODEL, since) == "%s: 2.0 MiB of 4.0 MiB (50%%), 2.0 MiB/s, 1s left" % MODEL
    # The earlier run alone, before this job wrote a line: nothing of it is reported as this run's.
    assert hmk.describe_sync_log(earlier, MODEL, since) == "%s: starting, no progress yet" % MODEL


def test_repeated_lines_change_nothing(tmp_path, clock):
    """The action plugin sends the model's event lines, then its last lines: the second part repeats some of the first."""
    lines = run_sync(tmp_path, {"a.bin": 2 * MIB, "b.bin": 6 * MIB})
    at = next(i for i, line in enumerate(lines) if "b.bin: 3145728/" in line) + 1
    events = [line for line in lines[:at] if hmk.LOG_PROGRESS_MARK not in line]
    assert hmk.describe_sync_log(events + lines[at - 3:at], MODEL) == hmk.describe_sync_log(lines[:at], MODEL)


def test_without_progress_lines_the_rate_comes_from_the_bytes_over_the_time_the_log_covers():
    lines = ["2026-12-03T12:00:00Z m sync of 2 file(s), 3221225472 bytes missing, 9 bytes free at /m, from http://p/m",
             "2026-12-03T12:00:00Z m a.gguf: fetching 1073741824 bytes from http://p/m/a.gguf",
             "2026-12-03T12:00:00Z m b.gguf: fetching 2147483648 bytes from http://p/m/b.gguf",
             "2026-12-03T12:00:04Z m a.gguf: verified (sha256 %s) and published" % ("0" * 64)]
    assert hmk.describe_sync_log(lines, "m") == "m: 1.0 GiB of 3.0 GiB (33%), 256 MiB/s, 8s left"


@pytest.mark.parametrize("count, text", [(0, "0 B"), (1023, "1023 B"), (412 * MIB, "412 MiB"),
                                         (int(1.2 * 1024 * MIB), "1.2 GiB"), (3 * 1024 ** 4, "3.0 TiB")])
def test_bytes_read_as_people_read_them(count, text):
    assert hmk.format_bytes(count) == text


def test_a_second_model_waits_for_the_first_and_says_so(tmp_path):
    first, second = (hmk.ProgressLog(str(tmp_path / "log"), name, 0) for name in ("first", "second"))
    order = []
    with hmk.one_sync_at_a_time(str(tmp_path / "state"), first):
        waiter = threading.Thread(target=lambda: hmk.one_sync_at_a_time(str(tmp_path / "state"), second).__enter__()
                                  or order.append("second"))
        waiter.start()
        for _attempt in range(200):
            if os.path.exists(str(tmp_path / "log")):
                break
            time.sleep(0.01)
        order.append("first")
    waiter.join(5)
    assert order == ["first", "second"]
    lines = open(str(tmp_path / "log")).read().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["second " + hmk.WAITING]
    assert hmk.describe_sync_log(lines, "second") == "second: " + hmk.WAITING


# --- the role's tasks, run by ansible-playbook on this machine ------------------------------------------------------

class SlowStore(http.server.BaseHTTPRequestHandler):
    """Serves the test's files at about 4 MiB/s, so that a sync lasts a few of the role's 1-second checks."""
    files = {}

    def do_GET(self):  # noqa: N802 (the name http.server calls)
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for start in range(0, len(body), 256 * 1024):
            self.wfile.write(body[start:start + 256 * 1024])
            # 4 s per 8-MiB model: several 1-s polls see its rate on a fast, idle machine too (at 2 s one finished
            # between two polls and no line with a rate was printed).
            time.sleep(0.125)

    def log_message(self, *args):
        pass


def run_role_sync(tmp_path, models):
    """The role's sync tasks (tasks_from: sync) on this machine, with the kit's stdout callback; its screen output."""
    data = {name: os.urandom(8 * MIB) for name in models}
    SlowStore.files = {"/%s/%s.bin" % (name, name): body for name, body in data.items()}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowStore)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    catalog = {name: {"files": [{"name": name + ".bin", "size": 8 * MIB,
                                 "sha256": hashlib.sha256(body).hexdigest()}]} for name, body in data.items()}
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    variables = dict(
        __model_sync_catalog_builtin={}, model_sync_catalog=catalog, model_sync_models=list(models),
        model_sync_source="http", model_sync_http_base_url="http://127.0.0.1:%d" % server.server_address[1],
        model_sync_path=str(tmp_path / "models"), model_sync_state_path=str(tmp_path / "state"),
        model_sync_quarantine_path=str(tmp_path / "quarantine"), model_sync_staging_path=str(tmp_path / "staging"),
        model_sync_log_path=str(tmp_path / "hmk-model-sync.log"), model_sync_progress_interval=1, model_sync_poll=1,
        model_sync_file_owner=user, model_sync_file_group=group)
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    (tmp_path / "sync.yml").write_text(
        "- hosts: node-1\n  gather_facts: false\n  tasks:\n"
        "    - {name: The sync, ansible.builtin.include_role: {name: hmk.moe_kit.model_sync, tasks_from: sync}}\n")
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    node-1:\n      ansible_connection: local\n      ansible_python_interpreter: %s\n"
        % json.dumps(sys.executable))
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="hmk.moe_kit.hmk_progress", ANSIBLE_CONFIG=str(tmp_path / "none.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_HOME=str(tmp_path / "home"),
               ANSIBLE_ASYNC_DIR=str(tmp_path / "async"))
    try:
        run = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "hosts.yml",
                              "-e", "@vars.json", "sync.yml"], cwd=str(tmp_path), env=env, capture_output=True,
                             text=True, timeout=300, check=False)
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for name, body in data.items():
        with open(str(tmp_path / "models" / name / (name + ".bin")), "rb") as handle:
            assert handle.read() == body
    return run.stdout


def test_the_role_shows_each_model_sync_s_bytes_rate_and_time_left_and_reports_its_result(tmp_path):
    out = run_role_sync(tmp_path, ["tiny-a", "tiny-b"])
    assert "FAILED" not in out and "RETRYING" not in out
    task = "Checked at each poll, each model's sync from the source has finished"
    progress = re.findall(r"^  \[node-1\] %s: (.*)$" % re.escape(task), out, re.M)
    bytes_rate_left = re.compile(r"^tiny-[ab]: [0-9.]+ MiB of 8\.0 MiB \(\d+%\), [0-9.]+ [KM]iB/s, \d+s left$")
    assert any(bytes_rate_left.match(line) for line in progress), out
    # Before a file's first progress line there is no rate yet; a job that waits for the node's other sync says so.
    no_rate_yet = re.compile(r"^tiny-[ab]: [0-9.]+ [KM]?i?B of 8\.0 MiB \(\d+%\)$")
    waiting = ["%s: %s" % (name, text) for name in ("tiny-a", "tiny-b") for text in ("starting, no progress yet", hmk.WAITING)]
    assert all(bytes_rate_left.match(line) or no_rate_yet.match(line) or line in waiting for line in progress), progress
    # The last task reads each job's own result: the module's counts, with the model as item.
    for name in ("tiny-a", "tiny-b"):
        assert "%s: 1 file(s) fetched, %d bytes received, %d bytes were missing." % (name, 8 * MIB, 8 * MIB) in out
    # The node's log keeps the same lines.
    log = (tmp_path / "hmk-model-sync.log").read_text()
    assert re.search(r" tiny-a tiny-a\.bin: \d+/%d bytes \(" % (8 * MIB), log)
