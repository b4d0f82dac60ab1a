# -*- coding: utf-8 -*-
"""Boot loader knowledge of the kernel_tuning role: which loader boots the node (from the node's own
state), whether the role can give it kernel arguments, and how: GRUB through a /etc/default/grub.d
drop-in, systemd-boot through /etc/kernel/cmdline and kernel-install's loader entries.

Pure functions with unit tests (tests/unit/test_kernel_tuning_bootloader.py); the role feeds them
what its read-only probe printed.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import guard_filters

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

# The tokens kernel-install drops when it builds a command line from /proc/cmdline (90-loaderentry).
_BOOT_ONLY_TOKENS = re.compile(r"^(BOOT_IMAGE|initrd)=")
LOADERS = ("grub", "systemd-boot")


def probe_state(text):
    """The probe's 'key=value' lines and its 'inspect|...' lines (kernel-install inspect) as a dict."""
    state = {"inspect": []}
    for line in str(text or "").splitlines():
        if line.startswith("inspect|"):
            state["inspect"].append(line[len("inspect|"):])
            continue
        key, sep, value = line.partition("=")
        if sep and re.match(r"^[a-z_]+$", key):
            state[key] = value
    return state


def kernel_install_inspect(lines):
    """Layout and boot root from `kernel-install inspect`: the shell script of systemd <= 252 prints
    'KERNEL_INSTALL_LAYOUT: bls', the C rewrite (253+) lists the plugins' environment as
    'KERNEL_INSTALL_LAYOUT=bls'."""
    found = {"layout": "", "boot_root": "", "entry_token": ""}
    for line in lines or []:
        match = re.match(r"^\s*KERNEL_INSTALL_(LAYOUT|BOOT_ROOT|ENTRY_TOKEN)\s*[:=]\s*(.*?)\s*$", line)
        if match:
            found[match.group(1).lower()] = match.group(2)
    return found


def bootloader(text, override="auto"):
    """Which loader the role writes kernel arguments for, decided from the node's probe output.

    The firmware's LoaderInfo EFI variable names the loader that booted this system (systemd-boot
    always sets it; GRUB 2.12 with its bli module does too). Without it, systemd-boot did not boot
    the node (it is UEFI-only and always sets LoaderInfo), so a configured GRUB is the loader.
    Returns loader ('grub' | 'systemd-boot' | ''), refusal (a sentence with the fix, '' when
    supported), evidence (what was read) and, for systemd-boot, kernel-install's boot_root."""
    st = probe_state(text)
    inspect = kernel_install_inspect(st["inspect"])
    efi = st.get("efi") == "yes"
    loader_info = st.get("loader_info", "").strip()
    grub = st.get("grub") == "yes"
    evidence = ["UEFI boot" if efi else "BIOS/legacy boot (no /sys/firmware/efi)",
                "LoaderInfo: %s" % (loader_info or "none"),
                "GRUB configured (update-grub and /boot/grub/grub.cfg): %s" % ("yes" if grub else "no"),
                "bootctl is-installed: %s" % (st.get("bootctl") or "no bootctl"),
                "kernel-install layout: %s, boot root: %s" % (inspect["layout"] or "-", inspect["boot_root"] or "-")]
    result = {"loader": "", "refusal": "", "evidence": evidence, "boot_root": inspect["boot_root"],
              "layout": inspect["layout"]}
    override = str(override or "auto")
    if override not in ("auto",) + LOADERS:
        raise AnsibleFilterError("kernel_tuning_bootloader must be auto, grub or systemd-boot, not %r" % override)

    if override != "auto":
        candidate = override
    elif efi and loader_info:
        lowered = loader_info.lower()
        if lowered.startswith("systemd-boot"):
            candidate = "systemd-boot"
        elif lowered.startswith("grub"):
            candidate = "grub"
        else:
            result["refusal"] = (
                "The firmware says %s booted this node (LoaderInfo); the role writes kernel arguments only for GRUB "
                "and systemd-boot. Nothing was changed. Add the arguments to that loader's configuration yourself, or "
                "set kernel_tuning_bootloader if the node boots GRUB or systemd-boot next." % loader_info)
            return result
    elif grub:
        candidate = "grub"
    else:
        extra = []
        if st.get("extlinux") == "yes":
            extra.append("extlinux/syslinux configuration found")
        result["refusal"] = (
            "No boot loader the role can configure was found: no GRUB (update-grub and /boot/grub/grub.cfg), and %s "
            "(%s). Nothing was changed. Add the kernel arguments to the node's boot loader yourself, or set "
            "kernel_tuning_bootloader to grub or systemd-boot if one of them boots it."
            % ("the firmware names no loader" if efi else "systemd-boot cannot have booted it (not a UEFI boot)",
               "; ".join(evidence + extra)))
        return result

    if candidate == "grub":
        if not grub:
            result["refusal"] = (
                "kernel_tuning_bootloader is grub, but GRUB is not configured here (no update-grub or no "
                "/boot/grub/grub.cfg). Nothing was changed. Install GRUB's configuration tools or choose the loader "
                "that boots the node.")
            return result
        result["loader"] = "grub"
        return result

    if st.get("kernelstub") == "yes":
        result["refusal"] = (
            "This node's systemd-boot entries are written by kernelstub (/etc/kernelstub/configuration, Pop!_OS), "
            "which would overwrite what kernel-install writes. Nothing was changed. Add the arguments with "
            "kernelstub -a ARGUMENT for each requested argument, then reboot.")
        return result
    if st.get("kernel_install") != "yes" or inspect["layout"] != "bls":
        result["refusal"] = (
            "systemd-boot boots this node, but kernel-install would not write Boot Loader Specification entries "
            "(layout %s, boot root %s), so kernel arguments in /etc/kernel/cmdline would never reach the loader. "
            "Nothing was changed. Mount the EFI system partition where it belongs (/boot/efi or /efi, as in "
            "/etc/fstab) and install systemd-boot's kernel-install integration (apt-get install systemd-boot), or set "
            "layout=bls in /etc/kernel/install.conf; a unified-kernel-image layout (uki) embeds the command line "
            "when the image is built and is not handled by the role."
            % (inspect["layout"] or "unknown (no kernel-install)", inspect["boot_root"] or "unknown"))
        return result
    result["loader"] = "systemd-boot"
    return result


