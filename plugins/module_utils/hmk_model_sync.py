# -*- coding: utf-8 -*-
"""Model sync logic for hybrid-moe-kit: GGUF checks against the catalog (the reader is hmk_gguf), catalog rules, free-space arithmetic and
the resumable, verified fetch. Pure Python 3 standard library, so the node needs no extra packages and
the unit tests import it without Ansible.

HTTP/HTTPS bodies are received here (http.client, ranged resume, redirects only where allowed); rsync (SSH,
--append-verify) and local copies are the other transfers. This module hashes the bytes while they stream into `<staging>/<model>/<name>.partial`,
validates the GGUF header, and publishes by atomic rename. Nothing is written outside the staging area,
the models root, the stamps and the quarantine; a refused or failed transfer leaves its partial in
staging, where the next run resumes it. A bad file never replaces a good one: it goes to quarantine.
"""
from __future__ import absolute_import, division, print_function

import calendar
import contextlib
import errno
import fcntl
import hashlib
import http.client
import json
import math
import mmap
import os
import queue
import re
import shutil
import ssl
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urljoin, urlsplit

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_gguf import GGUFError, read_gguf
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import CONTROL, rule_component, rule_rel_path

__metaclass__ = type

CHUNK = 4 * 1024 * 1024
SHA256_RE = re.compile(r"[0-9a-f]{64}")


