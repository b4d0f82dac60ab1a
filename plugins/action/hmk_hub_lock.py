# -*- coding: utf-8 -*-
"""Controller side of model_sync's huggingface source: pins each model's files in the lock file (see
plugins/modules/hmk_hub_lock.py for the documentation, plugins/module_utils/hmk_hub.py for the logic)."""
from __future__ import absolute_import, division, print_function

import fcntl
import hashlib
import json
import os
import tempfile

from ansible.plugins.action import ActionBase

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_hub import (HubError, dump_lock, load_lock,
                                                                          lock_problems, node_files, resolve_model)

__metaclass__ = type

ARGUMENT_SPEC = dict(
    lock_file=dict(type="path", required=True),
    endpoint=dict(type="str", default="https://huggingface.co"),
    token=dict(type="str", default="", no_log=True),
    models=dict(type="dict", required=True),
)


class _Serialized:
    """An exclusive lock per lock file, held while it is read, resolved and written: every host of a play runs this
    action in its own worker process, and the first one reads the Hub while the others wait for its lock entry."""

    def __init__(self, path):
        key = hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:16]
        self.path = os.path.join(tempfile.gettempdir(), "hmk-hub-lock-%s.flock" % key)

    def __enter__(self):
        self.handle = open(self.path, "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def _write_atomically(path, text):
    directory = os.path.dirname(path) or "."
    descriptor, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _unused, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        # Plain Python values: the lock is written with yaml's SafeDumper, which knows no tagged template strings.
        args = json.loads(json.dumps(args))
        path = os.path.abspath(os.path.expanduser(args["lock_file"]))
        result.update(lock_file=path, resolved={}, from_hub=[], changed=False)
        if not os.path.isdir(os.path.dirname(path)):
            return dict(result, failed=True, msg="the directory of the lock file %s does not exist" % path)
        try:
            with _Serialized(path):
                lock = load_lock(path)
                for model, entry in sorted(args["models"].items()):
                    locked = lock["models"].get(model)
                    if locked is not None:
                        problems = lock_problems(model, entry, locked)
                        if problems:
                            raise HubError("the lock %s disagrees with the catalog: %s. Nothing was fetched. Fix the "
                                           "catalog, or delete the entry of %s from the lock to pin it again from the "
                                           "Hub" % (path, "; ".join(problems), model))
                    else:
                        locked = resolve_model(model, entry, args["endpoint"].rstrip("/"), args["token"])
                        lock["models"][model] = locked
                        result["from_hub"].append(model)
                    result["resolved"][model] = {"files": node_files(locked, False),
                                                 "hf_files": node_files({"hf_files": locked.get("hf_files")}, True)}
                text = dump_lock(lock)
                before = None
                if os.path.exists(path):
                    with open(path) as handle:
                        before = handle.read()
                if text != before:
                    result["changed"] = True
                    if not self._task.check_mode:
                        _write_atomically(path, text)
        except HubError as exc:
            return dict(result, failed=True, msg=str(exc))
        except ImportError as exc:
            return dict(result, failed=True, msg="huggingface_hub is missing on the control machine (%s); install the "
                                                 "kit's requirements.txt" % exc)
        return result