def cmdline_base(text):
    """What kernel-install puts on the entries' options line today: /etc/kernel/cmdline, else
    /usr/lib/kernel/cmdline, else /proc/cmdline without BOOT_IMAGE= and initrd=."""
    st = probe_state(text)
    for key in ("etc_kernel_cmdline", "usr_kernel_cmdline"):
        if st.get(key + "_exists") == "yes":
            return " ".join(st.get(key, "").split())
    return " ".join(t for t in st.get("cmdline", "").split() if not _BOOT_ONLY_TOKENS.match(t))


def kernel_cmdline(base, wanted):
    """base with every wanted argument it lacks appended, each once, as /etc/kernel/cmdline's line."""
    words = str(base or "").split()
    missing = []
    for arg in wanted or []:
        if arg not in words and arg not in missing:
            missing.append(arg)
    return " ".join(words + missing) + "\n"


def loader_entries(text):
    """Boot Loader Specification entries from '==> PATH <==' blocks: path, version, options."""
    entries = []
    blocks = re.split(r"^==> (.+?) <==[ \t]*$", str(text or ""), flags=re.M)
    for path, body in zip(blocks[1::2], blocks[2::2]):
        entry = {"path": path, "version": "", "options": []}
        for line in body.splitlines():
            match = re.match(r"^\s*(version|options)\s+(.*?)\s*$", line)
            if not match:
                continue
            if match.group(1) == "version":
                entry["version"] = match.group(2)
            else:
                entry["options"] += match.group(2).split()
        entries.append(entry)
    return entries


def stale_kernels(entries, kernels, wanted):
    """Installed kernel releases whose loader entries are missing or lack a wanted argument."""
    stale = []
    for kernel in kernels or []:
        mine = [e for e in entries or [] if e["version"] == kernel]
        if not mine or any(arg not in e["options"] for e in mine for arg in wanted or []):
            stale.append(kernel)
    return stale


class FilterModule(object):
    """kernel_tuning filters."""

    def filters(self):
        return guard_filters({
            "kernel_tuning_bootloader": bootloader,
            "kernel_tuning_cmdline_base": cmdline_base,
            "kernel_tuning_kernel_cmdline": kernel_cmdline,
            "kernel_tuning_loader_entries": loader_entries,
            "kernel_tuning_stale_kernels": stale_kernels,
        }, AnsibleFilterError)
