# -*- coding: utf-8 -*-
"""Controller-side input validation for every role: `specs | hmk.moe_kit.hmk_validate` returns the refusals.

A spec is {var, value, rule, ...options} (plugins/module_utils/hmk_validate.py lists the rules); a role's
first task asserts that the list is empty and prints the refusals, each naming the variable, its value
(secrets masked) and what is allowed.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_engine_arch import catalog_arch_problems
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_model_sync import validate_catalog
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import (
    check_all, check_profile, guard_filters, loopback_address, proc_sys_path, sysctl_key_refusals)

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError


def hmk_validate(specs):
    """Refusals for a list of specs (empty: everything is acceptable)."""
    return check_all(specs)


def hmk_validate_profile(profile, var="hmk_hardware", complete=False):
    """Refusals for a hardware profile (the keys the roles read, their types and ranges); `complete` requires every
    section, as the preflight does."""
    return check_profile(profile, var, complete)


def hmk_validate_catalog(catalog, selected):
    """Refusals for the selected catalog entries' ids, source directories and file names (paths on the node);
    hashes and sizes are checked by their own task, which names the file to fill."""
    return ["model_sync_catalog: " + problem for problem in
            validate_catalog(catalog or {}, [m for m in selected or [] if m in (catalog or {})], require_hashes=False)]


def hmk_engine_arch_problems(catalog, selected, engine, commit):
    """Refusals for the selected catalog models whose GGUF architecture the pinned engine commit cannot load (checked
    before any download; a commit the kit has not read is not judged)."""
    return ["model_sync_catalog: " + problem for problem in
            catalog_arch_problems(catalog or {}, [m for m in selected or [] if m in (catalog or {})], engine, commit)]


def hmk_proc_sys_path(key):
    """The /proc/sys path of a sysctl key, as sysctl(8) reads it."""
    return proc_sys_path(str(key))


def hmk_validate_sysctl_keys(keys, var, present_paths):
    """Refusals for the keys whose /proc/sys path is not among those a role's live read found on the node (the same
    words hmk_validate_node uses)."""
    present = set(present_paths or [])
    return sysctl_key_refusals(var, list(keys or []), lambda path: path in present)


def hmk_is_loopback(host):
    """Whether an address is loopback (127.0.0.0/8, ::1); anything unparsable, a name, or an address with a zone ID
    (::1%eth0) counts as not loopback."""
    return loopback_address(host)


class FilterModule(object):
    def filters(self):
        return guard_filters({"hmk_validate": hmk_validate, "hmk_validate_profile": hmk_validate_profile,
                              "hmk_validate_catalog": hmk_validate_catalog,
                              "hmk_engine_arch_problems": hmk_engine_arch_problems, "hmk_is_loopback": hmk_is_loopback,
                              "hmk_proc_sys_path": hmk_proc_sys_path,
                              "hmk_validate_sysctl_keys": hmk_validate_sysctl_keys}, AnsibleFilterError)
