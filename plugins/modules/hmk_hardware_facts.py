#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_hardware_facts
short_description: Read the BIOS and hardware facts an inference node depends on, and judge them
description:
  - Reads lscpu, /proc/cpuinfo, numactl, dmidecode -t 17, /proc, /sys, mokutil, systemd-detect-virt, lspci and
    nvidia-smi on the node, through the shared parsers of module_utils/hmk_hardware.py.
  - 'A fact that cannot be read is C({"unknown": "<reason>"}), never an empty value.'
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
  description: The gathered facts (platform, dmi, cpu, numa, memory, gpus, cmdline, numa_balancing, ...).
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
    apply_waivers, cpu_generation, detect_platform, evaluate, isa_summary, known, normalize_bdf, parse_bracketed,
    parse_cmdline, parse_cpuinfo, parse_cpulist, parse_dmi_system, parse_dmidecode_memory, parse_lscpu, parse_lspci,
    parse_meminfo_total_gb, parse_mokutil_sb_state, parse_numactl, parse_nvidia_smi_csv, parse_sysfs_link,
    render_markdown, render_table, summarize, unknown)
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import check_profile

C_ENV = {"LANG": "C", "LC_ALL": "C"}


def read(path, default=None):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return default


def run(module, argv):
    """Output of a command, or None when it is missing or fails (the fact then says unknown, with why)."""
    binary = module.get_bin_path(argv[0])
    if not binary:
        return None
    rc, out, _err = module.run_command([binary] + argv[1:], environ_update=C_ENV)
    return out if rc == 0 else None


def gather_cpu(module):
    cpu = parse_lscpu(run(module, ["lscpu"]) or "")
    info = parse_cpuinfo(read("/proc/cpuinfo", ""))
    # /proc/cpuinfo is one line per flag set and never wrapped: prefer it to lscpu's column-wrapped Flags.
    for key in ("flags", "vendor", "family", "model_number", "model"):
        if known(info[key]):
            cpu[key] = info[key]
    if known(cpu["flags"]):
        cpu["hypervisor"] = cpu["hypervisor"] is True or "hypervisor" in cpu["flags"]
    smt = read("/sys/devices/system/cpu/smt/active")
    if smt in ("0", "1"):
        cpu["smt_active"] = smt == "1"
    elif known(cpu.get("threads_per_core")):
        cpu["smt_active"] = cpu["threads_per_core"] > 1
    else:
        cpu["smt_active"] = unknown("no /sys/devices/system/cpu/smt/active and no 'Thread(s) per core'")
    cpu["isa"] = isa_summary(cpu["flags"])
    cpu["generation"] = cpu_generation(cpu["vendor"], cpu["family"], cpu["model_number"], cpu["model"])
    cpu.pop("numa_node_cpus", None)
    return cpu


def gather_numa(module):
    """Nodes from sysfs (CPUs, memory, the sockets of their CPUs); numactl --hardware where sysfs has none."""
    nodes = {}
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        node = int(os.path.basename(path)[4:])
        cpus = parse_cpulist(read(os.path.join(path, "cpulist"), ""))
        meminfo = read(os.path.join(path, "meminfo"), "")
        total = [line.split()[-2] for line in meminfo.splitlines() if "MemTotal:" in line]
        packages = set(read("/sys/devices/system/cpu/cpu%d/topology/physical_package_id" % c) for c in cpus)
        nodes[node] = {
            "cpus": read(os.path.join(path, "cpulist"), ""),
            "size_mb": int(total[0]) // 1024 if total else unknown("%s/meminfo has no MemTotal" % path),
            "packages": [] if not cpus else sorted(int(p) for p in packages) if None not in packages else
            unknown("no physical_package_id for the node's CPUs"),
        }
    source = "sysfs"
    if not nodes:
        numactl = parse_numactl(run(module, ["numactl", "--hardware"]) or "")
        nodes = numactl["nodes"]
        source = "numactl" if nodes else "none"
    return {"source": source, "nodes": nodes or unknown("no /sys/devices/system/node and no numactl output")}


