# -*- coding: utf-8 -*-
"""Model integrity between syncs: the cheap check before every start, and the scheduled full re-hash.

- `prestart_problems(manifest)`: every file the service was configured with is there, has its recorded size
  and a readable GGUF header and tensor table (hmk_gguf, the kit's one reader). Milliseconds per split; run by
  the unit's wrapper before the engine, so a truncated or missing split stops the start with its name instead
  of a crash loop.
- `rehash(...)`: re-reads every published model file in full and compares its sha256 with model_sync's stamp.
  A mismatch moves the file to the quarantine (so the next models stage fetches it again) and drops its stamp;
  the result is written as a JSON record (read by the doctor) and as a node_exporter textfile metric.

Pure Python 3 standard library. On the node the scripts import it from /usr/local/lib/hmk/python beside
hmk_gguf.py; the collection's code and the unit tests import it as module_utils.
"""
from __future__ import absolute_import, division, print_function

import hashlib
import json
import os
import time

try:
    from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_gguf import GGUFError, read_gguf
except ImportError:  # installed on the node beside hmk_gguf.py
    from hmk_gguf import GGUFError, read_gguf  # pylint: disable=import-error

__metaclass__ = type

CHUNK = 8 * 1024 * 1024
EXIT_CONFIG = 78  # EX_CONFIG: the unit's RestartPreventExitStatus, so a bad model file is not restarted in a loop


def prestart_problems(manifest):
    """Sentences naming each file that is missing, has another size than recorded, or has no readable GGUF header."""
    problems = []
    for item in manifest.get("files") or []:
        path, size = item["path"], int(item["size"])
        try:
            actual = os.stat(path).st_size
        except OSError as exc:
            problems.append("%s is missing or unreadable (%s)" % (path, exc.strerror or exc))
            continue
        if actual != size:
            problems.append("%s is %d bytes, %d were recorded when the service was configured (truncated or "
                            "replaced)" % (path, actual, size))
            continue
        if path.endswith(".gguf"):
            try:
                read_gguf(path, array_limit=0, tensors=True)
            except (GGUFError, OSError, ValueError) as exc:
                problems.append("%s has no readable GGUF header or tensor table (%s)" % (path, exc))
    return problems


