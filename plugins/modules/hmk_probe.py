#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Reads what a role decides on from the node in one visit: paths, small files, directory listings, the CPU
flags, a commit in a local checkout, installed packages and systemd units.

A converged re-run of site.yml is bounded by its visits to the node (each one a Python start and Ansible's
module imports there), not by the work: a role that stats five paths, reads a record and lists a directory
asks seven times. This module answers all of it at once and never changes anything."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_probe
short_description: Read-only facts a role needs, in one round trip
description:
  - Reads, without changing anything, the paths, files, directories, CPU flags, git commits, Debian packages
    and systemd units it is asked about. Every answer is keyed by what was asked, so a role reads
    C(probe.paths[path].exists) where it would have registered a stat task.
  - Never reports a change; runs the same in check mode.
options:
  paths:
    description:
      - Paths to C(lstat). Each answer has C(exists), C(type) (C(file), C(directory), C(link), C(char) (a character
        device), C(other) or C(missing)), C(lnk_target) (links), C(target_type) (the type a link resolves to), C(executable)
        (resolved, for this user), C(mode) (octal string), C(uid), C(gid), C(size) and C(mtime).
    type: list
    elements: path
    default: []
  read:
    description:
      - Small text files to read whole (links are followed). The answer is the text, or null for a file that
        does not exist. A file over 1 MiB or one that is not UTF-8 fails the task.
    type: list
    elements: path
    default: []
  listdirs:
    description:
      - Directories to list, one level. Each answer is a sorted list of C(name), C(path), C(type) and C(mtime),
        plus C(marker) (whether C(path/marker) exists) when I(marker) is given; an empty list for a directory
        that does not exist.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path of the directory., type: path, required: true}
      marker: {description: A file name looked for inside each entry., type: str}
      pattern: {description: A regular expression entry names must match in full., type: str}
  cpu_flags:
    description: Whether to return the first C(flags) (x86) or C(Features) (Arm) line of C(/proc/cpuinfo).
    type: bool
    default: false
  git:
    description:
      - Commits to look up in local checkouts, without the network (C(git -C repo log -1 --format=%H%x20%cs
        rev --)). Each answer has C(rc), C(stdout) and C(stderr); a missing checkout answers a non-zero C(rc).
    type: list
    elements: dict
    default: []
    suboptions:
      repo: {description: Path of the checkout., type: path, required: true}
      rev: {description: "The revision, e.g. C(<sha>^{commit}).", type: str, required: true}
  packages:
    description:
      - Debian packages whose installed version is read from dpkg's database. The answer maps each name to its
        version, or null when it is not fully installed.
    type: list
    elements: str
    default: []
  units:
    description:
      - systemd units whose C(LoadState), C(UnitFileState), C(ActiveState) and C(SubState) are read with one
        C(systemctl show).
    type: list
    elements: str
    default: []
  gguf_layout:
    description:
      - A GGUF model (its first split) whose tensor table is read with the kit's GGUF reader, as
        M(hmk.moe_kit.hmk_gguf_layout) reads it; a file that is not GGUF fails the task.
    type: path
author: hybrid-moe-kit
"""

EXAMPLES = r"""
- name: The build state is read (one visit)
  hmk.moe_kit.hmk_probe:
    paths: [/opt/hmk/llama/current]
    read: [/opt/hmk/llama/current/build-record.json]
    listdirs:
      - {path: /opt/hmk/llama/builds, marker: build-record.json}
    cpu_flags: true
    git:
      - {repo: /opt/hmk/llama/src, rev: "0123abcd^{commit}"}
    packages: [cmake, ccache]
    units: [hmk-model-rehash.timer]
  register: probe
"""

RETURN = r"""
paths:
  description: Each asked path's lstat answer.
  type: dict
  returned: always
contents:
  description: Each asked file's text, or null when it does not exist.
  type: dict
  returned: always