def gather_dmi(module):
    vendor, product = read("/sys/class/dmi/id/sys_vendor"), read("/sys/class/dmi/id/product_name")
    if vendor or product:
        return {"sys_vendor": vendor or unknown("empty sys_vendor"),
                "product_name": product or unknown("empty product_name")}
    return parse_dmi_system(run(module, ["dmidecode", "-t", "1"]) or "")


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
        lspci = parse_lspci(run(module, ["lspci", "-vv", "-nn", "-k", "-s", bdf]) or "").get(bdf, {})
        link = parse_sysfs_link(*[read(os.path.join(dev, name)) for name in
                                  ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")])
        lspci_link = lspci.get("link") or {}
        for key, value in lspci_link.items():
            if key not in link or not known(link[key]):
                link[key] = value
        driver = os.path.realpath(os.path.join(dev, "driver")) if os.path.exists(os.path.join(dev, "driver")) else None
        numa = read(os.path.join(dev, "numa_node"))
        gpus.append({
            "pci_address": bdf,
            "model": smi.get(bdf, {}).get("model") or lspci.get("description") or unknown("no nvidia-smi, no lspci"),
            "vram_mib": smi.get(bdf, {}).get("vram_mib") or unknown("nvidia-smi does not list this GPU"),
            "driver": os.path.basename(driver) if driver else unknown("no driver bound (sysfs driver link absent)"),
            "link": link,
            "numa_node": int(numa) if numa not in (None, "") else unknown("no numa_node in sysfs"),
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
        return {"path": models_path, "checked_path": unknown("no existing parent"), "free_gb": unknown("no path")}
    stat = os.statvfs(path)
    # Report the filesystem, not the deepest existing directory, so a re-run after the models
    # directory is created reads the same.
    path = _mount_point(path)
    return {"path": models_path, "checked_path": path, "free_gb": stat.f_bavail * stat.f_frsize // 10 ** 9}


def gather_secure_boot(module):
    state = parse_mokutil_sb_state(run(module, ["mokutil", "--sb-state"]) or "")
    if known(state):
        return state
    if not os.path.isdir("/sys/firmware/efi"):
        return "not_efi"
    for var in glob.glob("/sys/firmware/efi/efivars/SecureBoot-*"):
        try:
            with open(var, "rb") as handle:
                data = handle.read()
            return "enabled" if data[-1:] == b"\x01" else "disabled"
        except (IOError, OSError) as exc:
            return unknown("%s: %s" % (var, exc))
    return unknown("EFI without a SecureBoot variable and no mokutil")


def gather(module):
    profile = module.params["profile"] or {}
    numa_balancing = read("/proc/sys/kernel/numa_balancing")
    cpu = gather_cpu(module)
    dmi = gather_dmi(module)
    virt = (run(module, ["systemd-detect-virt", "--vm"]) or "").strip() or \
        unknown("systemd-detect-virt missing or silent")
    channels = (profile.get("memory") or {}).get("channels_per_socket") or cpu["generation"]["channels_per_socket"]
    return {
        "platform": detect_platform(cpu, dmi, virt, profile.get("platform") or "auto"),
        "dmi": dmi,
        "cpu": cpu,
        "numa": gather_numa(module),
        "memory": parse_dmidecode_memory(run(module, ["dmidecode", "-t", "17"]) or "", channels),
        "memory_total_gb": parse_meminfo_total_gb(read("/proc/meminfo", "")),
        "numa_balancing": "absent" if numa_balancing is None else
        (int(numa_balancing) if numa_balancing.isdigit() else unknown("numa_balancing reads %r" % numa_balancing)),
        "pcie_aspm_policy": parse_bracketed(read("/sys/module/pcie_aspm/parameters/policy")),
        "transparent_hugepages": parse_bracketed(read("/sys/kernel/mm/transparent_hugepage/enabled")),
        "cmdline": parse_cmdline(read("/proc/cmdline", "")),
        "secure_boot": gather_secure_boot(module),
        "gpus": gather_gpus(module),
        "nvme": [{"name": os.path.basename(d), "model": read(os.path.join(d, "model")) or unknown("no model")}
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
    # The profile is checked before it is judged against: a count that is no number ends in a refusal that names it.
    refusals = check_profile(module.params["profile"], var="profile")
    if refusals:
        module.fail_json(msg="refused: " + " | ".join(refusals), refusals=refusals)
    facts = gather(module)
    checks = apply_waivers(evaluate(facts, module.params["profile"], module.params["numa_balancing_fixed_later"]),
                           module.params["waive"])
    summary = summarize(checks)
    host = module.params["host_label"] or read("/proc/sys/kernel/hostname", "node")
    module.exit_json(changed=False, hardware=facts, checks=checks, summary=summary, table=render_table(checks),
                     markdown=render_markdown(host, checks, facts, summary))


if __name__ == "__main__":
    main()
