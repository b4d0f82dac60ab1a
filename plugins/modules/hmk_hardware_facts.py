#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_hardware_facts
short_description: Read the BIOS and hardware facts an inference node depends on, and judge them
description:
  - Reads lscpu, numactl, dmidecode -t 17, /proc, /sys, mokutil, lspci and nvidia-smi on the node.
  - Judges the facts against the hardware profile (C(hmk_hardware)) and returns one check per item.
  - Only reads; supports check mode and never reports a change.
options:
  profile:
    description: The hardware profile (hmk_hardware) with the expected values.
    type: dict
    default: {}
  models_path:
    description: Where the models will live; free space is measured at its nearest existing ancestor.
    type: str
    default: /srv/models
  waive:
    description: Check ids whose failure is reported as a waived warning.
    type: list
    elements: str
    default: []
  numa_balancing_fixed_later:
    description: NUMA balancing on is a warning (not a failure) because a later role turns it off.
    type: bool
    default: true
  host_label:
    description: Name used in the report title (the inventory name); the node's hostname when empty.
    type: str
    default: ""
author: hybrid-moe-kit
"""

EXAMPLES = r"""
- name: The hardware facts and the checklist are known
  hmk_hardware_facts:
    profile: "{{ hmk_hardware }}"
    models_path: /srv/models
  register: preflight
"""

RETURN = r"""
hardware:
  description: The gathered facts (cpu, memory, gpus, nvme, numa_balancing, pcie_aspm_policy, ...).
  returned: always
  type: dict
checks:
  description: One entry per check with id, status, observed, expected, why, remedy.
  returned: always
  type: list
summary:
  description: Counts per status and failed_ids.
  returned: always
  type: dict
table:
  description: The checks as a fixed-width text table.
  returned: always
  type: str
markdown:
  description: The preflight.md report.
  returned: always
  type: str