def _sha256(path):
    """(sha256 hex digest, os.stat_result) of the file at `path` when it was opened: the stat of the very file that
    was hashed (its inode, size and mtime), even if another file is renamed over `path` while it is read."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        hashed = os.fstat(handle.fileno())
        while True:
            block = handle.read(CHUNK)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest(), hashed


def _identity(stat):
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _read_stamp(path):
    try:
        with open(path) as handle:
            stamp = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _current(path):
    try:
        return os.stat(path)
    except OSError:
        return None


def stamps(state_dir):
    """(model, file name, stamp) for every verification stamp model_sync wrote (<state>/<model>/<name>.json)."""
    out = []
    if not os.path.isdir(state_dir):
        return out
    for model in sorted(os.listdir(state_dir)):
        directory = os.path.join(state_dir, model)
        if not os.path.isdir(directory):
            continue
        for entry in sorted(os.listdir(directory)):
            if not entry.endswith(".json"):
                continue
            try:
                with open(os.path.join(directory, entry)) as handle:
                    stamp = json.load(handle)
            except (IOError, OSError, ValueError):
                continue
            if isinstance(stamp, dict) and stamp.get("sha256"):
                out.append((model, entry[:-len(".json")], stamp))
    return out


def rehash(models_root, state_dir, quarantine_dir, now=None):
    """Full re-hash of every stamped file; quarantines mismatches. Returns the result record.

    A model update may land while a file is read (model_sync renames a freshly verified file over it and writes its
    new stamp): the file and its stamp are read again at the moment of judging, and a file that is no longer the one
    that was hashed, or whose stamp changed meanwhile, is not judged (listed under changed_during_rehash; the next
    run checks it), so a freshly verified file is never quarantined for the bytes of the one it replaced.
    """
    started = now or time.time()
    record = {"schema": "hmk-model-integrity/1", "started": started, "files_checked": 0, "bytes_hashed": 0,
              "mismatches": [], "missing": [], "changed_during_rehash": []}
    for model, name, stamp in stamps(state_dir):
        path = os.path.join(models_root, model, name)
        stamp_path = os.path.join(state_dir, model, name + ".json")
        if not os.path.isfile(path):
            record["missing"].append({"model": model, "file": name, "path": path})
            continue
        try:
            observed, hashed = _sha256(path)
        except OSError:  # removed or replaced between the listing and the open: the next run judges it
            record["changed_during_rehash"].append({"model": model, "file": name, "path": path})
            continue
        size = hashed.st_size
        record["files_checked"] += 1
        record["bytes_hashed"] += size
        # judged against what is there now: the stamp as it is now, and the file only if it is still the one hashed
        fresh = _read_stamp(stamp_path)
        if fresh and observed == fresh.get("sha256") and size == fresh.get("size", size):
            continue
        current = _current(path)
        if fresh != stamp or current is None or _identity(current) != _identity(hashed):
            record["changed_during_rehash"].append({"model": model, "file": name, "path": path})
            continue
        target_dir = os.path.join(quarantine_dir, model)
        if not os.path.isdir(target_dir):
            os.makedirs(target_dir, 0o700)
        target = os.path.join(target_dir, "%s.%s.rehash-mismatch" % (name, time.strftime("%Y%m%dT%H%M%SZ",
                                                                                            time.gmtime(started))))
        os.rename(path, target)
        moved = _current(target)
        if moved is None or _identity(moved) != _identity(hashed):
            # an update landed between the last look and the rename: that file goes back unless another is there
            if not os.path.exists(path):
                os.rename(target, path)
            record["changed_during_rehash"].append({"model": model, "file": name, "path": path})
            continue
        if _read_stamp(stamp_path) == stamp:
            os.unlink(stamp_path)
        record["mismatches"].append({"model": model, "file": name, "path": path, "expected_sha256": stamp["sha256"],
                                     "observed_sha256": observed, "size": size, "quarantined_to": target})
    record["finished"] = time.time()
    record["ok"] = not record["mismatches"]
    return record


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics(record):
    """The record as node_exporter textfile-collector lines (Prometheus text format)."""
    lines = [
        "# HELP hmk_model_integrity_ok 1 when the last full re-hash found every model file as verified.",
        "# TYPE hmk_model_integrity_ok gauge",
        "hmk_model_integrity_ok %d" % (1 if record.get("ok") else 0),
        "# HELP hmk_model_integrity_mismatches Files whose sha256 differed at the last re-hash (quarantined).",
        "# TYPE hmk_model_integrity_mismatches gauge",
        "hmk_model_integrity_mismatches %d" % len(record.get("mismatches") or []),
        "# HELP hmk_model_integrity_files_checked Files re-hashed at the last run.",
        "# TYPE hmk_model_integrity_files_checked gauge",
        "hmk_model_integrity_files_checked %d" % int(record.get("files_checked") or 0),
        "# HELP hmk_model_integrity_last_run_timestamp_seconds When the last re-hash finished.",
        "# TYPE hmk_model_integrity_last_run_timestamp_seconds gauge",
        "hmk_model_integrity_last_run_timestamp_seconds %d" % int(record.get("finished") or 0),
        "# HELP hmk_model_integrity_file_mismatch A model file that failed its re-hash and was quarantined.",
        "# TYPE hmk_model_integrity_file_mismatch gauge",
    ]
    for item in record.get("mismatches") or []:
        lines.append('hmk_model_integrity_file_mismatch{model="%s",file="%s"} 1' % (_label(item["model"]),
                                                                                    _label(item["file"])))
    return "\n".join(lines) + "\n"


def write_atomically(path, text, mode=0o644):
    """Write `text` so that a reader (node_exporter, the doctor) never sees half a file."""
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, mode)
    os.replace(temporary, path)