def safetensors_problems(path):
    """Problems of a safetensors shard's header (8-byte length, JSON table, every tensor inside the file): the
    safetensors counterpart of the GGUF header check, so a shard that would not load is never published."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            return ["%s is too short for a safetensors header" % path]
        length = int.from_bytes(raw, "little")
        if length <= 0 or 8 + length > size or length > 100 * 1024 * 1024:
            return ["%s declares a %d-byte safetensors header in a %d-byte file" % (path, length, size)]
        try:
            header = json.loads(handle.read(length).decode("utf-8"))
        except ValueError as exc:
            return ["%s has no JSON safetensors header (%s)" % (path, exc)]
    data = size - 8 - length
    bad = [name for name, info in header.items() if name != "__metadata__"
           and not (isinstance(info, dict) and 0 <= info.get("data_offsets", [-1, -1])[0] <= info["data_offsets"][1] <= data)]
    return ["%s: tensors outside the file: %s" % (path, ", ".join(sorted(bad)[:5]))] if bad else []


class SyncError(Exception):
    """A failure the operator must act on; the message says what and where."""


# --------------------------------------------------------------------------------------------- GGUF

# What a catalog's `gguf:` block may say, and where GGUF keeps it ({arch} is general.architecture).
GGUF_EXPECT_KEYS = {
    "architecture": "general.architecture",
    "block_count": "{arch}.block_count",
    "expert_count": "{arch}.expert_count",
    "expert_used_count": "{arch}.expert_used_count",
    "expert_shared_count": "{arch}.expert_shared_count",
    "leading_dense_block_count": "{arch}.leading_dense_block_count",
    "context_length": "{arch}.context_length",
    "rope_freq_base": "{arch}.rope.freq_base",
    "rope_dimension_count": "{arch}.rope.dimension_count",
    "rope_scaling_type": "{arch}.rope.scaling.type",
    "rope_scaling_factor": "{arch}.rope.scaling.factor",
    "rope_scaling_original_context_length": "{arch}.rope.scaling.original_context_length",
    "kv_lora_rank": "{arch}.attention.kv_lora_rank",
}


def _same(expected, observed):
    if isinstance(expected, float) or isinstance(observed, float):
        try:
            return abs(float(expected) - float(observed)) <= 1e-6 * max(1.0, abs(float(expected)))
        except (TypeError, ValueError):
            return False
    return expected == observed


def check_gguf(meta, expect, split_index, split_count):
    """Problems (a list of sentences) between one file's metadata and the catalog's `gguf:` block.

    Every split carries split.no/split.count; the model's own keys live in the first split only,
    as llama.cpp's gguf-split and gguf-py write them.
    """
    problems = []
    kv = meta["metadata"]
    if split_count > 1:
        if kv.get("split.count") != split_count:
            problems.append("split.count is %s, the catalog says %d" % (kv.get("split.count"), split_count))
        if kv.get("split.no") != split_index:
            problems.append("split.no is %s, expected %d for this file" % (kv.get("split.no"), split_index))
    elif "split.count" in kv and kv["split.count"] != 1:
        problems.append("split.count is %s, the catalog lists one file" % kv["split.count"])
    if split_index != 0:
        return problems
    arch = kv.get("general.architecture")
    for name, wanted in sorted((expect or {}).items()):
        if name == "split_count" or wanted is None:
            continue
        key = GGUF_EXPECT_KEYS[name].format(arch=arch)
        if key not in kv:
            problems.append("%s is missing (the catalog expects %r)" % (key, wanted))
        elif not _same(wanted, kv[key]):
            problems.append("%s is %r, the catalog expects %r" % (key, kv[key], wanted))
    return problems


# ------------------------------------------------------------------------------------------ catalog

def validate_catalog(catalog, selected, require_hashes=True):
    """Problems with the catalog entries of the selected models, as sentences naming model and file."""
    problems = []
    for model in selected:
        entry = catalog.get(model)
        if not isinstance(entry, dict):
            problems.append("model %r is not in the catalog (known: %s)" % (model, ", ".join(sorted(catalog))))
            continue
        files = entry.get("files") or []
        # A Hub entry may name its split set by huggingface.include alone: the lock lists and counts the files.
        if not files and not (entry.get("huggingface") or {}).get("include"):
            problems.append("model %r lists no files" % model)
        gguf_files = [f for f in files if str(f.get("name", "")).endswith(".gguf")]
        split_count = (entry.get("gguf") or {}).get("split_count")
        if split_count is not None and split_count != len(gguf_files):
            problems.append("model %r: gguf.split_count is %s but %d .gguf files are listed"
                            % (model, split_count, len(gguf_files)))
        unknown = sorted(set(entry.get("gguf") or {}) - set(GGUF_EXPECT_KEYS) - {"split_count"})
        if unknown:
            problems.append("model %r: unknown gguf keys %s" % (model, ", ".join(unknown)))
        names = set()
        if rule_component(model):
            problems.append("model id %r refused: it names the model's directory, so it must be %s"
                            % (model, rule_component(model)))
        if entry.get("source_dir") is not None and rule_rel_path(entry["source_dir"]):
            problems.append("model %r: source_dir %r refused: %s" % (model, entry["source_dir"],
                                                                     rule_rel_path(entry["source_dir"])))
        for item in files + list(entry.get("hf_files") or []):
            name = item.get("name")
            if not name or rule_component(name):
                problems.append("model %r: file name %r must be a plain file name (%s)"
                                % (model, name, rule_component(name)))
                continue
            if item.get("source") and rule_rel_path(item["source"]):
                problems.append("model %r: file %s has source %r, refused: %s" % (model, name, item["source"],
                                                                                  rule_rel_path(item["source"])))
            if name in names:
                problems.append("model %r: file %s is listed twice" % (model, name))
            names.add(name)
            if not require_hashes:
                continue
            if not SHA256_RE.fullmatch(str(item.get("sha256") or "")):
                problems.append("model %r: file %s has no sha256 (64 lowercase hex digits) in the catalog; fill it "
                                "from the publisher's manifest (e.g. the LFS sha256 on the file's Hugging Face page)"
                                % (model, name))
            size = item.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                problems.append("model %r: file %s has no size in bytes in the catalog; fill it from the publisher's "
                                "manifest" % (model, name))
    return problems


# ---------------------------------------------------------------------------------------- free space

def existing_ancestor(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def free_bytes(path):
    stat = os.statvfs(existing_ancestor(path))
    return stat.f_bavail * stat.f_frsize


def missing_bytes(size, partial_size):
    """Bytes still to fetch for one file: a partial longer than the file counts for nothing."""
    if partial_size > size:
        return size
    return size - partial_size


def space_problem(path, needed, free, margin):
    """None when `needed` bytes plus `margin` fit in `free`, else the sentence to fail with."""
    if needed == 0 or needed + margin <= free:
        return None
    gib = float(1 << 30)
    return ("not enough free space at %s: the missing files need %d bytes (%.2f GiB) plus a margin of %d bytes "
            "(%.2f GiB) = %d bytes, and %d bytes (%.2f GiB) are free; free %d bytes or lower "
            "model_sync_free_space_margin_gb" % (path, needed, needed / gib, margin, margin / gib, needed + margin,
                                                 free, free / gib, needed + margin - free))


# -------------------------------------------------------------------------------------------- hashing

def sha256_file(path, limit=None):
    digest = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as handle:
        while remaining is None or remaining > 0:
            block = handle.read(CHUNK if remaining is None else min(CHUNK, remaining))
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest


def read_stamp(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def stamp_matches(stamp, stat, sha256):
    return (isinstance(stamp, dict) and stamp.get("sha256") == sha256 and stamp.get("size") == stat.st_size
            and stamp.get("mtime_ns") == stat.st_mtime_ns)


# ------------------------------------------------------------------------------------------- transfer

class ProgressLog:
    """Appends progress lines to a log file the operator can `tail -f` during a long sync."""

    def __init__(self, path, model, interval):
        self.path, self.model, self.interval = path, model, interval
        self.lock = threading.Lock()
        self.active = {}
        self.stop = threading.Event()
        self.thread = None

    def line(self, text):
        if not self.path:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self.lock:
            with open(self.path, "a") as handle:
                handle.write("%s %s %s\n" % (stamp, self.model, text))

    def track(self, name, partial, size):
        with self.lock:
            self.active[name] = (partial, size, time.time(), _size_of(partial))

    def untrack(self, name):
        with self.lock:
            self.active.pop(name, None)

    def _report(self):
        with self.lock:
            active = dict(self.active)
        for name, (partial, size, started, first) in sorted(active.items()):
            done = _size_of(partial)
            elapsed = max(time.time() - started, 1e-3)
            rate = max(done - first, 0) / elapsed
            eta = "%dm%02ds" % divmod(int((size - done) / rate), 60) if rate > 0 else "unknown"
            self.line("%s: %d/%d bytes (%.1f%%) at %.1f MB/s, ETA %s"
                      % (name, done, size, 100.0 * done / max(size, 1), rate / 1e6, eta))

    def _run(self):
        while not self.stop.wait(self.interval):
            self._report()

    def __enter__(self):
        if self.path and self.interval > 0:
            self.thread = threading.Thread(target=self._run)
            self.thread.daemon = True
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread:
            self.thread.join()


# The progress log read back (the controller's view of a sync, hmk_job_progress): the lines ProgressLog and Syncer
# write above, `<UTC stamp> <model> <text>`, one reader beside the writer so the two cannot drift apart.
WAITING = "waiting: another model's sync holds this node"
_LOG_LINE = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)Z (\S+) (.*)$")
_LOG_START = re.compile(r"^sync of (\d+) file\(s\), (\d+) bytes missing, ")
_LOG_FETCHING = re.compile(r"^(.+): fetching (\d+) bytes from ")
_LOG_RESUMING = re.compile(r"^(.+): resuming at byte (\d+) of (\d+) \(")
_LOG_PROGRESS = re.compile(r"^(.+): (\d+)/(\d+) bytes \([0-9.]+%\) at ([0-9.]+) MB/s, ETA ")
_LOG_PUBLISHED = re.compile(r"^(.+): verified \(sha256 [0-9a-f]{64}\) and published$")
# What the node's shell greps out of the shared log for one model: the progress lines are most of it.
LOG_PROGRESS_MARK = " MB/s, ETA "


def format_duration(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)
    if seconds >= 60:
        return "%dm%02ds" % (seconds // 60, seconds % 60)
    return "%ds" % seconds


def format_bytes(count, suffix=""):
    value, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return "%d B%s" % (count, suffix)
    return ("%.1f %s%s" if value < 10 else "%.0f %s%s") % (value, unit, suffix)


def read_sync_log(lines, model, since=None):
    """The state of `model`'s latest sync from its progress-log lines (in log order; repeats are harmless, so a tail
    of the log's last lines may follow its other lines). Lines stamped before `since` (epoch seconds) are an earlier
    run's. The last `sync of` line starts the run; files are followed by their fetching, resuming, progress, ERROR and
    published lines."""
    state = dict(waiting=False, started=None, last=None, needed=None, active={}, done={}, failed=[])
    parsed = []
    for line in lines:
        match = _LOG_LINE.match(line.rstrip("\n"))
        if not match or match.group(7) != model:
            continue
        stamp = calendar.timegm(tuple(int(part) for part in match.groups()[:6]) + (0, 0, 0))
        if since is None or stamp >= since:
            parsed.append((stamp, match.group(8)))
    for stamp, text in parsed:
        start = _LOG_START.match(text)
        if start:
            state.update(waiting=False, started=stamp, last=stamp, needed=int(start.group(2)), active={}, done={},
                         failed=[])
            continue
        state["last"] = stamp if state["last"] is None else max(state["last"], stamp)
        fetching, resuming, published = _LOG_FETCHING.match(text), _LOG_RESUMING.match(text), _LOG_PUBLISHED.match(text)
        progress = _LOG_PROGRESS.match(text)
        if text == WAITING and state["started"] is None:
            state["waiting"] = True
        elif fetching:
            state["active"][fetching.group(1)] = [0, int(fetching.group(2)), 0, None]
        elif resuming:
            offset = int(resuming.group(2))
            state["active"][resuming.group(1)] = [offset, int(resuming.group(3)), offset, None]
        elif published and published.group(1) in state["active"]:
            offset, size = state["active"].pop(published.group(1))[:2]
            state["done"][published.group(1)] = size - offset
        elif progress and progress.group(1) in state["active"]:
            state["active"][progress.group(1)][2:] = [int(progress.group(2)), float(progress.group(4)) * 1e6]
        elif text.startswith("ERROR "):
            for name in list(state["active"]):
                if text[6:].startswith(name + ":") or text[6:].startswith(name + " "):
                    offset, _size, done = state["active"].pop(name)[:3]
                    state["done"][name] = done - offset
                    state["failed"] = sorted(set(state["failed"]) | {name})
    return state


def describe_sync_log(lines, model, since=None):
    """One line for the controller: `<model>: 1.2 GiB of 3.4 GiB (35%), 412 MiB/s, 5m40s left` (the bytes missing
    when the sync began; the rate from the files' own progress lines, else bytes over the time the log covers)."""
    state = read_sync_log(lines, model, since)
    if state["started"] is None:
        return "%s: %s" % (model, WAITING if state["waiting"] else "starting, no progress yet")
    received = sum(state["done"].values()) + sum(max(done - offset, 0) for offset, _size, done, _rate
                                                 in state["active"].values())
    needed = state["needed"]
    parts = ["%s of %s" % (format_bytes(received), format_bytes(needed))]
    if needed:
        parts[0] += " (%d%%)" % min(100, received * 100 // needed)
    rates = [rate for _offset, _size, _done, rate in state["active"].values() if rate is not None]
    elapsed = (state["last"] or state["started"]) - state["started"]
    rate = sum(rates) if rates else (received / elapsed if elapsed > 0 else 0)
    if rate > 0 and state["active"]:
        parts.append(format_bytes(rate, "/s"))
        parts.append("%s left" % format_duration(math.ceil(max(needed - received, 0) / rate)))
    if state["failed"]:
        parts.append("%d file(s) failed" % len(state["failed"]))
    return "%s: %s" % (model, ", ".join(parts))


@contextlib.contextmanager
def one_sync_at_a_time(state_dir, log):
    """Holds the node's sync lock (`<state_dir>/.sync.lock`) for one model's run: the role starts one background job
    per model, and one at a time keeps each run's free-space check true and the source's load what it was. A job that
    has to wait says so in the log first. The kernel drops the lock when the process ends, however it ends."""
    if not os.path.isdir(state_dir):
        os.makedirs(state_dir, 0o755)
    handle = open(os.path.join(state_dir, ".sync.lock"), "a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (IOError, OSError) as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            log.line(WAITING)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()


def _size_of(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


ALIGN = 4096  # direct I/O: file offsets, lengths and memory aligned to the page (>= any logical block size here)
BLOCKS = 3    # buffers in flight: one being filled and hashed, up to two being written


class _Appender:
    """Appends to a partial at explicit offsets: direct I/O (O_DIRECT) for aligned blocks, buffered for the rest.

    A model file is written once and read back by the engine long after, so its bytes need not pass through the
    page cache on the way in: direct writes skip the cache's page allocation, dirty accounting and writeback,
    which is most of the kernel's cost of a buffered download (measured in benchmarks/model_sync.py). A head that
    brings a resumed partial to the next aligned offset and the tail of the file go buffered; a filesystem that
    refuses O_DIRECT (tmpfs, some network filesystems) gets buffered writes only. fsync covers both.
    """

    def __init__(self, path, direct=True):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        self.offset = os.lseek(self.fd, 0, os.SEEK_END)
        self.direct_fd = None
        self.direct_bytes = self.buffered_bytes = 0
        flag = getattr(os, "O_DIRECT", 0)
        if direct and flag:
            try:
                self.direct_fd = os.open(path, os.O_WRONLY | flag | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self.direct_fd = None

    def head(self, offset):
        """Bytes to write before `offset` is aligned for direct I/O (0 when aligned or when direct I/O is off)."""
        return (-offset) % ALIGN if self.direct_fd is not None else 0

    def write(self, view):
        """Writes all of `view` (whose memory starts page-aligned) at the current end."""
        done = 0
        while done < len(view):
            rest = view[done:]
            aligned = len(rest) - len(rest) % ALIGN
            if self.direct_fd is not None and self.offset % ALIGN == 0 and aligned and done % ALIGN == 0:
                try:
                    wrote = os.pwrite(self.direct_fd, rest[:aligned], self.offset)
                    self.direct_bytes += wrote
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                        raise
                    # the filesystem opened O_DIRECT but refuses the write (alignment, no support): buffered from now on
                    os.close(self.direct_fd)
                    self.direct_fd = None
                    continue
            else:
                wrote = os.pwrite(self.fd, rest, self.offset)
                self.buffered_bytes += wrote
            done += wrote
            self.offset += wrote

    def close(self, sync=True):
        try:
            if sync:
                os.fsync(self.fd)
        finally:
            for fd in (self.fd, self.direct_fd):
                if fd is not None:
                    os.close(fd)


def append_hashed(fill, partial, digest, direct=True, block=CHUNK):
    """Appends to `partial` what `fill(view) -> count` delivers (0 at the end), hashing each byte once on its way.

    The bytes are hashed in the buffer they arrive in, piece by piece as each read returns (no read-back of the
    file), while a second thread writes the previous buffers, so receiving, hashing and writing overlap. The
    partial is fsynced before this returns: the caller may publish it. An exception from `fill` (a cut connection)
    is raised again only after the bytes hashed before it are written and synced, so the partial and `digest` agree
    and the caller may resume from them. A write error (a full disk) raises SyncError and is not retried; `digest`
    then covers bytes the partial may lack, so the caller drops it and the next run hashes the partial afresh.
    Returns (bytes appended, the _Appender for its counters).
    """
    try:
        appender = _Appender(partial, direct)
    except OSError as exc:
        raise SyncError("cannot open %s for writing: %s" % (partial, exc))
    free, full, failure, raised = queue.Queue(), queue.Queue(), [], []
    for _unused in range(BLOCKS):
        free.put(mmap.mmap(-1, block))

    def writer():
        while True:
            item = full.get()
            if item is None:
                return
            buffer, length = item
            if not failure:
                view = memoryview(buffer)
                try:
                    appender.write(view[:length])
                except OSError as exc:
                    failure.append(exc)
                finally:
                    view.release()
            free.put(buffer)

    thread = threading.Thread(target=writer, name="hmk-append")
    thread.daemon = True
    thread.start()
    total, ended, start = 0, False, appender.offset
    try:
        while not ended and not failure:
            buffer = free.get()
            view = memoryview(buffer)
            want = appender.head(start + total) or block
            got = 0
            while got < want:
                try:
                    count = fill(view[got:want])
                except BaseException as exc:  # the bytes hashed so far in this block are still written below
                    raised.append(exc)
                    count = 0
                if not count:
                    ended = True
                    break
                # hashed right after the kernel copied it in, while the piece (16 KiB-1 MiB) is still in the CPU cache
                digest.update(view[got:got + count])
                got += count
            total += got
            view.release()
            if got:
                full.put((buffer, got))
            else:
                free.put(buffer)
    finally:
        full.put(None)
        thread.join()
        appender.close(sync=not failure)
    if failure:
        raise SyncError("writing %s failed at byte %d: %s (the bytes before it are kept; the next run hashes them "
                        "and resumes)" % (partial, appender.offset, failure[0]))
    if raised:
        raise raised[0]
    return total, appender


def speed_guard(fill, stall_seconds, floor=1024, clock=time.monotonic):
    """`fill` that fails (TimeoutError) when fewer than `floor` bytes per second arrived over a whole window of
    `stall_seconds` (curl's --speed-limit/--speed-time); a read that gets no byte at all for that long is ended by the
    socket's timeout instead."""
    window = {"start": clock(), "bytes": 0}

    def guarded(view):
        count = fill(view)
        window["bytes"] += count
        now = clock()
        if now - window["start"] >= stall_seconds:
            if window["bytes"] < floor * stall_seconds:
                raise TimeoutError("under %d bytes/s for %d s (%d bytes arrived)" % (floor, stall_seconds,
                                                                                     window["bytes"]))
            window["start"], window["bytes"] = now, 0
        return count
    return guarded


REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5


class TransferError(SyncError):
    """A transfer that broke where a retry may succeed (connection, timeout, an HTTP error answer); the run resumes
    it from the partial's end. A plain SyncError (a refused redirect, a server that ignores ranges) is final."""


def _origin(parts):
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def redirect_problem(first, target, follow_redirects):
    """Why a redirect from the URL `first` to `target` is refused, or None (only http and https, never from https to
    http, none at all unless the source allows them: the rules the curl transfer had with --proto-redir)."""
    if not follow_redirects:
        return "%s answered with a redirect to %s and this source does not follow redirects" % (first, target)
    scheme = urlsplit(target).scheme
    if scheme not in ("http", "https"):
        return "%s redirected to %s: only http and https are fetched" % (first, target)
    if urlsplit(first).scheme == "https" and scheme != "https":
        return "%s redirected to %s: a redirect from https to http is refused" % (first, target)
    return None


def _send(method, url, first, offset, token, connect_timeout, stall_seconds):
    """(connection, response, the URL without its query) of one request, no redirect followed.

    The bearer token goes only to the origin of the URL `first` (the one asked for before any redirect), so a
    redirect to the Hub's storage (a signed URL that refuses an Authorization header) carries none, as curl does.
    No proxy is used: the host in the URL is the only one contacted. A read that waits `stall_seconds` for a byte
    fails.
    """
    if CONTROL.search(url) or (token and CONTROL.search(token)):
        raise SyncError("a control character (a line break?) in the URL or the token cannot go into an HTTP request; "
                        "refused")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SyncError("%s: only http:// and https:// URLs are fetched" % url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=connect_timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=connect_timeout)
    headers = {"Accept-Encoding": "identity", "User-Agent": "hybrid-moe-kit model_sync"}
    if offset:
        headers["Range"] = "bytes=%d-" % offset
    if token and _origin(parts) == _origin(urlsplit(first)):
        headers["Authorization"] = "Bearer " + token
    where = parts._replace(query="").geturl()  # a signed storage URL's query is a credential: never in a message
    try:
        conn.request(method, (parts.path or "/") + ("?" + parts.query if parts.query else ""), headers=headers)
        conn.sock.settimeout(stall_seconds)
        response = conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise TransferError("%s: %s" % (where, exc or type(exc).__name__))
    return conn, response, where


def http_head(url, token, connect_timeout=30, stall_seconds=120):
    """(status, {lower-cased header name: value}) of a HEAD of `url`; a redirect is returned, not followed. The
    token goes as open_http sends it."""
    conn, response, _unused = _send("HEAD", url, url, 0, token, connect_timeout, stall_seconds)
    try:
        response.read()
        return response.status, {name.lower(): value.strip() for name, value in response.getheaders()}
    finally:
        conn.close()


def open_http(url, offset, token, follow_redirects, connect_timeout=30, stall_seconds=120):
    """(connection, response) of a GET of `url` from byte `offset`, ready to read the body.

    Redirects are followed (at most 5) under redirect_problem's rules; the token, the proxy and the stall are
    handled as _send says (the transfer is resumed by the next attempt after a stall).
    """
    current = url
    for _unused in range(MAX_REDIRECTS + 1):
        conn, response, where = _send("GET", current, url, offset, token, connect_timeout, stall_seconds)
        if response.status in REDIRECTS:
            target = urljoin(current, response.getheader("Location") or "")
            conn.close()
            problem = redirect_problem(where, urlsplit(target)._replace(query="").geturl(), follow_redirects)
            if problem:
                raise SyncError(problem)
            current = target
            continue
        if response.status >= 400:
            message = response.getheader("X-Error-Message") or response.reason
            conn.close()
            raise TransferError("%s: HTTP %d %s" % (where, response.status, message))
        expected = 206 if offset else 200
        if response.status != expected:
            conn.close()
            raise SyncError("%s answered HTTP %d to a request from byte %d (expected %d): it cannot resume this "
                            "transfer" % (where, response.status, offset, expected))
        if offset and not (response.getheader("Content-Range") or "").startswith("bytes %d-" % offset):
            conn.close()
            raise SyncError("%s sent Content-Range %r for a request from byte %d: refused"
                            % (where, response.getheader("Content-Range"), offset))
        return conn, response
    raise SyncError("%s: more than %d redirects" % (url, MAX_REDIRECTS))


class OversizeError(SyncError):
    """A source that sends (or announces) more bytes than the file's known size: refused, never retried."""


def announced_size_problem(url, response, offset, size):
    """Why the answer to a request from byte `offset` of a `size`-byte file announces the wrong size, or None
    (Content-Length beyond the bytes missing, or a Content-Range whose total is another size)."""
    if response.length is not None and response.length > size - offset:
        return ("%s announced Content-Length %d from byte %d of a %d-byte file (%d bytes more than the file has)"
                % (url, response.length, offset, size, response.length - (size - offset)))
    total = re.search(r"/(\d+)\s*$", response.getheader("Content-Range") or "")
    if total and int(total.group(1)) != size:
        return "%s announced a %s-byte file in Content-Range, the file's size is %d bytes" % (url, total.group(1), size)
    return None


def capped(fill, limit):
    """`fill` that delivers at most `limit` bytes in all (then 0, the end); `.left` is what the cap still allows."""
    def guarded(view):
        if guarded.left <= 0:
            return 0
        count = fill(view[:guarded.left])
        guarded.left -= count
        return count
    guarded.left = limit
    return guarded


def _more_follows(response):
    """Whether a body (one without Content-Length: chunked, or ended by the close) has a byte beyond the cap."""
    if response.length is not None:
        return False
    try:
        return bool(response.read(1))
    except (OSError, http.client.HTTPException):
        return False


class Source:
    """Where the bytes come from: http (received here with http.client), rsync (rsync over SSH) or local (a path, e.g. NFS)."""

    def __init__(self, kind, location, token=None, follow_redirects=False, ssh_options=None, retries=3,
                 retry_delay=5.0, stall_seconds=120):
        self.kind, self.location, self.token = kind, location.rstrip("/"), token
        self.follow_redirects, self.ssh_options = follow_redirects, list(ssh_options or [])
        self.retries, self.retry_delay, self.stall_seconds = retries, retry_delay, stall_seconds

    def describe(self, relpath):
        return "%s/%s" % (self.location, relpath)

    def fetch(self, relpath, partial, size, digest):
        """Append the missing bytes of `relpath` to `partial`, updating `digest` where bytes stream through us.

        `digest` covers the bytes already in `partial` on entry. Returns (digest or None, bytes received);
        None means the bytes did not pass through this process (rsync) and the caller hashes the file.
        """
        if self.kind == "http":
            return self._http(relpath, partial, size, digest)
        if self.kind == "local":
            return self._local(relpath, partial, size, digest)
        return self._rsync(relpath, partial)

    def _http(self, relpath, partial, size, digest):
        url, start, attempt = self.describe(relpath), _size_of(partial), 0
        while True:
            offset = _size_of(partial)
            if offset >= size:
                return digest, offset - start
            # received here: each piece is hashed in the buffer it arrived in and appended (append_hashed), never
            # more than the file's known size: a server that sends more is refused, and its extra bytes never land
            try:
                conn, response = open_http(url, offset, self.token, self.follow_redirects,
                                           stall_seconds=self.stall_seconds)
                try:
                    problem = announced_size_problem(url, response, offset, size)
                    if problem:
                        raise OversizeError(problem)
                    fill = capped(speed_guard(response.readinto, self.stall_seconds), size - offset)
                    append_hashed(fill, partial, digest)
                    if fill.left == 0 and _more_follows(response):
                        raise OversizeError("%s sent more than the file's %d bytes" % (url, size))
                finally:
                    conn.close()
                # http.client ends a body the server cut short without an error; the announced length tells
                if response.length:
                    raise http.client.IncompleteRead(b"", response.length)
                return digest, _size_of(partial) - start
            except OversizeError as exc:
                # final, not retried: the source disagrees with the lock/catalog about the file's size. Nothing of
                # it is kept (no partial, no quarantined copy), so runs against it never pile bytes up on the disk.
                kept = _size_of(partial)
                if os.path.exists(partial):
                    os.unlink(partial)
                raise OversizeError("oversize refused: %s; the file's size is %d bytes (lock/catalog), %d bytes "
                                    "received from it were discarded and nothing was kept"
                                    % (exc, size, max(kept - offset, 0)))
            except TransferError as exc:
                last_error = str(exc)
            except http.client.IncompleteRead as exc:
                last_error = "%s: the connection closed with %d bytes of the answer still to come" % (url, exc.expected)
            except (OSError, http.client.HTTPException) as exc:  # the connection broke or stalled mid-body
                last_error = "%s: %s" % (url, exc or type(exc).__name__)
            if attempt >= self.retries:
                raise SyncError("%s (after %d attempts; %d bytes kept in %s, the next run resumes there)"
                                % (last_error, attempt + 1, _size_of(partial), partial))
            attempt += 1
            time.sleep(min(self.retry_delay * attempt, 60))

    def _local(self, relpath, partial, size, digest):
        source = os.path.join(self.location, relpath)
        offset = _size_of(partial)
        try:
            with open(source, "rb", buffering=0) as reader:
                reader.seek(offset)
                fill = capped(reader.readinto, max(size - offset, 0))
                received, _unused = append_hashed(fill, partial, digest)
                longer = fill.left == 0 and bool(reader.read(1))
        except (IOError, OSError) as exc:
            raise SyncError("%s: %s (%d bytes kept in %s)" % (source, exc, _size_of(partial), partial))
        if longer:
            os.unlink(partial)
            raise OversizeError("oversize refused: %s is longer than the file's %d bytes (lock/catalog); the bytes "
                                "copied from it were discarded and nothing was kept" % (source, size))
        return digest, received

    def _rsync(self, relpath, partial):
        before = _size_of(partial)
        ssh = " ".join(["ssh", "-o", "BatchMode=yes"] + self.ssh_options)
        argv = ["rsync", "--append-verify", "--timeout=%d" % self.stall_seconds, "--rsh", ssh,
                self.describe(relpath), partial]
        for attempt in range(self.retries + 1):
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
            if proc.returncode == 0:
                return None, max(_size_of(partial) - before, 0)
            error = proc.stderr.decode("utf-8", "replace").strip()
            if attempt < self.retries:
                time.sleep(min(self.retry_delay * (attempt + 1), 60))
        raise SyncError("%s: rsync exit %d: %s (%d bytes kept in %s, the next run resumes there)"
                        % (self.describe(relpath), proc.returncode, error, _size_of(partial), partial))


QUARANTINED_RE = re.compile(r"\.[0-9]{8}T[0-9]{6}Z\.bad")


class Syncer:
    """Plans and runs the sync of one model directory."""

    def __init__(self, model, dest, state_dir, quarantine_dir, files, source, gguf_expect=None, parallel=2,
                 rehash=False, margin=0, log=None, owner=None, group=None, mode=0o644, check_mode=False,
                 staging_dir=None):
        if rule_component(model):
            raise SyncError("model id %r refused: it names directories, so it must be %s" % (model, rule_component(model)))
        self.model, self.dest, self.files, self.source = model, dest, files, source
        self.state_dir = os.path.join(state_dir, model)
        self.quarantine_dir = os.path.join(quarantine_dir, model)
        # Same filesystem as dest (the default is beside it), so publishing is a rename.
        self.staging = os.path.join(staging_dir or os.path.join(os.path.dirname(dest.rstrip("/")), ".staging"), model)
        self.gguf_expect, self.parallel, self.rehash, self.margin = gguf_expect or {}, parallel, rehash, margin
        self.log = log or ProgressLog(None, model, 0)
        self.owner, self.group, self.mode, self.check_mode = owner, group, mode, check_mode
        self.gguf_names = [f["name"] for f in files if f["name"].endswith(".gguf")]

    def _paths(self, name):
        return (os.path.join(self.dest, name), os.path.join(self.staging, name + ".partial"),
                os.path.join(self.state_dir, name + ".json"))

    # ---- planning

    def plan(self):
        """One entry per file: action ok | stamp (verified copy, stamp to write) | fetch, with the bytes missing."""
        plan = []
        for item in self.files:
            final, partial, stamp_path = self._paths(item["name"])
            entry = {"name": item["name"], "size": item["size"], "sha256": item["sha256"], "missing": 0,
                     "partial": _size_of(partial), "action": "fetch", "reason": "absent"}
            if os.path.isfile(final):
                stat = os.stat(final)
                if stat.st_size != item["size"]:
                    entry["reason"] = "published copy is %d bytes, the catalog says %d" % (stat.st_size, item["size"])
                elif not self.rehash and stamp_matches(read_stamp(stamp_path), stat, item["sha256"]):
                    entry.update(action="ok", reason="stamp matches size, mtime and sha256")
                else:
                    observed = sha256_file(final).hexdigest()
                    if observed == item["sha256"]:
                        matches = stamp_matches(read_stamp(stamp_path), stat, item["sha256"])
                        entry.update(action="ok" if matches else "stamp", reason="sha256 verified")
                    else:
                        entry["reason"] = "published copy has sha256 %s, the catalog says %s" % (observed,
                                                                                                 item["sha256"])
            if entry["action"] == "fetch":
                entry["missing"] = missing_bytes(item["size"], entry["partial"])
            plan.append(entry)
        return plan

    # ---- running

    def _adopt_old_partials(self):
        """Partials an earlier version left beside the published files move to staging (or go when staging has one)."""
        for item in self.files:
            old = os.path.join(self.dest, item["name"] + ".partial")
            if not os.path.isfile(old):
                continue
            new = self._paths(item["name"])[1]
            if os.path.exists(new):
                os.unlink(old)
                continue
            if not os.path.isdir(self.staging):
                os.makedirs(self.staging, 0o700)
            os.replace(old, new)

    def _clean_staging(self):
        """Staging keeps only partials of this model's current files (resumed next run); empty, it goes."""
        if not os.path.isdir(self.staging):
            return
        wanted = set(item["name"] + ".partial" for item in self.files)
        for entry in os.listdir(self.staging):
            if entry not in wanted:
                path = os.path.join(self.staging, entry)
                if os.path.isfile(path) or os.path.islink(path):
                    os.unlink(path)
        if not os.listdir(self.staging):
            os.rmdir(self.staging)

    def run(self):
        if not self.check_mode:
            self._adopt_old_partials()
        plan = self.plan()
        fetch = [e for e in plan if e["action"] == "fetch"]
        needed = sum(e["missing"] for e in fetch)
        free = free_bytes(self.dest)
        result = {"plan": plan, "bytes_needed": needed, "free_bytes": free, "fetched": [], "bytes_received": 0,
                  "changed": False, "errors": [], "quarantined": []}
        problem = space_problem(existing_ancestor(self.dest), needed, free, self.margin)
        if problem:
            raise SyncError(problem)
        todo = [e for e in plan if e["action"] != "ok"]
        if not todo:
            result["changed"] = self._fix_modes(apply=not self.check_mode)
            if not self.check_mode:
                self._clean_staging()
            return result
        result["changed"] = True
        if self.check_mode:
            return result
        for path in (self.dest, self.state_dir):
            if not os.path.isdir(path):
                os.makedirs(path, 0o755)
        if not os.path.isdir(self.staging):
            os.makedirs(self.staging, 0o700)
        for entry in todo:
            if entry["action"] == "stamp":
                self._write_stamp(entry["name"], entry["sha256"])
        if fetch:
            self.log.line("sync of %d file(s), %d bytes missing, %d bytes free at %s, from %s"
                          % (len(fetch), needed, free, self.dest, self.source.location))
            with self.log, ThreadPoolExecutor(max_workers=max(1, self.parallel)) as pool:
                outcomes = list(pool.map(self._fetch_one, fetch))
            for entry, (received, error, bad) in zip(fetch, outcomes):
                result["bytes_received"] += received
                if error:
                    result["errors"].append(error)
                else:
                    result["fetched"].append(entry["name"])
                if bad:
                    result["quarantined"].append(bad)
        self._fix_modes(apply=True)
        self._clean_staging()
        return result

    def _fetch_one(self, entry):
        """(bytes received, error sentence or None, quarantined path or None) for one file."""
        name, size, wanted = entry["name"], entry["size"], entry["sha256"]
        final, partial, _unused = self._paths(name)
        item = next(f for f in self.files if f["name"] == name)
        relpath = item.get("source") or name
        outcome = {"received": 0, "bad": None}
        try:
            self._fetch_verify_publish(name, size, wanted, final, partial, relpath, outcome)
        except SyncError as exc:
            self.log.line("ERROR %s" % exc)
            return outcome["received"], str(exc), outcome["bad"]
        except (IOError, OSError) as exc:
            self.log.line("ERROR %s: %s" % (name, exc))
            return outcome["received"], "%s: %s" % (name, exc), outcome["bad"]
        return outcome["received"], None, None

    def _fetch_verify_publish(self, name, size, wanted, final, partial, relpath, outcome):
        if _size_of(partial) > size:
            self.log.line("%s: partial is longer than the file (%d > %d bytes), starting over"
                          % (name, _size_of(partial), size))
            os.unlink(partial)
        digest = hashlib.sha256()
        if os.path.exists(partial):
            self.log.line("%s: resuming at byte %d of %d (hashing the partial first)" % (name, _size_of(partial), size))
            digest = sha256_file(partial)
        else:
            self.log.line("%s: fetching %d bytes from %s" % (name, size, self.source.describe(relpath)))
        self.log.track(name, partial, size)
        try:
            digest, outcome["received"] = self.source.fetch(relpath, partial, size, digest)
        finally:
            self.log.untrack(name)
        observed = (digest or sha256_file(partial)).hexdigest()
        got = _size_of(partial)
        if got != size or observed != wanted:
            outcome["bad"] = self._quarantine(partial, name)
            raise SyncError("%s failed verification: expected sha256 %s (%d bytes), got sha256 %s (%d bytes) from %s; "
                            "the download was moved to %s and the published copy, if any, is untouched"
                            % (name, wanted, size, observed, got, self.source.describe(relpath), outcome["bad"]))
        if name.endswith(".safetensors"):
            problems = safetensors_problems(partial)
            if problems:
                outcome["bad"] = self._quarantine(partial, name)
                raise SyncError("%s has the catalog's sha256 but is not a loadable safetensors shard: %s; moved to %s"
                                % (name, "; ".join(problems), outcome["bad"]))
        if name.endswith(".gguf"):
            problems = self._gguf_problems(partial, name)
            if problems:
                outcome["bad"] = self._quarantine(partial, name)
                raise SyncError("%s has the catalog's sha256 but its GGUF metadata disagrees with the catalog: %s; "
                                "moved to %s, fix the catalog entry" % (name, "; ".join(problems), outcome["bad"]))
        self._publish(partial, final, name, wanted)
        self.log.line("%s: verified (sha256 %s) and published" % (name, wanted))

    def _gguf_problems(self, path, name):
        try:
            meta = read_gguf(path)
        except GGUFError as exc:
            return [str(exc)]
        return check_gguf(meta, self.gguf_expect, self.gguf_names.index(name), len(self.gguf_names))

    def _quarantine(self, partial, name):
        """Moves a failed download aside, keeping one copy per file: the last one (earlier copies of the same file
        go), so a source that keeps sending bad bytes never fills the disk run after run."""
        if not os.path.isdir(self.quarantine_dir):
            os.makedirs(self.quarantine_dir, 0o700)
        for entry in os.listdir(self.quarantine_dir):
            if entry.startswith(name + ".") and entry.endswith(".bad") and QUARANTINED_RE.fullmatch(entry[len(name):]):
                os.unlink(os.path.join(self.quarantine_dir, entry))
        bad = os.path.join(self.quarantine_dir, "%s.%s.bad" % (name, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
        try:
            os.rename(partial, bad)
        except OSError:
            shutil.move(partial, bad)
        return bad

    def _publish(self, partial, final, name, sha256):
        self._own(partial)
        os.replace(partial, final)
        directory = os.open(self.dest, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._write_stamp(name, sha256)

    def _write_stamp(self, name, sha256):
        final, _unused, stamp_path = self._paths(name)
        stat = os.stat(final)
        temporary = stamp_path + ".tmp"
        with open(temporary, "w") as handle:
            json.dump({"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                       "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, handle)
        os.replace(temporary, stamp_path)

    def _own(self, path):
        """Set owner, group and mode; True when something had to change."""
        stat = os.stat(path)
        changed = False
        uid = stat.st_uid if self.owner is None else self.owner
        gid = stat.st_gid if self.group is None else self.group
        if (stat.st_uid, stat.st_gid) != (uid, gid):
            os.chown(path, uid, gid)
            changed = True
        if stat.st_mode & 0o7777 != self.mode:
            os.chmod(path, self.mode)
            changed = True
        return changed

    def _fix_modes(self, apply):
        changed = False
        for item in self.files:
            final = os.path.join(self.dest, item["name"])
            if not os.path.isfile(final):
                continue
            if apply:
                changed = self._own(final) or changed
            else:
                stat = os.stat(final)
                changed = changed or stat.st_mode & 0o7777 != self.mode or \
                    (self.owner is not None and stat.st_uid != self.owner) or \
                    (self.group is not None and stat.st_gid != self.group)
        return changed
