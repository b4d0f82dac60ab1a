"""A model sync's progress on the controller (issue 29 item 4): hmk_model_fetch's own log lines, written by the real
Syncer and ProgressLog here (not a copy of their format), read back by module_utils' describe_sync_log as
`<model>: <bytes> of <bytes> (<pct>), <rate>, <time> left`; the node lock that keeps one model's sync at a time
when the role starts one background job per model."""
import hashlib
import os
import threading
import time

import pytest

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_sync as hmk

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
    # a.bin published, b.bin half-way (3 MiB): 5 of 8 MiB, at b's 3 MiB/s (3.1 MB/s in the log) the 3 MiB left take 1.01 s, shown as 2s.
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
    first, second = hmk.ProgressLog(str(tmp_path / "log"), "first", 0), hmk.ProgressLog(str(tmp_path / "log"), "second", 0)
    order = []
    with hmk.one_sync_at_a_time(str(tmp_path / "state"), first):
        waiter = threading.Thread(target=lambda: hmk.one_sync_at_a_time(str(tmp_path / "state"), second).__enter__()
                                  or order.append("second"))
        waiter.start()
        for _ in range(200):
            if os.path.exists(str(tmp_path / "log")):
                break
            time.sleep(0.01)
        order.append("first")
    waiter.join(5)
    assert order == ["first", "second"]
    lines = open(str(tmp_path / "log")).read().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["second " + hmk.WAITING]
    assert hmk.describe_sync_log(lines, "second") == "second: " + hmk.WAITING
