"""The key of a VM twin's saved booted state: the same machine finds the same state whatever the instance is called,
where it lives or which port it listens on; any part of the machine the guest sees (or the QEMU that saved it)
makes a new key, so a twin never resumes a guest that booted on other hardware."""
import argparse
from pathlib import Path

import pytest

import unit_support

REPO = Path(__file__).resolve().parents[2]
twin = unit_support.load_script("twin_vmstate", REPO / "scripts" / "twin")

QEMU = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"


def machine_args(**over):
    args = dict(name="epyc-node", port=2222, cpus=2, memory=2048, numa_nodes=1, memory_only_nodes=0,
                memory_only_node_mb=512, threads_per_core=1, dimms="12/12", dimm_size_gb=32, dimm_speed=4800,
                dimm_type="DDR5", nvme_size="")
    args.update(over)
    return argparse.Namespace(**args)


def key(tmp_path, accel=("-accel", "tcg,thread=multi,tb-size=128"), cpu="Nehalem", qemu=QEMU, instance="a", **over):
    args = machine_args(**over)
    d = tmp_path / instance / "twins" / args.name
    machine = twin.vm_machine(args, d, list(accel), cpu)
    return twin.vm_state_key(machine, d, args.port, qemu, args.nvme_size)


@pytest.fixture(autouse=True)
def fixed_image(monkeypatch):
    monkeypatch.setattr(twin, "image_key", lambda: "0123456789abcdef")


def test_instance_parts_do_not_change_the_key(tmp_path):
    base = key(tmp_path, nvme_size="2G")
    assert key(tmp_path, nvme_size="2G", name="kt-reboot") == base
    assert key(tmp_path, nvme_size="2G", port=2321) == base
    assert key(tmp_path, nvme_size="2G", instance="elsewhere", name="bed-vm", port=2301) == base


@pytest.mark.parametrize("part", [
    {"cpus": 4}, {"threads_per_core": 2}, {"numa_nodes": 2}, {"memory": 4096},
    {"memory_only_nodes": 1}, {"dimms": "8/12"}, {"dimm_size_gb": 64}, {"dimm_speed": 5600},
    {"dimm_type": "DDR4"}, {"nvme_size": "1G"},
])
def test_each_machine_part_changes_the_key(tmp_path, part):
    assert key(tmp_path, **part) != key(tmp_path)


def test_the_size_of_a_memory_only_node_changes_the_key(tmp_path):
    assert key(tmp_path, memory_only_nodes=1, memory_only_node_mb=1024) != key(tmp_path, memory_only_nodes=1)


def test_the_nvme_size_changes_the_key(tmp_path):
    assert key(tmp_path, nvme_size="1G") != key(tmp_path, nvme_size="2G")


def test_the_accelerator_cpu_model_qemu_and_image_change_the_key(tmp_path, monkeypatch):
    base = key(tmp_path)
    assert key(tmp_path, accel=("-accel", "tcg,thread=single,tb-size=128")) != base
    assert key(tmp_path, accel=("-accel", "kvm"), cpu="host") != base
    assert key(tmp_path, cpu="host") != base
    assert key(tmp_path, qemu="QEMU emulator version 8.2.2") != base
    monkeypatch.setattr(twin, "image_key", lambda: "fedcba9876543210")
    assert key(tmp_path) != base


def test_the_smbios_tables_count_by_content(tmp_path, monkeypatch):
    base = key(tmp_path)
    real = twin.smbios_tables

    def other_tables(outdir, *a):
        out = real(outdir, *a)
        (outdir / "t16.bin").write_bytes(b"\x10other")
        return out

    monkeypatch.setattr(twin, "smbios_tables", other_tables)
    assert key(tmp_path) != base


def test_a_saved_state_has_no_nvme_controller_and_the_restore_plugs_it_in_later(tmp_path):
    d = tmp_path / "twins" / "kt"
    machine = twin.vm_machine(machine_args(nvme_size="64M"), d, ["-accel", "kvm"], "host")
    assert "nvme,serial=TWINMODELS01,drive=nv0,bus=rp1" in machine
    kept = twin.without(machine, "nvme,")
    assert "-device" in kept and not [a for a in kept if a.startswith("nvme,")]
    assert [a for a in kept if "id=nv0" in a], "the restore keeps the NVMe drive for the hot-plug"
    assert "pcie-root-port,id=rp1,chassis=1,slot=1" in kept, "the empty root port is part of the saved machine"
    builder = twin.without(machine, "nvme,", f"file={d / 'nvme0'}")
    assert not [a for a in builder if a.startswith("nvme,") or "nvme0.qcow2" in a]
    assert len(machine) - len(builder) == 4
