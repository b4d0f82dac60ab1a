#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Puts a role's directories and small files in place in one visit to the node.

A role that writes ten files with ansible.builtin.copy/template asks the node twenty times on a converged
re-run (a checksum, then the file module for owner and mode). This module takes them all at once: the
converged no-op of site.yml is bounded by these visits, not by the work."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_files
short_description: Directories and whole-content files with owner and mode, in one round trip
description:
  - Creates each directory (and missing parents, with the same owner and mode), then writes each file
    whose bytes differ, atomically (a temporary file in the same directory, owner and mode set on it,
    fsync, rename, fsync of the directory), then corrects owner and mode where only they differ.
  - Removes each path in I(absent) that is a file or a link.
  - Check mode reports what would change and changes nothing; with diff mode each changed file's text
    is shown, except for I(secrets).
  - A file whose directory neither exists nor is listed in I(directories) fails the task before
    anything is written.
options:
  directories:
    description: Directories to ensure, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      owner: {description: User name or number., type: str, required: true}
      group: {description: Group name or number., type: str, required: true}
      mode:
        description: Octal permissions as a string, e.g. C("0755").
        type: str
        required: true
  files:
    description: Files to ensure, with their whole content.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      content: {description: The file's text (UTF-8)., type: str, required: true}
      owner: {description: User name or number., type: str, required: true}
      group: {description: Group name or number., type: str, required: true}
      mode: {description: Octal permissions as a string., type: str, required: true}
  secrets:
    description:
      - Files like I(files) whose content is a secret (an API key) - never echoed, logged or shown in a diff.
      - Each one's text is in I(secret_contents), under its path.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      owner: {description: User name or number., type: str, required: true}
      group: {description: Group name or number., type: str, required: true}
      mode: {description: Octal permissions as a string., type: str, required: true}
  secret_contents:
    description:
      - The text of each file in I(secrets), keyed by its path; every path of I(secrets) needs one and no other
        path may have one.
      - A top-level no_log option, so the node's log of the invocation shows it as not logged. Inside I(secrets) it
        would be logged as part of its parent's text, where a newline or a backslash in the secret is escaped and
        no longer matches the value Ansible masks.
    type: dict
    default: {}
  absent:
    description: Files or links to remove.
    type: list
    elements: path
    default: []
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The service's configuration is in place
  hmk.moe_kit.hmk_files:
    directories:
      - {path: /etc/hmk, owner: root, group: root, mode: "0755"}
    files:
      - {path: /etc/hmk/args, content: "{{ args }}", owner: root, group: hmk, mode: "0640"}
    secrets:
      - {path: /etc/hmk/api-key, owner: root, group: root, mode: "0600"}
    secret_contents:
      /etc/hmk/api-key: "{{ key }}\n"
  register: written
"""

RETURN = r"""
changed_paths:
  description: Every path created, rewritten, re-owned, re-moded or removed (or that would be, in check mode).
  type: list
  elements: str
  returned: always
"""

import grp
import os
import pwd
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule


class FilesError(Exception):
    pass


# In check mode an account the same run would create earlier does not exist yet: the file then "would change"
# (an id no file has) instead of failing the dry run.
UNKNOWN = -1


def _uid(owner, check_mode):
    if owner.isdigit():
        return int(owner)
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        if check_mode:
            return UNKNOWN
        raise FilesError("owner %r does not exist on the node" % owner)


def _gid(group, check_mode):
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        if check_mode:
            return UNKNOWN
        raise FilesError("group %r does not exist on the node" % group)


def _mode(text, path):
    try:
        mode = int(text, 8)
    except (TypeError, ValueError):
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise FilesError("mode %r of %s is not an octal permission such as \"0644\"" % (text, path))
    return mode


def _wanted(item, check_mode):
    path = item["path"]
    if not os.path.isabs(path):
        raise FilesError("%s is not an absolute path" % path)
    return path, _uid(item["owner"], check_mode), _gid(item["group"], check_mode), _mode(item["mode"], path)


def _attrs_differ(st, uid, gid, mode):
    return st.st_uid != uid or st.st_gid != gid or stat.S_IMODE(st.st_mode) != mode


def _lstat(path):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def plan(directories, files, absent, secrets=(), check_mode=False):
    """What must change: [(kind, path, detail)], read-only. Raises FilesError on bad input or a missing
    parent, so that nothing is written when any item cannot be."""
    actions = []
    made = set()
    for item in directories:
        path, uid, gid, mode = _wanted(item, check_mode)
        missing = []
        probe = path
        while probe != "/" and _lstat(probe) is None and probe not in made:
            missing.append(probe)
            probe = os.path.dirname(probe)
        st = _lstat(path)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise FilesError("%s exists and is not a directory" % path)
        for created in reversed(missing):
            made.add(created)
            actions.append(("mkdir", created, (uid, gid, mode)))
        if st is not None and _attrs_differ(st, uid, gid, mode):
            actions.append(("attrs", path, (uid, gid, mode)))
    for item in [dict(i, diff=True) for i in files] + [dict(i, diff=False) for i in secrets]:
        path, uid, gid, mode = _wanted(item, check_mode)
        parent = os.path.dirname(path)
        parent_st = _lstat(parent)
        data = item["content"].encode("utf-8")
        if parent not in made and (parent_st is None or not stat.S_ISDIR(parent_st.st_mode)):
            if check_mode and parent_st is None:
                # An earlier task of the same run would create it.
                actions.append(("write", path, (uid, gid, mode, data, None, item["diff"])))
                continue
            raise FilesError("the directory of %s does not exist (list it in directories)" % path)
        st = _lstat(path)
        before = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise FilesError("%s is a directory, not a file" % path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    before = handle.read()
        if before != data:
            actions.append(("write", path, (uid, gid, mode, data, before, item["diff"])))
        elif _attrs_differ(st, uid, gid, mode):
            actions.append(("attrs", path, (uid, gid, mode)))
    for path in absent:
        st = _lstat(path)
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise FilesError("%s is a directory; absent removes files and links only" % path)
            actions.append(("remove", path, None))
    return actions


def with_contents(secrets, contents):
    """Each secret item with its text from secret_contents (by path). Names paths, never contents."""
    paths = [item["path"] for item in secrets]
    missing = [path for path in paths if not isinstance(contents.get(path), str)]
    if missing:
        raise FilesError("secret_contents has no text for %s" % ", ".join(missing))
    extra = sorted(set(contents) - set(paths))
    if extra:
        raise FilesError("secret_contents names %s, which secrets does not list" % ", ".join(extra))
    return [dict(item, content=contents[item["path"]]) for item in secrets]


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def apply(actions):
    for kind, path, detail in actions:
        if kind == "mkdir":
            uid, gid, mode = detail
            os.mkdir(path, 0o700)
            os.chown(path, uid, gid)
            os.chmod(path, mode)
        elif kind == "attrs":
            uid, gid, mode = detail
            os.chown(path, uid, gid, follow_symlinks=False)
            os.chmod(path, mode)
        elif kind == "write":
            uid, gid, mode, data = detail[:4]
            directory = os.path.dirname(path)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fchown(handle.fileno(), uid, gid)
                    os.fchmod(handle.fileno(), mode)
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                raise
            _fsync_dir(directory)
        elif kind == "remove":
            os.unlink(path)


def diffs(actions):
    out = []
    for kind, path, detail in actions:
        if kind != "write":
            continue
        before, show = detail[4], detail[5]
        if not show:
            out.append({"before_header": path, "after_header": path,
                        "before": "(not shown)\n", "after": "(not shown, changed)\n"})
            continue
        out.append({"before_header": path, "after_header": path,
                    "before": before.decode("utf-8", "replace") if before is not None else "",
                    "after": detail[3].decode("utf-8", "replace")})
    return out


def main():
    attrs = dict(owner=dict(type="str", required=True), group=dict(type="str", required=True),
                 mode=dict(type="str", required=True))
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[],
                             options=dict(path=dict(type="path", required=True), **attrs)),
            files=dict(type="list", elements="dict", default=[],
                       options=dict(path=dict(type="path", required=True),
                                    content=dict(type="str", required=True), **attrs)),
            secrets=dict(type="list", elements="dict", default=[], no_log=False,
                         options=dict(path=dict(type="path", required=True), **attrs)),
            secret_contents=dict(type="dict", default={}, no_log=True),
            absent=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    try:
        secrets = with_contents(module.params["secrets"], module.params["secret_contents"])
        actions = plan(module.params["directories"], module.params["files"], module.params["absent"],
                       secrets, module.check_mode)
    except (FilesError, OSError) as exc:
        module.fail_json(msg="hmk_files: %s; nothing was changed" % exc)
    result = dict(changed=bool(actions), changed_paths=sorted({path for _unused, path, _unused in actions}))
    if module._diff and actions:
        result["diff"] = diffs(actions)
    if not module.check_mode:
        try:
            apply(actions)
        except OSError as exc:
            module.fail_json(msg="hmk_files: %s" % exc, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
