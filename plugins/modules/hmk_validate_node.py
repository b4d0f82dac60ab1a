#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Input checks only the node can answer: paths that must exist, sysctl keys, ports other units listen on, and the
kit's service accounts."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_validate_node
short_description: Refuse inputs that do not fit the node, before anything changes
description:
  - Read-only; runs the same in check mode. Fails with one sentence per refusal, each naming the variable, the
    value and what is allowed.
  - C(paths) must exist (as a file or a directory when C(type) says so).
  - C(sysctl_keys) must exist under /proc/sys on this kernel (a key the kernel lacks would sit in the drop-in
    and fail at every boot).
  - C(ports) must not be listened on by another unit or process (the own C(unit) may hold it).
  - C(accounts) must be the kit's own service accounts or free to be created, as M(hmk.moe_kit.hmk_service_account)
    refuses them (root, gid 0, accounts and groups the kit did not create); what creating them would change is
    returned, so that the role's write visit follows only when something is pending.
options:
  paths:
    description: Paths that must exist - var, path, type (file, directory or any), allow_empty.
    type: list
    elements: dict
    default: []
  sysctl_keys:
    description: Sysctl keys that must exist - var (the variable that holds them), keys (the key names).
    type: dict
    default: {}
  ports:
    description: TCP ports to bind - var, port, host, unit (the unit allowed to hold the port already).
    type: list
    elements: dict
    default: []
  accounts:
    description: Service accounts - name, group (defaults to the name), user_var and group_var (named in refusals).
    type: list
    elements: dict
    default: []
author: hybrid-moe-kit
"""

RETURN = r"""
refusals:
  description: One sentence per input the node refuses (empty when all fit).
  type: list
  returned: always
accounts:
  description:
    - Per asked account name - C(pending) (creating it would change something), C(user_missing), C(group_missing),
      C(wrong_group) and, for an existing user, C(uid).
  type: dict
  returned: always
"""

import glob
import grp
import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import (
    MARK, account_pending, account_problems, parse_proc_net_tcp, port_holders, refusal, rule_ip, rule_port,
    sysctl_key_refusals, unit_of_cgroup)


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return ""


def _socket_owners(inodes):
    """{socket inode: "unit (pid N, comm)"} for the inodes asked about, from /proc/*/fd."""
    owners = {}
    wanted = set("socket:[%s]" % i for i in inodes)
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        pid = fd_dir.split("/")[2]
        try:
            links = [os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)]
        except OSError:
            continue
        for link in links:
            if link in wanted:
                comm = _read("/proc/%s/comm" % pid).strip()
                unit = unit_of_cgroup(_read("/proc/%s/cgroup" % pid))
                owners[link[8:-1]] = "%s (pid %s, %s)" % (unit or "no unit", pid, comm or "?")
    return owners


def _name(item, option, index):
    """The variable an item stands for, as its refusals name it (the item's place when `var` is not a name)."""
    var = item.get("var")
    return var if isinstance(var, str) and var else "%s[%d]" % (option, index)


def shape_refusals(params):
    """Refusals for items that are not what the checks read (a list for a path, a port that is no port): named,
    before any check runs, so a bad value never ends in a traceback."""
    out = []
    for index, item in enumerate(params["paths"]):
        var = _name(item, "paths", index)
        if not isinstance(item.get("var"), str):
            out.append(refusal("paths[%d].var" % index, item.get("var"), "the name of the variable the path comes from"))
        if not isinstance(item.get("path", ""), str):
            out.append(refusal(var, item.get("path"), "a path (a string)"))
        if item.get("type", "any") not in ("file", "directory", "any"):
            out.append(refusal(var + " type", item.get("type"), "file, directory or any"))
    for index, item in enumerate(params["ports"]):
        var = _name(item, "ports", index)
        if not isinstance(item.get("var"), str):
            out.append(refusal("ports[%d].var" % index, item.get("var"), "the name of the variable the port comes from"))
        problem = rule_port(item.get("port"))
        if problem:
            out.append(refusal(var, item.get("port"), problem))
        host = item.get("host", "0.0.0.0")
        problem = rule_ip(host)
        if problem:
            out.append(refusal(var + " host", host, problem))
        if not isinstance(item.get("unit") or "", str):
            out.append(refusal(var + " unit", item.get("unit"), "a systemd unit name"))
    keys = params["sysctl_keys"].get("keys")
    if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
        out.append(refusal(str(params["sysctl_keys"].get("var", "sysctl")), keys, "a list of sysctl key names"))
    for index, item in enumerate(params["accounts"]):
        for option in ("name", "group", "user_var", "group_var"):
            if not isinstance(item.get(option) or "", str):
                out.append(refusal("accounts[%d].%s" % (index, option), item.get(option), "a name (a string)"))
    return out


def check_paths(items):
    out = []
    for item in items:
        path = item.get("path") or ""
        if path == "" and item.get("allow_empty", True):
            continue
        kind = item.get("type", "any")
        ok = os.path.isfile(path) if kind == "file" else os.path.isdir(path) if kind == "directory" else \
            os.path.exists(path)
        if not ok:
            out.append(refusal(item["var"], path, "an existing %s on this node" % {
                "file": "file", "directory": "directory"}.get(kind, "path")))
    return out


def check_sysctl_keys(spec):
    return sysctl_key_refusals(spec.get("var", "sysctl"), spec.get("keys"), os.path.exists)


def check_accounts(items, users, groups):
    """(refusals, {name: pending state}) for the kit's service accounts."""
    out, states = [], {}
    for item in items:
        name = str(item.get("name") or "")
        group = str(item.get("group") or name)
        problems = account_problems(name, group, MARK, users, groups, item.get("user_var") or "service user",
                                    item.get("group_var") or "service group")
        out.extend(problems)
        if not problems:
            states[name] = account_pending(name, group, users, groups)
    return out, states


def check_ports(items):
    if not items:
        return []
    listeners = parse_proc_net_tcp(_read("/proc/net/tcp")) + parse_proc_net_tcp(_read("/proc/net/tcp6"), ipv6=True)
    out = []
    for item in items:
        held = port_holders(int(item["port"]), item.get("host", "0.0.0.0"), listeners, {})
        if not held:
            continue
        owners = _socket_owners([inode for _, inode, _ in held])
        unit = item.get("unit") or ""
        others = [(address, owners.get(inode, "")) for address, inode, _ in held
                  if not (unit and owners.get(inode, "").startswith(unit + " "))]
        if others:
            described = ", ".join("%s on %s" % (owner or "a process this node cannot see (another container or "
                                                "namespace)", address) for address, owner in others)
            out.append(refusal(item["var"], item["port"], "a port no other service listens on (held by %s)" % described))
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="dict", default=[]),
            sysctl_keys=dict(type="dict", default={}),
            ports=dict(type="list", elements="dict", default=[]),
            accounts=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    refusals = shape_refusals(p)
    if refusals:
        module.fail_json(msg="refused before any change: " + " | ".join(refusals), refusals=refusals)
    account_refusals, accounts = check_accounts(p["accounts"], pwd.getpwall(), grp.getgrall()) if p["accounts"] else ([], {})
    refusals = check_paths(p["paths"]) + check_sysctl_keys(p["sysctl_keys"]) + check_ports(p["ports"]) + account_refusals
    if refusals:
        module.fail_json(msg="refused before any change: " + " | ".join(refusals), refusals=refusals)
    module.exit_json(changed=False, refusals=[], accounts=accounts)


if __name__ == "__main__":
    main()