dirs:
  description: Each asked directory's entries.
  type: dict
  returned: always
cpu_flags:
  description: The first flags/Features line of /proc/cpuinfo, or an empty string when not asked.
  type: str
  returned: always
git:
  description: One answer (rc, stdout, stderr) per asked commit, in order.
  type: list
  elements: dict
  returned: always
packages:
  description: Installed version per asked package, null when not installed.
  type: dict
  returned: always
units:
  description: LoadState, UnitFileState, ActiveState and SubState per asked unit.
  type: dict
  returned: always
gguf_layout:
  description: The model's layout as M(hmk.moe_kit.hmk_gguf_layout) returns it (empty when not asked).
  type: dict
  returned: always
"""

import os
import re
import stat
import struct
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_gguf import GGUFError, layout
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import refusal, rule_regex

MAX_READ = 1 << 20
TYPES = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "link"), (stat.S_ISCHR, "char"))


class ProbeError(Exception):
    pass


def _type(mode):
    for test, name in TYPES:
        if test(mode):
            return name
    return "other"


def path_facts(path):
    try:
        st = os.lstat(path)
    except OSError:
        return {"exists": False, "type": "missing", "lnk_target": "", "target_type": "missing", "executable": False}
    kind = _type(st.st_mode)
    answer = {"exists": True, "type": kind, "lnk_target": "", "target_type": kind, "mode": "%04o" % stat.S_IMODE(st.st_mode),
              "uid": st.st_uid, "gid": st.st_gid, "size": st.st_size, "mtime": st.st_mtime}
    if kind == "link":
        answer["lnk_target"] = os.readlink(path)
        try:
            answer["target_type"] = _type(os.stat(path).st_mode)
        except OSError:
            answer["target_type"] = "missing"
    answer["executable"] = answer["target_type"] == "file" and os.access(path, os.X_OK)
    return answer


def read_text(path):
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_READ + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ProbeError("%s cannot be read: %s" % (path, exc.strerror))
    if len(data) > MAX_READ:
        raise ProbeError("%s is over %d bytes, not a small file to read whole" % (path, MAX_READ))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProbeError("%s is not UTF-8 text" % path)


def list_dir(path, marker=None, pattern=None):
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise ProbeError("%s cannot be listed: %s" % (path, exc.strerror))
    match = re.compile(pattern).fullmatch if pattern else None
    entries = []
    for name in sorted(names):
        if match and not match(name):
            continue
        full = os.path.join(path, name)
        try:
            st = os.lstat(full)
        except OSError:  # removed while listing
            continue
        entry = {"name": name, "path": full, "type": _type(st.st_mode), "mtime": st.st_mtime}
        if marker:
            entry["marker"] = os.path.exists(os.path.join(full, marker))
        entries.append(entry)
    return entries


def cpu_flags_line(text):
    for line in text.splitlines():
        if re.match(r"^(flags|Features)\s*:", line):
            return line
    return ""


def _run(argv):
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False,
                              env=dict(os.environ, LC_ALL="C"))
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc)}
    return {"rc": proc.returncode, "stdout": proc.stdout.decode("utf-8", "replace").strip(),
            "stderr": proc.stderr.decode("utf-8", "replace").strip()}


def git_commit(repo, rev):
    if not os.path.isdir(repo):
        return {"rc": 128, "stdout": "", "stderr": "%s is not a checkout" % repo}
    return _run(["git", "-C", repo, "log", "-1", "--format=%H%x20%cs", rev, "--"])


def parse_dpkg_status(text, names):
    """{name: version or None} from dpkg's status database (the paragraphs of /var/lib/dpkg/status)."""
    wanted = set(names)
    found = {}
    for paragraph in text.split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, value = line.split(":", 1)
            fields[key] = value.strip()
        name = fields.get("Package")
        if name in wanted and fields.get("Status", "").split()[-1:] == ["installed"]:
            found[name] = fields.get("Version")
    return dict((name, found.get(name)) for name in names)