"""

import glob
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_hardware import (
    UNKNOWN, apply_waivers, evaluate, isa_summary, normalize_bdf, parse_bracketed, parse_cpuinfo_flags,
    parse_dmidecode_memory, parse_lscpu, parse_lspci_link, parse_meminfo_total_gb, parse_mokutil_sb_state,
    parse_numactl, parse_nvidia_smi_csv, parse_sysfs_link, render_markdown, render_table, summarize)

C_ENV = {"LANG": "C", "LC_ALL": "C"}


def read(path, default=None):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return default


def run(module, argv):
    """Output of a command, or None when it is missing or fails (the check then says unknown)."""
    binary = module.get_bin_path(argv[0])
    if not binary:
        return None
    rc, out, _err = module.run_command([binary] + argv[1:], environ_update=C_ENV)
    return out if rc == 0 else None


def gather_cpu(module):
    cpu = parse_lscpu(run(module, ["lscpu"]) or "")
    cpuinfo_flags = parse_cpuinfo_flags(read("/proc/cpuinfo", ""))
    if cpuinfo_flags:
        cpu["flags"] = cpuinfo_flags
        cpu["hypervisor"] = cpu["hypervisor"] or "hypervisor" in cpuinfo_flags
    nodes = glob.glob("/sys/devices/system/node/node[0-9]*")
    numactl = parse_numactl(run(module, ["numactl", "--hardware"]) or "")
    cpu["numa_nodes"] = len(nodes) or numactl["node_count"] or cpu["numa_nodes"]
    cpu["numa_memoryless_nodes"] = numactl["memoryless_nodes"]
    smt = read("/sys/devices/system/cpu/smt/active")
    if smt in ("0", "1"):
        cpu["smt_active"] = smt == "1"
    elif cpu.get("threads_per_core"):
        cpu["smt_active"] = cpu["threads_per_core"] > 1
    else:
        cpu["smt_active"] = None
    cpu["isa"] = isa_summary(cpu["flags"])
    cpu.pop("numa_node_cpus", None)
    return cpu


def gather_gpus(module):
    smi = {}
    for gpu in parse_nvidia_smi_csv(run(module, ["nvidia-smi", "--query-gpu=pci.bus_id,name,memory.total,pstate",
                                                 "--format=csv,noheader,nounits"]) or ""):
        smi[gpu["pci_address"]] = gpu
    gpus = []
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        if read(os.path.join(dev, "vendor")) != "0x10de" or not (read(os.path.join(dev, "class")) or "").startswith("0x03"):
            continue
        bdf = normalize_bdf(os.path.basename(dev))
        link = parse_sysfs_link(*[read(os.path.join(dev, name)) for name in
                                  ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")])
        if link["current_width"] is None:
            link = parse_lspci_link(run(module, ["lspci", "-vv", "-s", bdf]) or "")
        described = (run(module, ["lspci", "-s", bdf]) or "").strip()
        numa = read(os.path.join(dev, "numa_node"))
        gpus.append({
            "pci_address": bdf,
            "model": smi.get(bdf, {}).get("model") or (described.split(": ", 1)[1] if ": " in described else None),
            "vram_mib": smi.get(bdf, {}).get("vram_mib"),
            "link": link,
            "numa_node": int(numa) if numa not in (None, "") else None,
        })
    return gpus


def _mount_point(path):
    """The mount point of the filesystem holding `path`: stable while directories under it come and go."""
    path = os.path.realpath(path)
    device = os.stat(path).st_dev
    while path != "/":
        parent = os.path.dirname(path)
        if os.stat(parent).st_dev != device:
            break
        path = parent
    return path


def gather_disk(models_path):
    path = models_path
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    if not path:
        return {"path": models_path, "checked_path": None, "free_gb": None}
    stat = os.statvfs(path)
    # Report the filesystem, not the deepest existing directory, so a re-run after the models
    # directory is created reads the same.
    path = _mount_point(path)
    return {"path": models_path, "checked_path": path, "free_gb": stat.f_bavail * stat.f_frsize // 10 ** 9}


def gather_secure_boot(module):
    state = parse_mokutil_sb_state(run(module, ["mokutil", "--sb-state"]) or "")
    if state:
        return state
    if not os.path.isdir("/sys/firmware/efi"):
        return "not_efi"
    for var in glob.glob("/sys/firmware/efi/efivars/SecureBoot-*"):
        try:
            with open(var, "rb") as handle:
                data = handle.read()
            return "enabled" if data[-1:] == b"\x01" else "disabled"
        except (IOError, OSError):
            return None
    return None


def gather(module):
    numa_balancing = read("/proc/sys/kernel/numa_balancing")
    return {
        "cpu": gather_cpu(module),
        "memory": parse_dmidecode_memory(run(module, ["dmidecode", "-t", "17"]) or ""),
        "memory_total_gb": parse_meminfo_total_gb(read("/proc/meminfo", "")),
        # None: the kernel has no NUMA balancing at all; UNKNOWN: the file exists but says nothing usable.
        "numa_balancing": None if numa_balancing is None else
        (int(numa_balancing) if numa_balancing.isdigit() else UNKNOWN),
        "pcie_aspm_policy": parse_bracketed(read("/sys/module/pcie_aspm/parameters/policy")),
        "transparent_hugepages": parse_bracketed(read("/sys/kernel/mm/transparent_hugepage/enabled")),
        "cmdline": read("/proc/cmdline", ""),
        "secure_boot": gather_secure_boot(module),
        "gpus": gather_gpus(module),
        "nvme": [{"name": os.path.basename(d), "model": read(os.path.join(d, "model"))}
                 for d in sorted(glob.glob("/sys/class/nvme/nvme*"))],
        "models_disk": gather_disk(module.params["models_path"]),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profile=dict(type="dict", default={}),
            models_path=dict(type="str", default="/srv/models"),
            waive=dict(type="list", elements="str", default=[]),
            numa_balancing_fixed_later=dict(type="bool", default=True),
            host_label=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    facts = gather(module)
    checks = apply_waivers(evaluate(facts, module.params["profile"], module.params["numa_balancing_fixed_later"]),
                           module.params["waive"])
    summary = summarize(checks)
    host = module.params["host_label"] or read("/proc/sys/kernel/hostname", "node")
    module.exit_json(changed=False, hardware=facts, checks=checks, summary=summary, table=render_table(checks),
                     markdown=render_markdown(host, checks, facts, summary))


if __name__ == "__main__":
    main()
