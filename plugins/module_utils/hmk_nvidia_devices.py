# -*- coding: utf-8 -*-
"""The NVIDIA driver's character devices as the kernel lists them in /proc/devices, and what a systemd
DeviceAllow=char-GLOB rule admits of them.

Names by driver generation (NVIDIA/open-gpu-kernel-modules; NVIDIA's 550.40 release notes): up to the 535 branch
one region "nvidia-frontend" (major 195, every minor: /dev/nvidiaN and /dev/nvidiactl); from 550.40 on "nvidia"
(195, minors 0-247) and "nvidiactl" (195, minor 255). Every generation adds "nvidia-uvm" (dynamic major; CUDA
opens /dev/nvidia-uvm), "nvidia-caps" and, newer, "nvidia-caps-imex-channels"; "nvidia-nvlink",
"nvidia-nvswitch" on NVLink systems. systemd resolves char-NAME by fnmatch(3) over the "Character devices:"
section when it builds the unit's device filter (src/core/bpf-devices.c, 252 and 257 alike).
Pure Python: the inference_service and doctor filters and the unit tests import it.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch

CONTROL_NAMES = ("nvidia", "nvidiactl", "nvidia-frontend")


def parse(text):
    """/proc/devices -> {"char": {name: major}, "block": {name: major}} (a name listed twice keeps its first major)."""
    out = {"char": {}, "block": {}}
    section = None
    for raw in str(text or "").splitlines():
        line = raw.strip()
        if line == "Character devices:":
            section = "char"
            continue
        if line == "Block devices:":
            section = "block"
            continue
        if not line or section is None:
            continue
        fields = line.split(None, 1)
        if len(fields) == 2 and fields[0].isdigit():
            out[section].setdefault(fields[1], int(fields[0]))
    return out


def nvidia(text, allow=("char-nvidia*",)):
    """What the node's driver registers and what the unit's DeviceAllow= entries let through, with the problems.

    allow: DeviceAllow= values; char-GLOB ones are matched like systemd does (fnmatch over the char section).
    Returns {naming, control_major, uvm_major, names (NVIDIA char devices), allowed (char devices the entries
    admit), missing_from_allow (NVIDIA devices they would refuse), problems: [{what, fix}]}.
    """
    chars = parse(text)["char"]
    globs = [str(a)[len("char-"):] for a in allow or () if str(a).startswith("char-")]
    names = sorted(n for n in chars if n.startswith("nvidia"))
    allowed = sorted(n for n in chars if any(fnmatch.fnmatchcase(n, g) for g in globs))
    if "nvidia-frontend" in chars:
        naming = "nvidia-frontend (535 branch and older)"
    elif "nvidia" in chars or "nvidiactl" in chars:
        naming = "nvidia + nvidiactl (550.40 and newer)"
    else:
        naming = None
    control = next((chars[n] for n in CONTROL_NAMES if n in chars), None)
    problems = []
    if control is None:
        problems.append({
            "what": "/proc/devices lists no NVIDIA driver (neither nvidia, nvidiactl nor nvidia-frontend): the kernel "
                    "module is not loaded",
            "fix": "Load the driver: run playbooks/gpu.yml (nvidia_driver role) and reboot if it says so; by hand "
                   "`modprobe nvidia` and read `dmesg | grep -iE 'nvrm|nvidia'` (Secure Boot refusing an unsigned "
                   "module: `mokutil --sb-state`; no module for the running kernel: `dkms status`)."})
    if control is not None and "nvidia-uvm" not in chars:
        problems.append({
            "what": "/proc/devices lists the NVIDIA driver but not nvidia-uvm: CUDA cannot start without unified memory",
            "fix": "Start hmk-nvidia-device-nodes.service (nvidia_driver role; it runs nvidia-modprobe -u -c=0 at every "
                   "boot) or `nvidia-modprobe -u -c=0` as root, then check /dev/nvidia-uvm."})
    missing = [n for n in names if n not in allowed]
    if missing:
        problems.append({
            "what": "DeviceAllow=%s would refuse %s" % (" ".join(allow or ()), ", ".join(missing)),
            "fix": "Allow every NVIDIA device name the driver registers: DeviceAllow=char-nvidia* rw, which the "
                   "inference_service role renders on GPU nodes (re-run playbooks/serve.yml)."})
    return {"naming": naming, "control_major": control, "uvm_major": chars.get("nvidia-uvm"), "names": names,
            "allowed": allowed, "missing_from_allow": missing, "problems": problems}