def parse_systemctl_show(text, units):
    """systemctl show prints one block per unit, in the order asked, separated by blank lines."""
    unknown = {"LoadState": "not-found", "UnitFileState": "", "ActiveState": "inactive", "SubState": "dead"}
    blocks = text.strip().split("\n\n") if text.strip() else []
    answers = {}
    for unit, block in zip(units, blocks):
        answers[unit] = dict(unknown, **dict(line.split("=", 1) for line in block.splitlines() if "=" in line))
    for unit in units:
        answers.setdefault(unit, dict(unknown))
    return answers


def units_state(units):
    if not units:
        return {}
    result = _run(["systemctl", "show", "--property=LoadState,UnitFileState,ActiveState,SubState", "--"] + list(units))
    if result["rc"] != 0:
        raise ProbeError("systemctl show failed: %s" % result["stderr"])
    return parse_systemctl_show(result["stdout"], units)


def param_refusals(params):
    """Refusals for what the system calls cannot take (a NUL byte in a path) or re cannot compile, named."""
    out = []
    paths = [("paths[%d]" % i, p) for i, p in enumerate(params["paths"])]
    paths += [("read[%d]" % i, p) for i, p in enumerate(params["read"])]
    paths += [("listdirs[%d].path" % i, d["path"]) for i, d in enumerate(params["listdirs"])]
    paths += [("git[%d].repo" % i, g["repo"]) for i, g in enumerate(params["git"])]
    paths += [("gguf_layout", params.get("gguf_layout") or "")]
    for var, path in paths:
        if "\x00" in path:
            out.append(refusal(var, path, "a path without a NUL byte"))
    for index, item in enumerate(params["listdirs"]):
        if item.get("pattern"):
            problem = rule_regex(item["pattern"])
            if problem:
                out.append(refusal("listdirs[%d].pattern" % index, item["pattern"], problem))
    return out


def probe(params):
    result = {
        "paths": dict((p, path_facts(p)) for p in params["paths"]),
        "contents": dict((p, read_text(p)) for p in params["read"]),
        "dirs": dict((d["path"], list_dir(d["path"], d.get("marker"), d.get("pattern"))) for d in params["listdirs"]),
        "cpu_flags": "",
        "git": [git_commit(g["repo"], g["rev"]) for g in params["git"]],
        "packages": {},
        "units": units_state(params["units"]),
    }
    if params["cpu_flags"]:
        result["cpu_flags"] = cpu_flags_line(read_text("/proc/cpuinfo") or "")
    if params["packages"]:
        result["packages"] = parse_dpkg_status(read_text_large("/var/lib/dpkg/status"), params["packages"])
    result["gguf_layout"] = {}
    if params.get("gguf_layout"):
        try:
            result["gguf_layout"] = layout(params["gguf_layout"])
        except (GGUFError, OSError, struct.error) as exc:
            raise ProbeError("cannot read the model's tensor table: %s" % exc)
    return result


def read_text_large(path):
    """dpkg's status database is larger than a small file; read it whole."""
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def main():
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="path", default=[]),
            read=dict(type="list", elements="path", default=[]),
            listdirs=dict(type="list", elements="dict", default=[], options=dict(
                path=dict(type="path", required=True),
                marker=dict(type="str"),
                pattern=dict(type="str"),
            )),
            cpu_flags=dict(type="bool", default=False),
            git=dict(type="list", elements="dict", default=[], options=dict(
                repo=dict(type="path", required=True),
                rev=dict(type="str", required=True),
            )),
            packages=dict(type="list", elements="str", default=[]),
            units=dict(type="list", elements="str", default=[]),
            gguf_layout=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    refusals = param_refusals(module.params)
    if refusals:
        module.fail_json(msg="refused: " + " | ".join(refusals), refusals=refusals)
    try:
        result = probe(module.params)
    except ProbeError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
