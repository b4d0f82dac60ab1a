"""Unit tests for plugins/module_utils/hmk_hardware.py.

The public captures in tests/fixtures/hardware/ (see INDEX.md there) are asserted to yield what
INDEX.md says a correct parser concludes; the odd cases live in tests/fixtures/hardware/own/.
"""
import copy
import io
import json
import os

import pytest

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_hardware as hw

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hardware")


def fixture(name):
    with io.open(os.path.join(FIXTURES, name), encoding="utf-8", newline="") as handle:
        return handle.read()


# Profiles as the inventories define them (inventories/*/group_vars/*/hardware.yml).
GENOA_4090 = {
    "name": "genoa-1x4090",
    "cpu": {"sockets": 1, "smt": False, "numa_nodes_per_socket": 1,
            "isa_required": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512vbmi"]},
    "memory": {"type": "DDR5", "channels_per_socket": 12, "dimms_per_socket": 12, "min_speed_mts": 4800},
    "gpus": {"count": 1, "model": "RTX 4090", "arch": "89", "vram_gib": 24, "min_link_width": 16},
    "models_path": "/srv/models",
    "models_min_free_gb": 420,
}
LAB = {
    "name": "lab-twin",
    "cpu": {"sockets": 1, "smt": False, "numa_nodes_per_socket": 1, "isa_required": []},
    "memory": {"type": "DDR5", "channels_per_socket": 12, "dimms_per_socket": 12, "min_speed_mts": 4800},
    "gpus": {"count": 0},
    "models_path": "/srv/models",
    "models_min_free_gb": 1,
}


def good_genoa_facts():
    """Facts of a correctly set up Genoa + RTX 4090 node; tests break one thing at a time."""
    memory = hw.parse_dmidecode_memory(fixture("dmidecode--2x-epyc-9654-as4125gs-24of24-ddr5-4800.txt"))
    # Keep the first socket's 12 DIMMs: a single-socket board with every channel populated.
    memory["channels_populated"], memory["channels_total"] = 12, 12
    memory["bandwidth_gbs"] = hw.theoretical_bandwidth_gbs(12, 4800)
    cpu = hw.parse_lscpu(fixture("lscpu--2x-epyc-9374f-esc8000a-smt-off-nps1-avx512.txt"))
    cpu.update({"sockets": 1, "numa_nodes": 1, "smt_active": False})
    return {
        "cpu": cpu,
        "memory": memory,
        "numa_balancing": 0,
        "pcie_aspm_policy": "performance",
        "secure_boot": "disabled",
        "gpus": [{"pci_address": "0000:01:00.0", "model": "NVIDIA GeForce RTX 4090", "vram_mib": 24564,
                  "numa_node": 0,
                  "link": hw.parse_sysfs_link("16.0 GT/s PCIe", "16.0 GT/s PCIe", "16", "16")}],
        "models_disk": {"path": "/srv/models", "checked_path": "/srv/models", "free_gb": 1800},
        "transparent_hugepages": "madvise",
        "cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro",
    }


def by_id(checks):
    return dict((c["id"], c) for c in checks)


# ------------------------------------------------------------------------------------------ lscpu

def test_lscpu_single_epyc_7502p_is_nps1_with_smt_on_and_no_avx512():
    cpu = hw.parse_lscpu(fixture("lscpu--1x-epyc-7502p-smt-on-nps1.txt"))
    assert (cpu["sockets"], cpu["numa_nodes"], cpu["threads_per_core"]) == (1, 1, 2)
    assert cpu["physical_cores"] == 32 and cpu["cpus"] == 64
    assert "avx2" in cpu["flags"]
    assert not [f for f in cpu["flags"] if f.startswith("avx512")]


def test_lscpu_dual_epyc_7742_is_nps4_with_16_cores_per_node():
    cpu = hw.parse_lscpu(fixture("lscpu--2x-epyc-7742-smt-on-nps4-8nodes.txt"))
    assert (cpu["sockets"], cpu["numa_nodes"], cpu["threads_per_core"]) == (2, 8, 2)
    assert cpu["numa_nodes"] // cpu["sockets"] == 4
    assert len(cpu["numa_node_cpus"]) == 8
    assert all(len(cpus) == 32 for cpus in cpu["numa_node_cpus"].values())  # 16 cores x 2 threads
    assert not [f for f in cpu["flags"] if f.startswith("avx512")]


def test_lscpu_nested_layout_joins_flags_wrapped_mid_word():
    cpu = hw.parse_lscpu(fixture("lscpu--2x-epyc-9374f-esc8000a-smt-off-nps1-avx512.txt"))
    assert cpu["model"] == "AMD EPYC 9374F 32-Core Processor"
    assert (cpu["sockets"], cpu["numa_nodes"], cpu["threads_per_core"]) == (2, 2, 1)
    flags = set(cpu["flags"])
    assert {"avx512f", "avx512_bf16", "avx512_vnni", "avx512vbmi", "avx2"} <= flags
    # Wrapped as "a" / "md_lbr_v2", "hw_ps" / "tate", "f" / "srm", "cmp_l" / "egacy".
    assert {"amd_lbr_v2", "hw_pstate", "fsrm", "cmp_legacy", "clwb"} <= flags
    assert not flags & {"a", "md_lbr_v2", "hw_ps", "tate", "f", "srm", "cmp_l", "egacy"}
    assert cpu["hypervisor"] is False


def test_lscpu_vm_with_crlf_reports_hypervisor_and_no_visible_avx512():
    cpu = hw.parse_lscpu(fixture("lscpu--vm-xeon-gold-5117-24-sockets-hypervisor-no-avx512.txt"))
    assert cpu["hypervisor"] is True
    assert cpu["sockets"] == 24 and cpu["cores_per_socket"] == 1 and cpu["threads_per_core"] == 1
    assert cpu["numa_nodes"] is None  # the pasted output stops before the NUMA lines
    assert "pcid" in cpu["flags"] and "cid" not in cpu["flags"] and "p" not in cpu["flags"]
    assert not [f for f in cpu["flags"] if f.startswith("avx512") or "\r" in f]


def test_cpu_isa_in_a_vm_says_the_hypervisor_hides_it_not_that_the_cpu_lacks_it():
    facts = good_genoa_facts()
    facts["cpu"] = hw.parse_lscpu(fixture("lscpu--vm-xeon-gold-5117-24-sockets-hypervisor-no-avx512.txt"))
    check = by_id(hw.evaluate(facts, GENOA_4090))["cpu_isa"]
    assert check["status"] == "fail"
    assert "missing: avx2, avx512f" in check["observed"][-1]
    assert "Not visible in this VM" in check["remedy"]


def test_cpuinfo_flags_and_isa_summary():
    text = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_tile amx_int8\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    flags = hw.parse_cpuinfo_flags(text)
    assert flags == ["amx_int8", "amx_tile", "avx2", "avx512f", "fpu"]
    isa = hw.isa_summary(flags)
    assert isa["amx"] is True and isa["avx512f"] is True and isa["avx512_bf16"] is False


# ----------------------------------------------------------------------------------------- numactl

def test_numactl_dual_epyc_9375f_is_one_node_per_socket_and_balanced():
    numa = hw.parse_numactl(fixture("numactl--2x-epyc-9375f-smt-off-nps1.txt"))
    assert numa["node_count"] == 2 and numa["cpus"] == 64
    assert [len(n["cpus"]) for n in numa["nodes"].values()] == [32, 32]
    assert numa["remote_distances"] == [32]
    assert numa["memory_balanced"] is True and numa["memoryless_nodes"] == []
    assert 750 * 1024 < numa["nodes"][0]["size_mb"] < 760 * 1024


def test_numactl_threadripper_nps4_has_two_memoryless_nodes():
    numa = hw.parse_numactl(fixture("numactl--threadripper-3960x-nps4-memoryless-nodes.txt"))
    assert numa["node_count"] == 4 and numa["cpus"] == 48
    assert numa["memoryless_nodes"] == [0, 3]
    assert numa["memory_balanced"] is False
    # SMT on: CPU n and n+24 are siblings in the same node.
    assert numa["nodes"][0]["cpus"] == [0, 1, 2, 3, 4, 5, 24, 25, 26, 27, 28, 29]


def test_numactl_aws_c5n_is_two_nodes_with_intel_distance_and_ht():
    numa = hw.parse_numactl(fixture("numactl--aws-c5n-18xlarge-2x-xeon-8124m-ht-on.txt"))
    assert numa["node_count"] == 2 and numa["cpus"] == 72
    assert all(len(n["cpus"]) == 36 for n in numa["nodes"].values())  # 18 cores x 2 threads
    assert numa["remote_distances"] == [21]
    assert numa["nodes"][0]["free_mb"] < numa["nodes"][1]["free_mb"] / 1.5


def test_numactl_empty_output_has_no_nodes():
    assert hw.parse_numactl("")["node_count"] == 0


# --------------------------------------------------------------------------------------- dmidecode

def test_dmidecode_supermicro_24_of_24_ddr5_4800():
    mem = hw.parse_dmidecode_memory(fixture("dmidecode--2x-epyc-9654-as4125gs-24of24-ddr5-4800.txt"))
    assert (mem["slots_populated"], mem["slots_total"]) == (24, 24)
    assert mem["total_gb"] == 1536 and mem["types"] == ["DDR5"]
    assert mem["configured_speed_mts"] == 4800 and mem["rated_speed_mts"] == 4800
    assert mem["channels_populated"] == 24 and mem["channel_source"] == "labels"  # 12 per socket
    assert mem["dimms_per_channel"] == 1


def test_dmidecode_genoad12_9_of_12_channels_ignores_type_20_blocks():
    mem = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-9454p-genoad12-9of12-channels.txt"))
    assert (mem["slots_populated"], mem["slots_total"]) == (9, 12)
    assert (mem["channels_populated"], mem["channels_total"]) == (9, 12)
    empty = sorted(s["channel"][1] for s in mem["slots"] if not s["populated"])
    assert empty == ["F", "J", "L"]
    assert mem["configured_speed_mts"] == 4800 and mem["total_gb"] == 576
    assert mem["bandwidth_gbs"] == 345.6


def test_dmidecode_r7515_2_of_16_without_channel_labels_is_an_upper_bound():
    mem = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-7443p-r7515-2of16.txt"))
    assert (mem["slots_populated"], mem["slots_total"]) == (2, 16)
    assert [s["locator"] for s in mem["slots"] if s["populated"]] == ["A1", "A2"]
    assert mem["channels_populated"] == 2 and mem["channel_source"] == "dimm_count_upper_bound"
    assert mem["configured_speed_mts"] == 3200 and mem["types"] == ["DDR4"]


def test_dmidecode_b650d4u_two_dimms_per_channel_downclocked_to_3600():
    mem = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-4344p-b650d4u-2dpc-5600-at-3600.txt"))
    assert (mem["slots_populated"], mem["slots_total"]) == (4, 4)
    assert (mem["channels_populated"], mem["dimms_per_channel"]) == (2, 2)
    assert mem["rated_speed_mts"] == 5600 and mem["configured_speed_mts"] == 3600
    assert mem["bandwidth_gbs"] == 57.6


@pytest.mark.parametrize("name", ["own/dmidecode-t17--container-no-smbios.txt",
                                  "own/dmidecode-t17--no-type17-entries.txt"])
def test_dmidecode_without_dimm_entries_makes_memory_checks_warn_unknown(name):
    mem = hw.parse_dmidecode_memory(fixture(name))
    assert mem["slots_total"] == 0 and mem["channels_populated"] == 0 and mem["bandwidth_gbs"] is None
    facts = good_genoa_facts()
    facts["memory"] = mem
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    for check_id in ("memory_channels_populated", "memory_speed"):
        assert checks[check_id]["status"] == "warn"
        assert checks[check_id]["observed"] == "unknown"
        assert "dmidecode -t 17" in checks[check_id]["remedy"]


def test_dmidecode_unknown_speed_is_a_warning_not_a_pass():
    mem = hw.parse_dmidecode_memory(fixture("own/dmidecode-t17--qemu-default-unknown-speed.txt"))
    assert mem["slots_populated"] == 1 and mem["configured_speed_mts"] is None
    assert mem["slots"][0]["channel"] is None
    facts = good_genoa_facts()
    facts["memory"] = mem
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    assert checks["memory_speed"]["status"] == "warn" and checks["memory_speed"]["observed"] == "unknown"
    assert checks["memory_channels_populated"]["status"] == "fail"
    assert checks["memory_channels_populated"]["observed"].startswith("1/12 (at most")


def test_dimm_channel_labels():
    assert hw.dimm_channel("DIMM 0", "P0 CHANNEL A") == ("0", "A")
    assert hw.dimm_channel("P2-DIMMK1", "P1_Node0_ChannelA_Dimm0") == ("1", "A")
    assert hw.dimm_channel("P1-DIMMC1", "Not Specified") == ("1", "C")
    assert hw.dimm_channel("A1", "Not Specified") is None
    # scripts/twin (QEMU -smbios type 17) puts the channel in the device locator.
    assert hw.dimm_channel("P0 CHANNEL B", "BANK 1") == ("0", "B")


def test_theoretical_bandwidth_matches_the_brief():
    assert hw.theoretical_bandwidth_gbs(12, 4800) == 460.8
    assert hw.theoretical_bandwidth_gbs(8, 3200) == 204.8
    assert hw.theoretical_bandwidth_gbs(0, 4800) is None


# -------------------------------------------------------------------------------------- nvidia-smi

def test_nvidia_smi_table_four_rtx6000ada_idle():
    smi = hw.parse_nvidia_smi_table(fixture("nvidia-smi--4x-rtx6000ada-esc8000a-2x-epyc-9374f.txt"))
    gpus = smi["gpus"]
    assert [g["pci_address"] for g in gpus] == ["0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    assert all(g["model"] == "NVIDIA RTX 6000 Ada Gene..." for g in gpus)
    assert all(g["pstate"] == "P8" and g["vram_mib"] == 49140 for g in gpus)
    assert all(g["persistence_mode"] == "Off" for g in gpus)
    assert smi["driver_version"] == "575.51.03" and smi["processes"] == 0


def test_nvidia_smi_topo_numa_affinity_and_links():
    topo = hw.parse_nvidia_smi_topo(fixture("nvidia-smi-topo--4x-rtx6000ada-2x-epyc-9374f-nps1.txt"))
    assert sorted(topo) == ["GPU0", "GPU1", "GPU2", "GPU3"]  # NIC rows and legends skipped
    assert [topo[g]["numa_affinity"] for g in sorted(topo)] == [0, 0, 1, 1]
    assert topo["GPU0"]["cpu_affinity"] == "0-31" and topo["GPU3"]["cpu_affinity"] == "32-63"
    assert topo["GPU0"]["links"]["GPU1"] == "NODE" and topo["GPU0"]["links"]["GPU2"] == "SYS"
    assert topo["GPU2"]["links"]["NIC2"] == "NODE"


def test_nvidia_smi_csv_query():
    gpus = hw.parse_nvidia_smi_csv(fixture("own/nvidia-smi-query-csv--4090-5090.txt"))
    assert gpus == [
        {"pci_address": "0000:01:00.0", "model": "NVIDIA GeForce RTX 4090", "vram_mib": 24564, "pstate": "P8"},
        {"pci_address": "0000:81:00.0", "model": "NVIDIA GeForce RTX 5090", "vram_mib": 32607, "pstate": "P0"},
    ]


@pytest.mark.parametrize("text", ["", fixture("own/nvidia-smi--no-driver.txt")])
def test_nvidia_smi_absent_or_without_driver_yields_no_gpus(text):
    assert hw.parse_nvidia_smi_csv(text) == []
    assert hw.parse_nvidia_smi_table(text)["gpus"] == []


def test_gpu_seen_on_pci_without_driver_is_vram_unknown_warning():
    facts = good_genoa_facts()
    facts["gpus"][0]["vram_mib"] = None
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_vram"]
    assert check["status"] == "warn" and check["observed"] == "unknown"
    assert "nvidia-smi" in check["remedy"]


def test_no_gpu_when_one_is_expected_fails_gpu_present():
    facts = good_genoa_facts()
    facts["gpus"] = []
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    assert checks["gpu_present"]["status"] == "fail" and checks["gpu_present"]["observed"] == 0
    assert checks["gpu_present"]["expected"] == "1 x RTX 4090"
    assert checks["gpu_pcie_link"]["status"] == "warn"


def test_lab_profile_without_gpu_passes_the_gpu_checks():
    facts = good_genoa_facts()
    facts["gpus"] = []
    checks = by_id(hw.evaluate(facts, LAB))
    for check_id in ("gpu_present", "gpu_pcie_link", "gpu_vram", "gpu_numa_node"):
        assert checks[check_id]["status"] == "pass", check_id


def test_smaller_vram_than_the_profile_fails():
    facts = good_genoa_facts()
    facts["gpus"][0]["vram_mib"] = 16376
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_vram"]
    assert check["status"] == "fail" and check["observed"] == "16 GiB"


# --------------------------------------------------------------------------------------- PCIe link

def test_lspci_idle_gen1_is_speed_downgraded_width_ok():
    link = hw.parse_lspci_link(fixture("lspci-vv--rtx6000ada-idle-gen1-downgraded-esc8000a.txt"))
    assert (link["max_speed_gts"], link["max_width"]) == (16.0, 16)
    assert (link["current_speed_gts"], link["current_width"]) == (2.5, 16)
    assert link["speed_downgraded"] is True and link["width_downgraded"] is False
    assert link["numa_node"] == 0 and link["aspm"] == "Disabled"
    assert hw.pcie_gen(link["current_speed_gts"]) == 1 and hw.pcie_gen(link["max_speed_gts"]) == 4


def test_idle_gen1_link_is_only_a_warning():
    facts = good_genoa_facts()
    facts["gpus"][0]["link"] = hw.parse_lspci_link(fixture("lspci-vv--rtx6000ada-idle-gen1-downgraded-esc8000a.txt"))
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_pcie_link"]
    assert check["status"] == "warn"
    assert "x16/x16" in check["observed"] and "speed downgraded (idle?)" in check["observed"]
    assert "under load" in check["remedy"]


def test_width_downgraded_link_fails_and_numa_minus_one_is_read():
    link = hw.parse_lspci_link(fixture("own/lspci-vv--x8-width-downgraded-numa-minus1.txt"))
    assert (link["current_width"], link["max_width"], link["width_downgraded"]) == (8, 16, True)
    assert link["speed_downgraded"] is False and link["numa_node"] == -1
    facts = good_genoa_facts()
    facts["gpus"][0]["link"] = link
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_pcie_link"]
    assert check["status"] == "fail" and "width downgraded" in check["observed"]


def test_sysfs_link_values():
    link = hw.parse_sysfs_link("2.5 GT/s PCIe", "32.0 GT/s PCIe", "16", "16")
    assert link == {"current_speed_gts": 2.5, "max_speed_gts": 32.0, "current_width": 16, "max_width": 16}
    assert hw.parse_sysfs_link(None, None, None, None)["current_width"] is None


def test_gpu_numa_node_minus_one_warns_on_a_multi_node_box_only():
    facts = good_genoa_facts()
    facts["gpus"][0]["numa_node"] = -1
    assert by_id(hw.evaluate(facts, GENOA_4090))["gpu_numa_node"]["status"] == "pass"
    facts["cpu"]["numa_nodes"] = 4
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_numa_node"]
    assert check["status"] == "warn" and "node -1" in check["observed"]


def test_bdf_normalisation():
    assert hw.normalize_bdf("00000000:C1:00.0") == "0000:c1:00.0"
    assert hw.normalize_bdf("01:00.0") == "0000:01:00.0"


# ------------------------------------------------------------------------------ small /proc /sys

def test_bracketed_policy_and_thp():
    assert hw.parse_bracketed("default [performance] powersave powersupersave\n") == "performance"
    assert hw.parse_bracketed("always [madvise] never") == "madvise"
    assert hw.parse_bracketed(None) is None


@pytest.mark.parametrize("text,state", [
    ("SecureBoot enabled\n", "enabled"),
    ("SecureBoot disabled\nPlatform is in Setup Mode\n", "disabled"),
    ("EFI variables are not supported on this system\n", "not_efi"),
    ("", None),
])
def test_mokutil_sb_state(text, state):
    assert hw.parse_mokutil_sb_state(text) == state


def test_meminfo_total():
    assert hw.parse_meminfo_total_gb("MemTotal:       401123456 kB\nMemFree: 1 kB\n") == 382.5


def test_cpulist():
    assert hw.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]


# ----------------------------------------------------------------------------------- llama logs

def test_mainline_log_shows_numa_balancing_amx_and_512_threads():
    log = hw.parse_llama_log(fixture("llama-log--mainline-perplexity-2x-xeon-6980p-numa-balancing-amx.txt"))
    assert log["numa_balancing_warning"] is True
    assert (log["n_threads"], log["n_threads_batch"], log["total_threads"]) == (80, 80, 512)
    assert log["features"]["AVX512"] is True and log["features"]["AMX_INT8"] is True
    assert log["cuda_devices"] == []


def test_ik_log_shows_two_ada_gpus_smt_on_and_avx512_bf16():
    log = hw.parse_llama_log(fixture("llama-log--ik-server-epyc-9175f-2x-rtx6000ada-system-info.txt"))
    assert log["numa_balancing_warning"] is False
    assert [d["compute_capability"] for d in log["cuda_devices"]] == ["8.9", "8.9"]
    assert (log["n_threads"], log["total_threads"]) == (16, 32)  # 32 logical on 16 cores: SMT on
    assert log["features"]["AVX512"] and log["features"]["AVX512_BF16"] and log["features"]["AVX_VNNI"]


# ------------------------------------------------------------------------------------- evaluate

def test_every_listed_check_is_produced_once_with_all_fields():
    checks = hw.evaluate(good_genoa_facts(), GENOA_4090)
    assert [c["id"] for c in checks] == list(hw.CHECK_IDS)
    for check in checks:
        assert set(check) == {"id", "status", "observed", "expected", "why", "remedy"}
        assert check["status"] in ("pass", "warn", "fail") and check["why"] and check["remedy"]


def test_a_correct_genoa_node_passes_everything():
    checks = hw.evaluate(good_genoa_facts(), GENOA_4090)
    assert [c["id"] for c in checks if c["status"] != "pass"] == []
    summary = hw.summarize(checks)
    assert summary["fail"] == 0 and summary["pass"] == len(hw.CHECK_IDS)


def test_twin_fail_layout_fails_nps_smt_and_channels():
    """The layout of molecule/bios_checklist_fail: 4 CPUs, 4 nodes, 2 threads/core, 8 of 12 DIMMs."""
    facts = good_genoa_facts()
    facts["cpu"].update({"sockets": 1, "numa_nodes": 4, "threads_per_core": 2, "smt_active": True,
                         "hypervisor": True})
    facts["memory"] = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-9454p-genoad12-9of12-channels.txt"))
    facts["gpus"] = []
    checks = by_id(hw.evaluate(facts, LAB))
    assert checks["numa_nodes_per_socket"]["status"] == "fail" and checks["numa_nodes_per_socket"]["observed"] == 4
    assert checks["smt_disabled"]["status"] == "fail" and checks["smt_disabled"]["observed"] == "on"
    assert checks["memory_channels_populated"]["status"] == "fail"
    assert checks["memory_channels_populated"]["observed"] == "9/12"
    assert "NPS1" in checks["numa_nodes_per_socket"]["remedy"]
    assert "SMT Control = Disable" in checks["smt_disabled"]["remedy"]
    summary = hw.summarize(checks.values())
    assert summary["failed_ids"] == ["numa_nodes_per_socket", "smt_disabled", "memory_channels_populated"]


def test_milan_8_channels_at_3200_pass_with_the_milan_profile_and_fail_with_genoa():
    milan = copy.deepcopy(GENOA_4090)
    milan["memory"].update({"type": "DDR4", "channels_per_socket": 8, "min_speed_mts": 3200})
    facts = good_genoa_facts()
    facts["memory"].update({"channels_populated": 8, "channels_total": 8, "configured_speed_mts": 3200,
                            "rated_speed_mts": 3200, "bandwidth_gbs": 204.8})
    assert by_id(hw.evaluate(facts, milan))["memory_channels_populated"]["status"] == "pass"
    assert by_id(hw.evaluate(facts, milan))["memory_speed"]["observed"] == "3200 MT/s, 204.8 GB/s theoretical"
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    assert checks["memory_channels_populated"]["status"] == "fail"
    assert checks["memory_speed"]["status"] == "fail"


def test_numa_balancing_on_is_warn_when_kernel_tuning_follows_else_fail():
    facts = good_genoa_facts()
    facts["numa_balancing"] = 1
    assert by_id(hw.evaluate(facts, GENOA_4090))["numa_balancing_disabled"]["status"] == "warn"
    assert by_id(hw.evaluate(facts, GENOA_4090, numa_balancing_fixed_later=False))[
        "numa_balancing_disabled"]["status"] == "fail"
    facts["numa_balancing"] = None
    assert by_id(hw.evaluate(facts, GENOA_4090))["numa_balancing_disabled"]["status"] == "pass"
    facts["numa_balancing"] = "unknown"
    assert by_id(hw.evaluate(facts, GENOA_4090))["numa_balancing_disabled"]["status"] == "warn"


@pytest.mark.parametrize("policy,status", [("performance", "pass"), ("default", "warn"), ("powersave", "fail"),
                                           ("powersupersave", "fail"), (None, "warn")])
def test_pcie_aspm_policy(policy, status):
    facts = good_genoa_facts()
    facts["pcie_aspm_policy"] = policy
    check = by_id(hw.evaluate(facts, GENOA_4090))["pcie_aspm_policy"]
    assert check["status"] == status
    assert check["observed"] == (policy or "unknown")


@pytest.mark.parametrize("state,status", [("disabled", "pass"), ("not_efi", "pass"), ("enabled", "warn"),
                                          (None, "warn")])
def test_secure_boot(state, status):
    facts = good_genoa_facts()
    facts["secure_boot"] = state
    assert by_id(hw.evaluate(facts, GENOA_4090))["secure_boot"]["status"] == status


def test_missing_isa_fails_cpu_isa():
    facts = good_genoa_facts()
    facts["cpu"] = hw.parse_lscpu(fixture("lscpu--1x-epyc-7502p-smt-on-nps1.txt"))
    check = by_id(hw.evaluate(facts, GENOA_4090))["cpu_isa"]
    assert check["status"] == "fail"
    assert check["observed"][-1] == "missing: avx512f, avx512_vnni, avx512_bf16, avx512vbmi"


def test_unknown_topology_is_a_warning_not_a_pass():
    facts = good_genoa_facts()
    facts["cpu"] = {"flags": []}
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    for check_id in ("numa_nodes_per_socket", "smt_disabled", "cpu_isa"):
        assert checks[check_id]["status"] == "warn" and checks[check_id]["observed"] == "unknown", check_id


def test_low_disk_space_warns_and_unknown_disk_warns():
    facts = good_genoa_facts()
    facts["models_disk"]["free_gb"] = 100
    check = by_id(hw.evaluate(facts, GENOA_4090))["model_disk_space"]
    assert check["status"] == "warn" and check["observed"] == "100 GB free on /srv/models"
    facts["models_disk"] = {}
    assert by_id(hw.evaluate(facts, GENOA_4090))["model_disk_space"]["observed"] == "unknown"


def test_waived_failure_becomes_a_marked_warning():
    facts = good_genoa_facts()
    facts["cpu"]["smt_active"] = True
    checks = hw.apply_waivers(hw.evaluate(facts, GENOA_4090), ["smt_disabled", "cpu_isa"])
    smt = by_id(checks)["smt_disabled"]
    assert smt["status"] == "warn" and smt["waived"] is True
    assert "waived" not in by_id(checks)["cpu_isa"]  # cpu_isa passed: nothing to waive
    assert hw.summarize(checks)["failed_ids"] == []


def test_reports_render_every_check_and_the_remedies():
    facts = good_genoa_facts()
    facts["cpu"]["smt_active"] = True
    checks = hw.evaluate(facts, GENOA_4090)
    summary = hw.summarize(checks)
    table = hw.render_table(checks)
    assert table.splitlines()[0].split() == ["STATUS", "CHECK", "OBSERVED", "EXPECTED"]
    assert len([line for line in table.splitlines() if line.startswith(("PASS", "WARN", "FAIL"))]) == len(checks)
    assert "smt_disabled (fail): BIOS:" in table
    assert max(len(line.split("  ")[0]) for line in table.splitlines()[:len(checks) + 1]) <= len("STATUS")
    md = hw.render_markdown("epyc-node", checks, facts, summary)
    assert md.startswith("<!--") and "# Preflight report: epyc-node" in md
    assert "| fail | smt_disabled | on | off |" in md
    assert "12 pass, 0 warn, 1 fail: smt_disabled" in md
    json.dumps({"checks": checks, "facts": facts})  # the report must serialise


def test_cpu_without_any_listed_isa_passes_an_empty_requirement_and_says_so():
    facts = good_genoa_facts()
    facts["cpu"]["flags"] = ["fpu", "sse4_2", "popcnt"]  # what a QEMU Nehalem vCPU shows
    check = by_id(hw.evaluate(facts, LAB))["cpu_isa"]
    assert check["status"] == "pass" and check["observed"] == ["no AVX2/AVX-512/AMX flags visible"]


def test_table_cuts_long_observed_values_but_the_check_keeps_them():
    facts = good_genoa_facts()
    facts["memory"]["channel_source"] = "dimm_count_upper_bound"
    checks = hw.evaluate(facts, GENOA_4090)
    observed = by_id(checks)["memory_channels_populated"]["observed"]
    assert observed == "12/12 (at most; DIMM labels do not name channels)"
    row = [line for line in hw.render_table(checks).splitlines() if "memory_channels_populated" in line][0]
    assert "12/12 (at most; DIMM labels do no..." in row
