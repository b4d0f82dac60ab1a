"""The boot loader decision of kernel_tuning (plugins/filter/kernel_tuning.py) on the role's own
probe output, taken on the kernel_tuning_noreboot twin (tests/fixtures/bootloader/INDEX.md says what
was real and what staged in each), and the /etc/kernel/cmdline and loader-entry logic."""
import importlib
import io
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))
kt = importlib.import_module("kernel_tuning")

OWN = os.path.join(ROOT, "tests", "fixtures", "bootloader", "own")
WANTED = ["pcie_aspm.policy=performance", "numa_balancing=disable"]


def read(name):
    with io.open(os.path.join(OWN, name), encoding="utf-8") as handle:
        return handle.read()


SDBOOT = read("probe--twin-systemd-boot-loaderinfo-staged.txt")
NO_ESP = read("probe--twin-systemd-boot-esp-unmounted.txt")
GRUB_BOOT = read("probe--twin-grub-boot-systemd-boot-installed.txt")


def test_the_firmwares_loaderinfo_makes_it_systemd_boot_although_grub_is_installed():
    decision = kt.bootloader(SDBOOT)
    assert decision["loader"] == "systemd-boot" and decision["refusal"] == ""
    assert decision["boot_root"] == "/boot/efi" and decision["layout"] == "bls"
    assert "GRUB configured (update-grub and /boot/grub/grub.cfg): yes" in decision["evidence"]


def test_without_loaderinfo_grub_boots_the_node_even_with_systemd_boot_in_the_esp():
    decision = kt.bootloader(GRUB_BOOT)
    assert decision["loader"] == "grub" and decision["refusal"] == ""
    assert "bootctl is-installed: yes" in decision["evidence"]


def test_systemd_boot_without_its_esp_is_refused_with_the_fix():
    decision = kt.bootloader(NO_ESP)
    assert decision["loader"] == ""
    text = decision["refusal"]
    assert "systemd-boot boots this node" in text and "layout other" in text and "boot root /boot" in text
    assert "Mount the EFI system partition" in text and "Nothing was changed" in text


def test_an_override_names_the_loader_but_still_needs_its_tools():
    assert kt.bootloader(SDBOOT, "grub")["loader"] == "grub"
    assert kt.bootloader(GRUB_BOOT, "systemd-boot")["loader"] == "systemd-boot"
    assert "kernel-install would not write" in kt.bootloader(NO_ESP, "systemd-boot")["refusal"]
    with pytest.raises(Exception, match="must be auto, grub or systemd-boot"):
        kt.bootloader(SDBOOT, "lilo")


# Derived from the real probes by editing one line each, for the cases the twin cannot show.
def _edit(text, key, value):
    return "\n".join(("%s=%s" % (key, value)) if line.startswith(key + "=") else line for line in text.splitlines())


def test_grub_named_by_the_firmware_is_grub():
    assert kt.bootloader(_edit(SDBOOT, "loader_info", "GRUB 2.12"))["loader"] == "grub"


def test_a_loader_the_role_does_not_know_is_refused_by_name():
    decision = kt.bootloader(_edit(SDBOOT, "loader_info", "Limine 8.0"))
    assert decision["loader"] == "" and "Limine 8.0 booted this node" in decision["refusal"]


def test_no_grub_and_no_loaderinfo_is_refused_with_what_was_read():
    decision = kt.bootloader(_edit(GRUB_BOOT, "grub", "no"))
    assert decision["loader"] == ""
    assert "No boot loader the role can configure" in decision["refusal"]
    assert "not a UEFI boot" in decision["refusal"] and "Nothing was changed" in decision["refusal"]


def test_kernelstub_hosts_are_refused_with_its_own_command():
    decision = kt.bootloader(_edit(SDBOOT, "kernelstub", "yes"))
    assert "kernelstub -a" in decision["refusal"]


def test_the_administrators_cmdline_is_kept_and_each_argument_added_once():
    base = kt.cmdline_base(SDBOOT)
    assert "numa_balancing=disable" in base.split() and not base.startswith("BOOT_IMAGE")
    line = kt.kernel_cmdline(base, WANTED)
    assert line.endswith("\n") and line.split()[:len(base.split())] == base.split()
    assert [line.split().count(arg) for arg in WANTED] == [1, 1]
    assert kt.kernel_cmdline(line, WANTED) == line


def test_without_a_cmdline_file_kernel_install_uses_proc_cmdline_without_the_loaders_tokens():
    probe = "\n".join(l for l in SDBOOT.splitlines() if not l.startswith("etc_kernel_cmdline"))
    proc = kt.probe_state(probe)["cmdline"].split()
    base = kt.cmdline_base(probe).split()
    assert base == [t for t in proc if not t.startswith(("BOOT_IMAGE=", "initrd="))]
    assert any(t.startswith("BOOT_IMAGE=") for t in proc)


def test_loader_entries_lacking_an_argument_are_found():
    entries = kt.loader_entries(read("loader-entries--twin-after-the-role.txt"))
    kernels = sorted({e["version"] for e in entries})
    assert kernels and all(e["options"] for e in entries)
    assert kt.stale_kernels(entries, kernels, WANTED) == []
    assert kt.stale_kernels(entries, kernels, WANTED + ["iommu=pt"]) == kernels
    assert kt.stale_kernels(entries, kernels + ["9.9.9-test"], WANTED) == ["9.9.9-test"]
