"""Unit tests for plugins/module_utils/hmk_hardware.py, the one hardware parser and judge of the kit.

Every real output in tests/fixtures/hardware/ (see INDEX.md there: source, machine, what a parser must
conclude) is asserted twice: the facts the output shows, and the verdict the kit reaches on them. The odd cases
made for the tests live in tests/fixtures/hardware/own/.
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
MILAN_4090 = {
    "name": "milan-4x4090",
    "cpu": {"sockets": 1, "smt": False, "numa_nodes_per_socket": 1, "isa_required": ["avx2", "fma"]},
    "memory": {"type": "DDR4", "channels_per_socket": 8, "dimms_per_socket": 8, "min_speed_mts": 3200},
    "gpus": {"count": 4, "model": "RTX 4090", "arch": "89", "vram_gib": 24, "min_link_width": 16},
    "models_path": "/srv/models",
    "models_min_free_gb": 420,
}
LAB = {
    "name": "lab-twin",
    "platform": "bare_metal",
    "cpu": {"sockets": 1, "smt": False, "numa_nodes_per_socket": 1, "isa_required": []},
    "memory": {"type": "DDR5", "channels_per_socket": 12, "dimms_per_socket": 12, "min_speed_mts": 4800},
    "gpus": {"count": 0},
    "models_path": "/srv/models",
    "models_min_free_gb": 1,
}
# A profile that only states the layout wanted on any box (what the judges read of a profile).
ANY = {"cpu": {"numa_nodes_per_socket": 1, "smt": False}, "gpus": {"count": 0}}


def lscpu_cpu(name):
    cpu = hw.parse_lscpu(fixture(name))
    cpu["generation"] = hw.cpu_generation(cpu["vendor"], cpu["family"], cpu["model_number"], cpu["model"])
    if hw.known(cpu["threads_per_core"]):
        cpu["smt_active"] = cpu["threads_per_core"] > 1
    return cpu


def numactl_nodes(name):
    return {"source": "numactl", "nodes": hw.parse_numactl(fixture(name))["nodes"]}


def first_socket_dimms():
    """The first socket's 12 DIMMs of the HPE Cray XD665 (all channels, DDR5-4800): a good single-socket table."""
    text = fixture("dmidecode--2x-epyc-9354-hpe-cray-xd665-24of24-p1-channel-labels.txt")
    records = text.split("\n\n")
    return "\n\n".join(r for r in records if "DMI type 17" not in r or "Bank Locator: P1 CHANNEL" in r)


def good_genoa_facts():
    """Facts of a correctly set up single-socket Genoa + RTX 4090 node; tests break one thing at a time."""
    cpu = lscpu_cpu("lscpu--2x-epyc-9374f-esc8000a-smt-off-nps1-avx512.txt")
    cpu.update({"sockets": 1, "numa_nodes": 1, "smt_active": False})
    return {
        "platform": hw.detect_platform(cpu, {"sys_vendor": "ASUSTeK COMPUTER INC.", "product_name": "ESC8000A-E12"}),
        "cpu": cpu,
        "numa": {"source": "sysfs", "nodes": {0: {"cpus": "0-31", "size_mb": 386000, "packages": [0]}}},
        "memory": hw.parse_dmidecode_memory(first_socket_dimms(), 12),
        "numa_balancing": 0,
        "pcie_aspm_policy": "performance",
        "cmdline": hw.parse_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro pcie_aspm.policy=performance"),
        "secure_boot": "disabled",
        "gpus": [{"pci_address": "0000:01:00.0", "model": "NVIDIA GeForce RTX 4090", "vram_mib": 24564,
                  "numa_node": 0, "driver": "nvidia",
                  "link": hw.parse_sysfs_link("16.0 GT/s PCIe", "16.0 GT/s PCIe", "16", "16")}],
        "models_disk": {"path": "/srv/models", "checked_path": "/srv/models", "free_gb": 1800},
        "transparent_hugepages": "madvise",
    }


def by_id(checks):
    return dict((c["id"], c) for c in checks)


def statuses(facts, profile, *ids):
    checks = by_id(hw.evaluate(facts, profile))
    return tuple(checks[i]["status"] for i in ids)


# --------------------------------------------------------------------------- the unknown marker

def test_unknown_marker_is_never_a_bare_none_and_is_not_a_known_value():
    marker = hw.unknown("no Flags line")
    assert marker == {"unknown": "no Flags line"} and hw.is_unknown(marker) and not hw.known(marker)
    assert hw.why_unknown(marker) == "no Flags line"
    assert hw.known(0) and hw.known([]) and hw.known(False) and not hw.known(None)


def test_empty_outputs_give_unknown_markers_with_reasons_never_empty_values():
    cpu = hw.parse_lscpu("")
    assert all(hw.is_unknown(v) for v in cpu.values())
    assert hw.is_unknown(hw.parse_cpuinfo("")["flags"])
    assert hw.is_unknown(hw.isa_summary(cpu["flags"]))  # "no AVX-512" can never be read out of nothing
    assert hw.is_unknown(hw.parse_numactl("")["node_count"])
    memory = hw.parse_dmidecode_memory("")
    assert hw.is_unknown(memory["channels_populated"]) and hw.is_unknown(memory["configured_speed_mts"])
    assert hw.is_unknown(memory["bandwidth_gbs"])
    assert hw.is_unknown(hw.parse_nvidia_smi_table("")["driver_version"])
    assert hw.parse_lspci("") == {}
    assert hw.is_unknown(hw.parse_bracketed(None)) and hw.is_unknown(hw.parse_mokutil_sb_state(""))
    assert hw.is_unknown(hw.parse_meminfo_total_gb("")) and hw.is_unknown(hw.parse_cmdline("")["line"])
    log = hw.parse_llama_log("")
    assert hw.is_unknown(log["features"]) and hw.is_unknown(log["n_threads"]) and hw.is_unknown(log["cuda_devices"])


def test_cpulist_forms():
    assert hw.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert hw.parse_cpulist("0 1 2 3") == [0, 1, 2, 3]
    assert hw.parse_cpulist("0-15, 32-47 (32)") == list(range(16)) + list(range(32, 48))  # numactl --cpu-compress
    assert hw.parse_cpulist("") == [] and hw.parse_cpulist(" (0)") == []
    with pytest.raises(ValueError):
        hw.parse_cpulist("0-3,x")


# ------------------------------------------------------------------------------------------ lscpu

def test_lscpu_single_epyc_7502p_rome_nps1_smt_on_no_avx512():
    cpu = lscpu_cpu("lscpu--1x-epyc-7502p-smt-on-nps1.txt")
    assert (cpu["sockets"], cpu["numa_nodes"], cpu["threads_per_core"]) == (1, 1, 2)
    assert cpu["physical_cores"] == 32 and cpu["cpus"] == 64
    assert cpu["generation"]["key"] == "rome" and cpu["generation"]["channels_per_socket"] == 8
    assert "avx2" in cpu["flags"] and not [f for f in cpu["flags"] if f.startswith("avx512")]
    facts = {"cpu": cpu}
    assert statuses(facts, ANY, "platform", "numa_nodes_per_socket", "smt_disabled") == ("pass", "pass", "fail")
    isa = by_id(hw.evaluate(facts, GENOA_4090))["cpu_isa"]
    assert isa["status"] == "fail" and isa["observed"][-1] == "missing: avx512f, avx512_vnni, avx512_bf16, avx512vbmi"


def test_lscpu_dual_epyc_7742_rome_is_nps4_with_16_cores_per_node():
    cpu = lscpu_cpu("lscpu--2x-epyc-7742-smt-on-nps4-8nodes.txt")
    assert (cpu["sockets"], cpu["numa_nodes"], cpu["threads_per_core"]) == (2, 8, 2)
    assert len(cpu["numa_node_cpus"]) == 8 and all(len(c) == 32 for c in cpu["numa_node_cpus"].values())
    nps = hw.judge_nps({"cpu": cpu}, ANY)
    assert (nps["verdict"], nps["observed"], nps["basis"]) == ("bad", 4, "8 node(s) with CPUs on 2 socket(s)")
    assert "NUMA nodes per socket = NPS1" in nps["fix"]


def test_lscpu_nested_layout_genoa_joins_flags_wrapped_mid_word():
    cpu = lscpu_cpu("lscpu--2x-epyc-9374f-esc8000a-smt-off-nps1-avx512.txt")
    assert cpu["model"] == "AMD EPYC 9374F 32-Core Processor" and cpu["generation"]["key"] == "genoa"
    assert (cpu["sockets"], cpu["numa_nodes"], cpu["threads_per_core"]) == (2, 2, 1)
    flags = set(cpu["flags"])
    assert {"avx512f", "avx512_bf16", "avx512_vnni", "avx512vbmi", "avx2"} <= flags
    # Wrapped as "a" / "md_lbr_v2", "hw_ps" / "tate", "f" / "srm", "cmp_l" / "egacy".
    assert {"amd_lbr_v2", "hw_pstate", "fsrm", "cmp_legacy", "clwb"} <= flags
    assert not flags & {"a", "md_lbr_v2", "hw_ps", "tate", "f", "srm", "cmp_l", "egacy"}
    assert cpu["hypervisor"] is False
    assert statuses({"cpu": cpu}, dict(GENOA_4090, cpu=dict(GENOA_4090["cpu"], sockets=2)),
                    "numa_nodes_per_socket", "smt_disabled", "cpu_isa") == ("pass", "pass", "pass")


def test_lscpu_naples_single_socket_four_dies_is_the_die_layout_not_a_bios_fix():
    cpu = lscpu_cpu("lscpu--1x-epyc-7501-naples-4-dies-4-nodes.txt")
    assert (cpu["family"], cpu["model_number"], cpu["generation"]["key"]) == (23, 1, "naples")
    assert (cpu["sockets"], cpu["numa_nodes"]) == (1, 4)
    assert cpu["numa_node_cpus"][0] == list(range(8)) + list(range(32, 40))
    check = by_id(hw.evaluate({"cpu": cpu}, MILAN_4090))["numa_nodes_per_socket"]
    assert check["status"] == "warn" and check["observed"] == 4  # not a failure with a BIOS fix that does not exist
    assert "Naples" in check["why"] and "NUMA nodes per socket = NPS" not in check["remedy"]
    assert "--numa distribute" in check["remedy"]


def test_lscpu_naples_dual_socket_interleaved_cpu_numbering():
    cpu = lscpu_cpu("lscpu--2x-epyc-7601-naples-8-nodes-interleaved-cpus.txt")
    assert (cpu["sockets"], cpu["numa_nodes"], cpu["generation"]["key"]) == (2, 8, "naples")
    assert cpu["numa_node_cpus"][4][:3] == [1, 9, 17]  # every 8th CPU: the firmware's die interleave
    verdict = hw.judge_nps({"cpu": cpu}, ANY)
    assert (verdict["verdict"], verdict["observed"]) == ("minor", 4)


def test_lscpu_vm_with_crlf_reports_hypervisor_24_sockets_and_no_visible_avx512():
    cpu = lscpu_cpu("lscpu--vm-xeon-gold-5117-24-sockets-hypervisor-no-avx512.txt")
    assert cpu["hypervisor"] is True
    assert cpu["sockets"] == 24 and cpu["cores_per_socket"] == 1 and cpu["threads_per_core"] == 1
    assert hw.is_unknown(cpu["numa_nodes"])  # the pasted output stops before the NUMA lines
    assert "pcid" in cpu["flags"] and "cid" not in cpu["flags"] and "p" not in cpu["flags"]
    assert not [f for f in cpu["flags"] if f.startswith("avx512") or "\r" in f]
    assert cpu["generation"]["key"] == "skylake_sp"
    facts = {"cpu": cpu, "platform": hw.detect_platform(cpu)}
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    # A hypervisor's 24 sockets never yield "NPS below 1": the BIOS checks say they do not apply.
    assert checks["platform"]["status"] == "warn" and "virtual machine" in checks["platform"]["observed"]
    assert checks["numa_nodes_per_socket"]["status"] == "warn"
    assert checks["numa_nodes_per_socket"]["observed"].startswith("not visible in a virtual machine")
    assert checks["smt_disabled"]["status"] == "warn" and checks["memory_channels_populated"]["status"] == "warn"
    assert checks["cpu_isa"]["status"] == "fail" and "Not visible in this VM" in checks["cpu_isa"]["remedy"]
    assert "missing: avx2, avx512f" in checks["cpu_isa"]["observed"][-1]


def test_lscpu_xen_vm_with_112_threads_per_core_is_not_judged_as_smt():
    cpu = lscpu_cpu("lscpu--xen-vm-xeon-platinum-8280-112-threads-per-core.txt")
    assert (cpu["hypervisor"], cpu["hypervisor_vendor"], cpu["threads_per_core"]) == (True, "Xen", 112)
    assert cpu["cores_per_socket"] == 1 and cpu["physical_cores"] == 1
    platform = hw.detect_platform(cpu)
    assert platform["kind"] == "virtual" and platform["evidence"] == ["CPU hypervisor flag (Xen)"]
    smt = by_id(hw.evaluate({"cpu": cpu, "platform": platform}, ANY))["smt_disabled"]
    assert smt["status"] == "warn" and "112 thread(s) per core" in smt["observed"]


def test_lscpu_gh200_numa_section_counts_one_node_with_cpus():
    cpu = hw.parse_lscpu(fixture("lscpu-numa--gh200-9-nodes-1-with-cpus.txt"))
    assert cpu["numa_nodes"] == 9 and cpu["numa_node_cpus"][0] == list(range(72))
    assert [n for n, cpus in cpu["numa_node_cpus"].items() if cpus] == [0]
    assert hw.is_unknown(cpu["sockets"]) and hw.is_unknown(cpu["flags"])
    facts = {"cpu": dict(cpu, sockets=1)}  # one Grace per module
    nps = hw.judge_nps(facts, ANY)
    assert (nps["verdict"], nps["observed"]) == ("ok", 1)  # the 8 GPU-memory nodes are not NPS nodes
    assert hw.judge_memory_only_nodes(facts, ANY)["verdict"] == "unknown"  # lscpu does not show node memory


def test_lscpu_and_numactl_ampere_arm64_with_range_cpu_lists():
    text = fixture("lscpu-numactl--2x-ampere-neoverse-n1-arm64-ranges.txt")
    cpu = hw.parse_lscpu(text.split("HOST $ numactl")[0])
    assert (cpu["vendor"], cpu["model"], cpu["sockets"], cpu["threads_per_core"]) == ("ARM", "Neoverse-N1", 2, 1)
    assert hw.is_unknown(cpu["family"]) and "asimd" in cpu["flags"]
    numa = hw.parse_numactl(text)
    assert numa["node_count"] == 2 and numa["nodes"][1]["cpus"] == list(range(64, 128))
    assert (numa["nodes"][0]["size_mb"], numa["nodes"][0]["free_mb"]) == (257730, 1447)
    facts = {"cpu": cpu, "numa": {"nodes": numa["nodes"]}}
    assert statuses(facts, ANY, "numa_nodes_per_socket", "numa_memory_placement", "smt_disabled") == (
        "pass", "pass", "pass")
    assert hw.judge_cpu_isa(facts, GENOA_4090)["verdict"] == "bad"  # no x86 AVX on an Arm box


def test_cpuinfo_identity_flags_and_sockets():
    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC 9554P 64-Core Processor\nphysical id\t: 0\ncore id\t\t: 0\n"
            "flags\t\t: fpu avx2 avx512f amx_tile\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t\t: 1\nflags\t\t: fpu\n")
    info = hw.parse_cpuinfo(text)
    assert (info["vendor"], info["family"], info["model_number"]) == ("AuthenticAMD", 25, 17)
    assert info["flags"] == ["amx_tile", "avx2", "avx512f", "fpu"] and info["topology"][1] == {"package": 0, "core": 1}
    assert hw.cpu_generation(info["vendor"], 25, 17, info["model"])["key"] == "genoa"
    isa = hw.isa_summary(info["flags"])
    assert isa["amx"] is True and isa["avx512f"] is True and isa["avx512_bf16"] is False


@pytest.mark.parametrize("vendor, family, model, key, channels", [
    ("AuthenticAMD", 23, 1, "naples", 8), ("AuthenticAMD", 23, 49, "rome", 8), ("AuthenticAMD", 25, 1, "milan", 8),
    ("AuthenticAMD", 25, 17, "genoa", 12), ("AuthenticAMD", 26, 2, "turin", 12), ("AuthenticAMD", 25, 97, "am5", 2),
    ("GenuineIntel", 6, 143, "sapphire_rapids", 8), ("GenuineIntel", 6, 173, "granite_rapids", 12),
])
def test_cpu_generations(vendor, family, model, key, channels):
    generation = hw.cpu_generation(vendor, family, model)
    assert (generation["key"], generation["channels_per_socket"]) == (key, channels)


def test_unknown_cpu_generation_says_why():
    generation = hw.cpu_generation("AuthenticAMD", 25, 33)
    assert generation["key"] == "amd_other" and hw.is_unknown(generation["channels_per_socket"])
    assert hw.cpu_generation(hw.unknown("x"), hw.unknown("x"), 1)["key"] == "unknown"


# ----------------------------------------------------------------------------------------- numactl

def test_numactl_dual_epyc_9375f_is_one_node_per_socket_and_balanced():
    numa = hw.parse_numactl(fixture("numactl--2x-epyc-9375f-smt-off-nps1.txt"))
    assert numa["node_count"] == 2 and [len(n["cpus"]) for n in numa["nodes"].values()] == [32, 32]
    assert numa["remote_distances"] == [32] and 750 * 1024 < numa["nodes"][0]["size_mb"] < 760 * 1024
    facts = {"cpu": {"sockets": 2, "threads_per_core": 1, "smt_active": False}, "numa": {"nodes": numa["nodes"]}}
    assert statuses(facts, ANY, "numa_nodes_per_socket", "numa_memory_only_nodes", "numa_memoryless_cpu_nodes",
                    "numa_memory_placement", "smt_disabled") == ("pass", "pass", "pass", "pass", "pass")


def test_numactl_threadripper_nps4_has_two_memoryless_cpu_nodes():
    numa = hw.parse_numactl(fixture("numactl--threadripper-3960x-nps4-memoryless-nodes.txt"))
    assert numa["node_count"] == 4
    assert numa["nodes"][0]["cpus"] == [0, 1, 2, 3, 4, 5, 24, 25, 26, 27, 28, 29]  # SMT siblings n and n+24
    facts = {"cpu": {"sockets": 1}, "numa": {"nodes": numa["nodes"]}}
    checks = by_id(hw.evaluate(facts, ANY))
    assert (checks["numa_nodes_per_socket"]["status"], checks["numa_nodes_per_socket"]["observed"]) == ("fail", 4)
    less = checks["numa_memoryless_cpu_nodes"]
    assert less["status"] == "fail"
    assert less["observed"] == "node 0 (CPUs 0-5,24-29, 0 MB), node 3 (CPUs 18-23,42-47, 0 MB)"
    assert checks["numa_memory_placement"]["status"] == "warn"  # 0 / 62.8 / 63.0 / 0 GB


def test_numactl_intel_node_without_memory_is_its_own_finding():
    numa = hw.parse_numactl(fixture("numactl--2x-xeon-node1-memoryless-cpu-node.txt"))
    facts = {"cpu": {"sockets": 2}, "numa": {"nodes": numa["nodes"]}}
    checks = by_id(hw.evaluate(facts, ANY))
    assert checks["numa_nodes_per_socket"]["status"] == "pass"  # one node per socket
    assert checks["numa_memoryless_cpu_nodes"]["status"] == "fail"
    assert checks["numa_memoryless_cpu_nodes"]["observed"].startswith("node 1 (CPUs 1,3,5,")
    assert numa["remote_distances"] == [20]


def test_numactl_aws_c5n_is_two_nodes_with_intel_distance_and_ht():
    numa = hw.parse_numactl(fixture("numactl--aws-c5n-18xlarge-2x-xeon-8124m-ht-on.txt"))
    assert numa["node_count"] == 2 and all(len(n["cpus"]) == 36 for n in numa["nodes"].values())
    assert numa["remote_distances"] == [21]
    assert numa["nodes"][0]["free_mb"] < numa["nodes"][1]["free_mb"] / 1.5
    facts = {"cpu": {"sockets": 2}, "numa": {"nodes": numa["nodes"]}}
    assert statuses(facts, ANY, "numa_nodes_per_socket", "numa_memory_placement") == ("pass", "pass")


def test_numactl_aurora_xeon_max_hbm_flat_memory_only_nodes_are_not_nps_nodes():
    numa = hw.parse_numactl(fixture("numactl--aurora-2x-xeon-max-9470c-hbm-flat-memory-only-nodes.txt"))
    assert numa["node_count"] == 4 and numa["nodes"][2]["cpus"] == [] and numa["nodes"][2]["size_mb"] == 65536
    assert len(numa["nodes"][0]["cpus"]) == 104
    facts = {"cpu": {"sockets": 2, "vendor": "GenuineIntel", "family": 6, "model_number": 143},
             "numa": {"nodes": numa["nodes"]}}
    checks = by_id(hw.evaluate(facts, ANY))
    assert (checks["numa_nodes_per_socket"]["status"], checks["numa_nodes_per_socket"]["observed"]) == ("pass", 1)
    only = checks["numa_memory_only_nodes"]
    assert only["status"] == "warn" and only["observed"] == "node 2: 64.0 GB, no CPU, node 3: 64.0 GB, no CPU"
    assert "--membind=0,1" in only["remedy"]
    assert checks["numa_memory_placement"]["status"] == "pass"  # 503.4 vs 502.9 GB on the CPU nodes


def test_numactl_xeon_max_snc4_with_hbm_nodes_is_sub_numa_clustering():
    numa = hw.parse_numactl(fixture("numactl--2x-xeon-max-snc4-hbm-flat-16-nodes-trimmed.txt"))
    assert numa["node_count"] == 10  # trimmed after node 9 of 16
    facts = {"cpu": {"sockets": 2, "vendor": "GenuineIntel", "family": 6, "model_number": 143},
             "numa": {"nodes": numa["nodes"]}}
    nps = hw.judge_nps(facts, ANY)
    assert (nps["verdict"], nps["observed"]) == ("bad", 4)
    assert "SNC" in nps["fix"] and "AMD CBS" not in nps["fix"]
    assert [n["node"] for n in hw.judge_memory_only_nodes(facts, ANY)["nodes"]] == [8, 9]


def test_numactl_compressed_and_range_formats():
    text = fixture("own/numactl--cpu-compress-format.txt")
    numa = hw.parse_numactl(text)
    assert numa["nodes"][0]["cpus"] == list(range(16)) + list(range(32, 48))
    assert numa["nodes"][2]["cpus"] == [] and numa["nodes"][2]["size_mb"] == 131072
    assert hw.is_unknown(numa["nodes"][3]["size_mb"])  # "<not available>"
    facts = {"cpu": {"sockets": 1}, "numa": {"nodes": numa["nodes"]}}
    assert hw.judge_nps(facts, ANY)["observed"] == 2


def test_sysfs_nodes_with_packages_judge_nps_per_socket():
    nodes = {"0": {"cpus": "0-15", "size_mb": 100, "packages": [0]}, "1": {"cpus": "16-31", "size_mb": 100,
                                                                           "packages": [0]},
             "2": {"cpus": "32-63", "size_mb": 200, "packages": [1]}, "3": {"cpus": "", "size_mb": 512,
                                                                            "packages": []}}
    layout = hw.numa_layout(nodes)
    assert layout["per_socket"] == {"0": [0, 1], "1": [2]} and layout["memory_only"] == [{"node": 3, "size_mb": 512}]
    verdict = hw.judge_nps({"cpu": {"sockets": 2}, "numa": {"nodes": nodes}}, ANY)
    assert verdict["verdict"] == "bad" and "sockets differ" in verdict["observed"]


# --------------------------------------------------------------------------------------- dmidecode

def memory_check(name, profile, channels=None, cpu=None):
    per_socket = channels or (profile.get("memory") or {}).get("channels_per_socket")
    memory = hw.parse_dmidecode_memory(fixture(name), per_socket)
    facts = {"memory": memory, "cpu": cpu or {"sockets": (profile.get("cpu") or {}).get("sockets", 1)}}
    return memory, by_id(hw.evaluate(facts, profile))


def two_socket(profile):
    profile = copy.deepcopy(profile)
    profile["cpu"]["sockets"] = 2
    return profile


def test_dmidecode_supermicro_24_of_24_ddr5_4800():
    memory, checks = memory_check("dmidecode--2x-epyc-9654-as4125gs-24of24-ddr5-4800.txt", two_socket(GENOA_4090))
    assert (memory["slots_populated"], memory["slots_total"], memory["total_gb"]) == (24, 24, 1536)
    assert memory["configured_speed_mts"] == 4800 and memory["rated_speed_mts"] == 4800
    assert (memory["channels_populated"], memory["channel_source"], memory["dimms_per_channel"]) == (24, "labels", 1)
    assert checks["memory_channels_populated"]["status"] == "pass"
    assert checks["memory_channels_populated"]["observed"] == "24/24"
    assert checks["memory_speed"]["observed"] == "4800 MT/s, 921.6 GB/s theoretical"


def test_dmidecode_genoad12_9_of_12_channels_fails():
    memory, checks = memory_check("dmidecode--1x-epyc-9454p-genoad12-9of12-channels.txt", GENOA_4090)
    assert (memory["slots_populated"], memory["slots_total"], memory["channels_populated"]) == (9, 12, 9)
    assert sorted(s["channel"][1] for s in memory["slots"] if not s["populated"]) == ["F", "J", "L"]
    assert memory["bandwidth_gbs"] == 345.6
    assert (checks["memory_channels_populated"]["status"], checks["memory_channels_populated"]["observed"]) == (
        "fail", "9/12")


def test_dmidecode_dell_r7515_2_of_16_slots_fails_on_the_upper_bound():
    memory, checks = memory_check("dmidecode--1x-epyc-7443p-r7515-2of16.txt", MILAN_4090)
    assert [s["locator"] for s in memory["slots"] if s["populated"]] == ["A1", "A2"]
    assert hw.is_unknown(memory["channels_populated"]) and memory["channels_upper_bound"] == 2
    assert "Dell" in hw.why_unknown(memory["channels_populated"])
    check = checks["memory_channels_populated"]
    assert check["status"] == "fail" and check["observed"].startswith("at most 2/8")


def test_dmidecode_dell_r7525_4_per_socket_of_16_slots_fails_even_without_channel_labels():
    memory, checks = memory_check("dmidecode--2x-epyc-7352-dell-r7525-4of16-per-socket.txt", two_socket(MILAN_4090))
    assert [s["socket"] for s in memory["slots"] if s["populated"]] == ["1"] * 4 + ["2"] * 4  # A = CPU1, B = CPU2
    assert memory["channels_upper_bound"] == 8
    assert checks["memory_channels_populated"]["status"] == "fail"  # 8 DIMMs cannot fill 16 channels


def test_dmidecode_dell_r7525_counted_against_a_profile_it_could_fill_is_unknown_not_pass():
    profile = two_socket(MILAN_4090)
    profile["memory"]["channels_per_socket"] = 4  # what a 4-channel expectation would allow
    memory, checks = memory_check("dmidecode--2x-epyc-7352-dell-r7525-4of16-per-socket.txt", profile)
    check = checks["memory_channels_populated"]
    assert check["status"] == "warn" and "channels unknown" in check["observed"]
    assert "two DIMMs per channel on half the channels" in check["remedy"]


def test_dmidecode_dell_r7625_one_slot_per_channel_is_counted_exactly():
    memory, checks = memory_check("dmidecode--2x-epyc-9534-dell-r7625-4of12-per-socket.txt", two_socket(GENOA_4090))
    assert memory["channels_populated"] == 8 and memory["channel_source"].startswith("slot count")
    assert hw.parse_dmi_system(fixture("dmidecode--2x-epyc-9534-dell-r7625-4of12-per-socket.txt")) == {
        "sys_vendor": "Dell Inc.", "product_name": "PowerEdge R7625"}
    assert (checks["memory_channels_populated"]["status"], checks["memory_channels_populated"]["observed"]) == (
        "fail", "8/24")


def test_dmidecode_hpe_dl385_proc_dimm_labels_4_of_16_fail():
    memory, checks = memory_check("dmidecode--2x-epyc-7502-hpe-dl385g10p-4of16-per-socket.txt", two_socket(MILAN_4090))
    assert [s["locator"] for s in memory["slots"] if s["populated"]][:4] == [
        "PROC 1 DIMM 1", "PROC 1 DIMM 3", "PROC 1 DIMM 14", "PROC 1 DIMM 16"]
    assert hw.is_unknown(memory["channels_populated"]) and "HPE" in hw.why_unknown(memory["channels_populated"])
    assert checks["memory_channels_populated"]["status"] == "fail"


def test_dmidecode_hpe_dl385_all_32_slots_is_every_channel_with_two_dimms_each():
    memory, checks = memory_check("dmidecode--2x-epyc-7763-hpe-dl385g10p-v2-32of32-2dpc.txt", two_socket(MILAN_4090))
    assert (memory["channels_populated"], memory["dimms_per_channel"]) == (16, 2)
    assert checks["memory_channels_populated"]["status"] == "pass"
    assert checks["memory_channels_populated"]["observed"] == "16/16 (2 DIMMs per channel)"
    assert checks["memory_speed"]["status"] == "pass"  # 3200 at 2DPC on this board


def test_dmidecode_hpe_cray_xd665_channel_labels_numbered_from_p1():
    memory, checks = memory_check("dmidecode--2x-epyc-9354-hpe-cray-xd665-24of24-p1-channel-labels.txt",
                                  two_socket(GENOA_4090))
    assert memory["sockets_seen"] == ["1", "2"] and memory["channels_populated"] == 24
    assert checks["memory_channels_populated"]["status"] == "pass"


def test_dmidecode_gigabyte_dimm_p0_a1_second_slot_of_each_channel():
    memory, checks = memory_check("dmidecode--2x-epyc-7302-gigabyte-g482-z54-dimm1-of-2dpc.txt",
                                  two_socket(MILAN_4090))
    populated = [s for s in memory["slots"] if s["populated"]]
    assert {s["dimm"] for s in populated} == {1} and populated[0]["convention"].startswith("Gigabyte")
    assert (memory["channels_populated"], memory["channels_total"], memory["dimms_per_channel"]) == (16, 16, 1)
    assert checks["memory_channels_populated"]["status"] == "pass"


def test_dmidecode_gigabyte_g242_single_socket_8_of_8():
    memory, checks = memory_check("dmidecode--1x-epyc-7742-gigabyte-g242-z11-8of8.txt", MILAN_4090)
    assert (memory["channels_populated"], memory["configured_speed_mts"], memory["bandwidth_gbs"]) == (8, 3200, 204.8)
    assert checks["memory_channels_populated"]["status"] == "pass" and checks["memory_speed"]["status"] == "pass"


def test_dmidecode_asus_krpa_two_dimms_per_channel_at_2933():
    memory, checks = memory_check("dmidecode--1x-epyc-7502p-asus-krpa-u16-16of16-2dpc.txt", MILAN_4090)
    assert (memory["channels_populated"], memory["dimms_per_channel"]) == (8, 2)
    assert memory["configured_speed_mts"] == 2933 and memory["rated_speed_mts"] == 2933
    assert checks["memory_channels_populated"]["observed"] == "8/8 (2 DIMMs per channel)"
    assert checks["memory_speed"]["status"] == "fail"  # below the profile's 3200


def test_dmidecode_tyan_s8030_umc_locators():
    memory, checks = memory_check("dmidecode--1x-epyc-7542-tyan-s8030-8of8-umc-labels.txt", MILAN_4090)
    assert hw.dimm_location("P0_UMC3_CH_C0", "P0 CHANNEL C")["channel"] == "C"
    assert memory["channels_populated"] == 8 and checks["memory_channels_populated"]["status"] == "pass"


def test_dmidecode_lenovo_one_dimm_rated_2666_configured_2400():
    memory, checks = memory_check("dmidecode--1x-xeon-silver-4210-lenovo-sr590-1dimm-2666-at-2400.txt",
                                  {"cpu": {"sockets": 2}, "memory": {"channels_per_socket": 6}})
    assert (memory["slots_populated"], memory["slots_total"]) == (1, 16)
    assert memory["slots"][0]["convention"].startswith("Lenovo") and memory["slots"][0]["socket"] == "1"
    assert (memory["rated_speed_mts"], memory["configured_speed_mts"]) == (2666, 2400)
    assert checks["memory_channels_populated"]["status"] == "fail"
    assert checks["memory_channels_populated"]["observed"].startswith("at most 1/12")
    assert checks["memory_speed"]["status"] == "warn" and "rated 2666" in checks["memory_speed"]["observed"]


def test_dmidecode_supermicro_two_dimms_per_channel_downclocked_to_2933():
    memory, checks = memory_check("dmidecode--2x-epyc-7763-supermicro-as2124us-32of32-2dpc-3200-at-2933.txt",
                                  two_socket(MILAN_4090))
    assert (memory["channels_populated"], memory["dimms_per_channel"]) == (16, 2)
    assert (memory["rated_speed_mts"], memory["configured_speed_mts"]) == (3200, 2933)
    speed = checks["memory_speed"]
    assert speed["status"] == "fail" and speed["observed"].startswith("2933 MT/s (rated 3200 MT/s, 2 DIMMs per channel)")


def test_dmidecode_b650d4u_two_dimms_per_channel_downclocked_to_3600():
    memory = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-4344p-b650d4u-2dpc-5600-at-3600.txt"), 2)
    assert (memory["slots_populated"], memory["channels_populated"], memory["dimms_per_channel"]) == (4, 2, 2)
    assert memory["rated_speed_mts"] == 5600 and memory["configured_speed_mts"] == 3600
    assert memory["bandwidth_gbs"] == 57.6
    speed = hw.judge_memory_speed({"memory": memory}, {})
    assert speed["verdict"] == "minor" and "rated 5600" in speed["observed"]


def test_dmidecode_qemu_vm_dimm_says_unknown_never_pass():
    text = fixture("dmidecode--qemu-q35-vm-one-dimm-unknown-speed.txt")
    memory = hw.parse_dmidecode_memory(text, 12)
    assert memory["slots_populated"] == 1 and hw.is_unknown(memory["configured_speed_mts"])
    system = hw.parse_dmi_system(text)
    assert system == {"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}
    platform = hw.detect_platform({"hypervisor": False}, system)
    assert platform["kind"] == "virtual" and "DMI system" in platform["evidence"][0]
    checks = by_id(hw.evaluate({"memory": memory, "platform": platform, "cpu": {}}, GENOA_4090))
    assert checks["memory_channels_populated"]["status"] == "warn" and checks["memory_speed"]["status"] == "warn"


@pytest.mark.parametrize("name", ["own/dmidecode-t17--container-no-smbios.txt",
                                  "own/dmidecode-t17--no-type17-entries.txt"])
def test_dmidecode_without_dimm_entries_makes_memory_checks_warn_unknown(name):
    memory = hw.parse_dmidecode_memory(fixture(name), 12)
    assert memory["slots_total"] == 0 and hw.is_unknown(memory["channels_populated"])
    facts = good_genoa_facts()
    facts["memory"] = memory
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    for check_id in ("memory_channels_populated", "memory_speed"):
        assert checks[check_id]["status"] == "warn" and checks[check_id]["observed"] == "unknown"
        assert "dmidecode -t 17" in checks[check_id]["remedy"]


def test_dmidecode_qemu_default_table_unknown_speed_fails_channels_on_the_bound():
    memory = hw.parse_dmidecode_memory(fixture("own/dmidecode-t17--qemu-default-unknown-speed.txt"), 12)
    assert memory["slots_populated"] == 1 and hw.is_unknown(memory["configured_speed_mts"])
    facts = good_genoa_facts()
    facts["memory"] = memory
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    assert checks["memory_speed"]["status"] == "warn" and checks["memory_speed"]["observed"] == "unknown"
    assert checks["memory_channels_populated"]["status"] == "fail"
    assert checks["memory_channels_populated"]["observed"].startswith("at most 1/12")


@pytest.mark.parametrize("locator, bank, socket, channel, dimm", [
    ("DIMM 0", "P0 CHANNEL A", "0", "A", None),                   # ASRock Rack, AMD reference BIOS
    ("P2-DIMMK1", "P1_Node0_ChannelA_Dimm0", "1", "A", 0),        # Supermicro: the bank locator wins
    ("P1-DIMMC2", "Not Specified", "1", "C", 2),                  # Supermicro letter + slot
    ("DIMMB1", "NODE 1", "0", "B", 1),
    ("DIMM_P1_H1", "BANK 1", "1", "H", 1),                        # Gigabyte
    ("CPU2_DIMM_A1", "Not Specified", "2", "A", 1),               # HPE Cray, ASUS dual socket
    ("P0 CHANNEL B", "BANK 1", "0", "B", None),                   # scripts/twin puts it in the device locator
    ("A7", "Not Specified", "1", None, 7),                        # Dell: socket only
    ("B12", "Not Specified", "2", None, 12),
    ("PROC 2 DIMM 5", "Not Specified", "2", None, 5),             # HPE ProLiant: slot, not channel
    ("DIMM 9", "CPU 2", "2", None, 9),                            # Lenovo
    ("DIMM 0", "Not Specified", None, None, None),                # QEMU's own table
])
def test_dimm_location_per_vendor_convention(locator, bank, socket, channel, dimm):
    location = hw.dimm_location(locator, bank)
    assert (location["socket"], location["channel"], location["dimm"]) == (socket, channel, dimm)


def test_theoretical_bandwidth_matches_the_brief():
    assert hw.theoretical_bandwidth_gbs(12, 4800) == 460.8
    assert hw.theoretical_bandwidth_gbs(8, 3200) == 204.8
    assert hw.is_unknown(hw.theoretical_bandwidth_gbs(0, 4800))
    assert hw.is_unknown(hw.theoretical_bandwidth_gbs(hw.unknown("labels"), 4800))


# -------------------------------------------------------------------------------------- nvidia-smi

def test_nvidia_smi_table_four_rtx6000ada_idle():
    smi = hw.parse_nvidia_smi_table(fixture("nvidia-smi--4x-rtx6000ada-esc8000a-2x-epyc-9374f.txt"))
    gpus = smi["gpus"]
    assert [g["pci_address"] for g in gpus] == ["0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    assert all(g["model"] == "NVIDIA RTX 6000 Ada Gene..." for g in gpus)
    assert all(g["pstate"] == "P8" and g["vram_mib"] == 49140 for g in gpus)
    assert (smi["driver_version"], smi["cuda_version"], smi["processes"]) == ("575.51.03", "12.9", 0)
    facts = {"gpus": [dict(g, driver="nvidia") for g in gpus]}
    four_ada = dict(GENOA_4090, gpus={"count": 4, "model": "RTX 6000 Ada", "vram_gib": 48})
    assert statuses(facts, four_ada, "gpu_present", "gpu_vram") == ("pass", "pass")
    assert statuses(facts, GENOA_4090, "gpu_present", "gpu_vram") == ("warn", "pass")  # 4 where 1 is expected


def test_nvidia_smi_single_rtx5090_passes_the_5090_profile():
    smi = hw.parse_nvidia_smi_table(fixture("nvidia-smi--1x-rtx5090-driver-595-cuda-13.2-p5.txt"))
    assert (smi["driver_version"], smi["cuda_version"]) == ("595.71.05", "13.2")
    assert smi["gpus"][0]["pci_address"] == "0000:c5:00.0" and smi["gpus"][0]["vram_mib"] == 32607
    assert hw.is_unknown(smi["processes"])  # the paste stops before the process table
    facts = {"gpus": [dict(smi["gpus"][0], driver="nvidia")]}
    profile = dict(GENOA_4090, gpus=dict(GENOA_4090["gpus"], model="RTX 5090", vram_gib=32))
    assert statuses(facts, profile, "gpu_present", "gpu_vram") == ("pass", "pass")
    assert by_id(hw.evaluate(facts, GENOA_4090))["gpu_vram"]["observed"] == "32 GiB"


def test_nvidia_smi_r610_header_names_the_kmd_and_cuda_umd_versions():
    smi = hw.parse_nvidia_smi_table(fixture("nvidia-smi--2x-rtx5090-r610-kmd-version-header.txt"))
    assert (smi["driver_version"], smi["cuda_version"]) == ("610.57.04", "13.3")
    assert [(g["index"], g["pstate"], g["vram_used_mib"]) for g in smi["gpus"]] == [(0, "P1", 29024), (1, "P1", 29174)]
    facts = {"gpus": [dict(g, driver="nvidia") for g in smi["gpus"]]}
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_present"]
    assert check["status"] == "warn" and check["observed"].startswith("2 (0000:01:00.0")  # the profile says 1


def test_nvidia_smi_topo_numa_affinity_and_links():
    topo = hw.parse_nvidia_smi_topo(fixture("nvidia-smi-topo--4x-rtx6000ada-2x-epyc-9374f-nps1.txt"))
    assert sorted(topo) == ["GPU0", "GPU1", "GPU2", "GPU3"]  # NIC rows and legends skipped
    assert [topo[g]["numa_affinity"] for g in sorted(topo)] == [0, 0, 1, 1]
    assert topo["GPU0"]["cpu_affinity"] == "0-31" and topo["GPU3"]["cpu_affinity"] == "32-63"
    assert topo["GPU0"]["links"]["GPU1"] == "NODE" and topo["GPU0"]["links"]["GPU2"] == "SYS"
    facts = {"numa": {"nodes": {0: {"cpus": "0-31", "size_mb": 1}, 1: {"cpus": "32-63", "size_mb": 1}}},
             "gpus": [{"pci_address": name, "driver": "nvidia", "numa_node": topo[name]["numa_affinity"]}
                      for name in sorted(topo)]}
    verdict = hw.judge_gpu_numa(facts, ANY)
    assert verdict["verdict"] == "ok" and verdict["observed"].endswith("GPU3 node 1")


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


def test_nvidia_smi_power_samples_skip_boards_without_power():
    assert hw.parse_nvidia_smi_power("0, 301.5\n1, [N/A]\n0, 299.0\n\n") == [
        {"gpu": 0, "watts": 301.5}, {"gpu": 0, "watts": 299.0}]


def test_gpu_seen_on_pci_without_driver_is_vram_unknown_warning():
    facts = good_genoa_facts()
    facts["gpus"][0]["vram_mib"] = hw.unknown("nvidia-smi does not list this GPU")
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_vram"]
    assert check["status"] == "warn" and check["observed"] == "unknown" and "nvidia-smi" in check["remedy"]


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


# ----------------------------------------------------------------------------------- PCIe, lspci

def first_link(name):
    """The link and NUMA node of the one device in an `lspci -vv -s <bdf>` capture."""
    devices = hw.parse_lspci(fixture(name))
    assert len(devices) == 1
    device = list(devices.values())[0]
    return dict(device["link"], numa_node=device["numa_node"])


def gpu_from_lspci(name, bdf):
    device = hw.parse_lspci(fixture(name))[bdf]
    return {"pci_address": bdf, "model": device["description"], "vram_mib": 24564, "driver": device["driver"],
            "numa_node": device["numa_node"], "link": device["link"]}


def test_lspci_idle_gen1_is_speed_downgraded_width_ok():
    link = first_link("lspci-vv--rtx6000ada-idle-gen1-downgraded-esc8000a.txt")
    assert (link["max_speed_gts"], link["max_width"]) == (16.0, 16)
    assert (link["current_speed_gts"], link["current_width"]) == (2.5, 16)
    assert link["speed_downgraded"] is True and link["width_downgraded"] is False
    assert link["numa_node"] == 0 and link["aspm"] == "Disabled" and link["aspm_enabled"] == []
    assert hw.pcie_gen(link["current_speed_gts"]) == 1 and hw.pcie_gen(link["max_speed_gts"]) == 4
    facts = good_genoa_facts()
    facts["gpus"] = [gpu_from_lspci("lspci-vv--rtx6000ada-idle-gen1-downgraded-esc8000a.txt", "0000:01:00.0")]
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    assert checks["gpu_pcie_link"]["status"] == "warn"
    assert "x16/x16" in checks["gpu_pcie_link"]["observed"] and "speed downgraded (idle?)" in \
        checks["gpu_pcie_link"]["observed"]
    assert checks["pcie_aspm_policy"]["status"] == "pass"


def test_width_downgraded_link_fails_and_numa_minus_one_is_read():
    link = first_link("own/lspci-vv--x8-width-downgraded-numa-minus1.txt")
    assert (link["current_width"], link["max_width"], link["width_downgraded"]) == (8, 16, True)
    assert link["speed_downgraded"] is False and link["numa_node"] == -1
    facts = good_genoa_facts()
    facts["gpus"][0]["link"] = link
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_pcie_link"]
    assert check["status"] == "fail" and "width downgraded" in check["observed"]


def test_lspci_gt730_card_that_is_x8_itself_fails_with_no_reseat_advice():
    devices = hw.parse_lspci(fixture("lspci-vv--gt730-x8-card-gen1-at-idle-aspm-disabled-author-trimmed.txt"))
    device = devices["0000:17:00.0"]  # the author's "[ ... ]" cuts do not end the device
    assert device["driver"] == "nvidia" and device["modules"] == ["nvidiafb", "nouveau", "nvidia_drm", "nvidia"]
    assert (device["link"]["max_width"], device["link"]["current_width"], device["link"]["current_speed_gts"]) == (
        8, 8, 2.5)
    facts = good_genoa_facts()
    facts["gpus"] = [gpu_from_lspci("lspci-vv--gt730-x8-card-gen1-at-idle-aspm-disabled-author-trimmed.txt",
                                    "0000:17:00.0")]
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_pcie_link"]
    assert check["status"] == "fail" and "(the card itself is x8)" in check["observed"]
    assert "no slot fixes that" in check["remedy"]


def test_lspci_mi100_with_aspm_l1_enabled_and_no_driver_bound():
    device = hw.parse_lspci(fixture("lspci-vvv--amd-mi100-aspm-l1-enabled-no-driver-bound.txt"))["0000:23:00.0"]
    assert device["class"] == "Display controller" and device["vendor_id"] == "1002"
    assert hw.is_unknown(device["driver"]) and device["modules"] == ["amdgpu"]  # the probe failed: nothing bound
    assert device["numa_node"] == 2 and device["link"]["aspm_enabled"] == ["L1"]
    facts = good_genoa_facts()
    facts["gpus"][0]["link"] = device["link"]
    check = by_id(hw.evaluate(facts, GENOA_4090))["pcie_aspm_policy"]
    # The policy file says performance, but the link itself has L1 on: the link is what copies the experts.
    assert check["status"] == "warn" and "0000:01:00.0 ASPM L1 enabled" in check["observed"]


def test_lspci_k_rtx3060_bound_to_vfio_pci_is_passed_through_not_present():
    devices = hw.parse_lspci(fixture("lspci-k--rtx3060-bound-to-vfio-pci-grep-filtered.txt"))
    assert devices["0000:07:00.0"]["driver"] == "vfio-pci" and devices["0000:07:00.0"]["vendor_id"] == "10de"
    assert hw.is_unknown(devices["0000:07:00.1"]["driver"])  # grep kept no driver line for the audio function
    facts = good_genoa_facts()
    facts["gpus"] = [{"pci_address": "0000:07:00.0", "model": devices["0000:07:00.0"]["description"],
                      "vram_mib": hw.unknown("nvidia-smi does not see a vfio-pci device"), "driver": "vfio-pci",
                      "numa_node": hw.unknown("x"), "link": devices["0000:07:00.0"]["link"]}]
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    assert checks["gpu_present"]["status"] == "fail"
    assert "bound to vfio-pci (passed through to a VM)" in checks["gpu_present"]["observed"]
    assert "vfio-pci.ids" in checks["gpu_present"]["remedy"]
    assert checks["gpu_vram"]["observed"] == "passed through to a VM (vfio-pci)"  # never "VRAM unknown"


def test_lspci_nnk_two_rtx3090_bound_to_nvidia():
    devices = hw.parse_lspci(fixture("lspci-nnk--2x-rtx3090-nvidia-driver-grep-A3.txt"))
    gpus = [b for b, d in devices.items() if d["class"] == "VGA compatible controller"]
    assert gpus == ["0000:05:00.0", "0000:0a:00.0"]
    assert all(devices[b]["driver"] == "nvidia" and devices[b]["vendor_id"] == "10de" for b in gpus)
    assert devices["0000:05:00.1"]["driver"] == "snd_hda_intel"
    facts = {"gpus": [{"pci_address": b, "driver": "nvidia", "model": "RTX 3090", "vram_mib": 24576,
                       "link": devices[b]["link"], "numa_node": devices[b]["numa_node"]} for b in gpus]}
    link = hw.judge_gpu_links(facts, MILAN_4090)
    assert link["verdict"] == "unknown" and link["observed"] == "0000:05:00.0 unknown; 0000:0a:00.0 unknown"


def test_sysfs_link_values():
    link = hw.parse_sysfs_link("2.5 GT/s PCIe", "32.0 GT/s PCIe", "16", "16")
    assert link == {"current_speed_gts": 2.5, "max_speed_gts": 32.0, "current_width": 16, "max_width": 16}
    assert hw.is_unknown(hw.parse_sysfs_link(None, None, None, None)["current_width"])


def test_gpu_numa_node_minus_one_warns_on_a_multi_node_box_only():
    facts = good_genoa_facts()
    facts["gpus"][0]["numa_node"] = -1
    assert by_id(hw.evaluate(facts, GENOA_4090))["gpu_numa_node"]["status"] == "pass"
    facts["numa"]["nodes"][1] = {"cpus": "32-63", "size_mb": 386000, "packages": [0]}
    check = by_id(hw.evaluate(facts, GENOA_4090))["gpu_numa_node"]
    assert check["status"] == "warn" and "node -1" in check["observed"]


def test_bdf_normalisation():
    assert hw.normalize_bdf("00000000:C1:00.0") == "0000:c1:00.0"
    assert hw.normalize_bdf("01:00.0") == "0000:01:00.0"


# ------------------------------------------------------------------------------ small /proc /sys

def test_bracketed_policy_and_thp():
    assert hw.parse_bracketed("default [performance] powersave powersupersave\n") == "performance"
    assert hw.parse_bracketed("always [madvise] never") == "madvise"


@pytest.mark.parametrize("text,state", [
    ("SecureBoot enabled\n", "enabled"),
    ("SecureBoot disabled\nPlatform is in Setup Mode\n", "disabled"),
    ("EFI variables are not supported on this system\n", "not_efi"),
])
def test_mokutil_sb_state(text, state):
    assert hw.parse_mokutil_sb_state(text) == state


def test_meminfo_total():
    assert hw.parse_meminfo_total_gb("MemTotal:       401123456 kB\nMemFree: 1 kB\n") == 382.5


def test_cmdline_real_output_and_the_aspm_parameters():
    cmdline = hw.parse_cmdline(fixture("proc-cmdline--ubuntu-isolcpus-intel-pstate-disable.txt"))
    assert cmdline["line"].startswith("BOOT_IMAGE=/@/boot/vmlinuz-5.3.0-46-generic")
    assert cmdline["params"]["isolcpus"] == "6,7" and cmdline["params"]["quiet"] is True
    assert (cmdline["pcie_aspm"], cmdline["pcie_aspm_policy"]) == ("unset", "unset")
    assert hw.parse_cmdline("ro quiet pcie_aspm=off")["pcie_aspm"] == "off"
    facts = good_genoa_facts()
    facts["cmdline"] = cmdline
    check = by_id(hw.evaluate(facts, GENOA_4090))["pcie_aspm_policy"]
    assert check["status"] == "pass" and "cmdline" not in check["observed"]  # nothing about ASPM on this line


def test_pcie_aspm_off_on_the_command_line_is_flagged_with_the_real_fix():
    facts = good_genoa_facts()
    facts["pcie_aspm_policy"] = "default"  # what the policy file reads after pcie_aspm=off
    facts["cmdline"] = hw.parse_cmdline("BOOT_IMAGE=/vmlinuz ro quiet pcie_aspm=off")
    facts["gpus"][0]["link"]["aspm_enabled"] = hw.unknown("no LnkCtl line (needs root)")
    check = by_id(hw.evaluate(facts, GENOA_4090))["pcie_aspm_policy"]
    assert check["status"] == "warn" and "cmdline pcie_aspm=off" in check["observed"]
    assert "pcie_aspm.policy=performance" in check["remedy"] and "does not disable it" in check["remedy"]


@pytest.mark.parametrize("policy,status", [("performance", "pass"), ("default", "warn"), ("powersave", "fail"),
                                           ("powersupersave", "fail"), (hw.unknown("file missing"), "warn")])
def test_pcie_aspm_policy_without_link_states(policy, status):
    facts = good_genoa_facts()
    facts["pcie_aspm_policy"] = policy
    facts["cmdline"] = hw.parse_cmdline("ro")
    check = by_id(hw.evaluate(facts, GENOA_4090))["pcie_aspm_policy"]
    assert check["status"] == status
    assert check["observed"].startswith("policy [%s]" % (policy if hw.known(policy) else "unknown"))


def test_policy_default_with_every_gpu_link_aspm_off_passes():
    facts = good_genoa_facts()
    facts["pcie_aspm_policy"] = "default"
    facts["cmdline"] = hw.parse_cmdline("ro")
    facts["gpus"][0]["link"]["aspm_enabled"] = []
    assert by_id(hw.evaluate(facts, GENOA_4090))["pcie_aspm_policy"]["status"] == "pass"


# ----------------------------------------------------------------------------------- engine logs

def test_mainline_log_shows_numa_balancing_amx_and_512_threads():
    log = hw.parse_llama_log(fixture("llama-log--mainline-perplexity-2x-xeon-6980p-numa-balancing-amx.txt"))
    assert log["numa_balancing_warning"] is True and log["system_info_form"] == "mainline"
    assert (log["n_threads"], log["n_threads_batch"], log["total_threads"]) == (80, 80, 512)
    assert log["features"]["AVX512"] is True and log["features"]["AMX_INT8"] is True
    assert hw.is_unknown(log["cuda_devices"])
    # Granite Rapids' build on a Zen 4 host: AMX and AVX-VNNI would fault; on Zen 4 nothing is left unused.
    zen4 = lscpu_cpu("lscpu--2x-epyc-9374f-esc8000a-smt-off-nps1-avx512.txt")["flags"]
    comparison = hw.compare_engine_isa(log["features"], zen4)
    assert comparison["needs_missing"] == ["AVX_VNNI", "AMX_INT8"] and comparison["built_without"] == []


def test_ik_server_log_shows_two_ada_gpus_smt_on_and_avx512_bf16():
    log = hw.parse_llama_log(fixture("llama-log--ik-server-epyc-9175f-2x-rtx6000ada-system-info.txt"))
    assert log["numa_balancing_warning"] is False and log["system_info_form"] == "server"
    assert [d["compute_capability"] for d in log["cuda_devices"]] == ["8.9", "8.9"]
    assert (log["n_threads"], log["n_threads_batch"], log["total_threads"]) == (16, 32, 32)
    assert log["features"]["AVX512"] and log["features"]["AVX512_BF16"] and log["features"]["AVX_VNNI"]
    # Built on Zen 5 (AVX-VNNI), moved to a Zen 4 host (AVX512_VNNI but no AVX-VNNI): it would die with SIGILL.
    zen4 = lscpu_cpu("lscpu--2x-epyc-9374f-esc8000a-smt-off-nps1-avx512.txt")["flags"]
    comparison = hw.compare_engine_isa(log["features"], zen4)
    assert comparison["needs_missing"] == ["AVX_VNNI"] and comparison["built_without"] == []
    assert hw.compare_engine_isa(log["features"], zen4 + ["avx_vnni"])["needs_missing"] == []


def test_wrapped_system_info_keeps_every_flag_and_an_avx2_build_on_zen4_is_caught():
    log = hw.parse_llama_log(fixture("llama-log--ik-perplexity-terminal-wrapped-system-info-64-of-128.txt"))
    assert (log["n_threads"], log["n_threads_batch"], log["total_threads"]) == (64, 64, 128)
    assert log["features"]["LLAMAFILE"] is True and log["features"]["WASM_SIMD"] is False  # from the wrapped line
    assert log["features"]["AVX2"] is True and log["features"]["AVX512"] is False
    zen4 = lscpu_cpu("lscpu--2x-epyc-9374f-esc8000a-smt-off-nps1-avx512.txt")["flags"]
    comparison = hw.compare_engine_isa(log["features"], zen4)
    assert comparison["built_without"] == ["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"]
    rome = lscpu_cpu("lscpu--1x-epyc-7502p-smt-on-nps1.txt")["flags"]
    assert hw.compare_engine_isa(log["features"], rome)["built_without"] == []


def test_journal_prefixed_system_info_is_read():
    line = fixture("llama-log--ik-perplexity-terminal-wrapped-system-info-64-of-128.txt").splitlines()[0]
    log = hw.parse_llama_log("2026-11-30T09:00:01+0000 node llama-server[812]: " + line)
    assert log["n_threads"] == 64 and log["features"]["FP16_VA"] is False


def test_old_classic_system_info_without_n_threads_batch():
    log = hw.parse_llama_log(fixture("llama-log--mainline-2023-old-system-info-36-of-72-avx512.txt"))
    assert (log["n_threads"], log["n_threads_batch"], log["total_threads"]) == (36, 36, 72)
    assert log["system_info_form"] == "classic" and log["features"]["AVX512"] is True
    rome = lscpu_cpu("lscpu--1x-epyc-7502p-smt-on-nps1.txt")["flags"]
    assert hw.compare_engine_isa(log["features"], rome)["needs_missing"] == ["AVX512"]  # SIGILL on Zen 2


def test_server_line_with_n_threads_batch_minus_one_in_another_key_order():
    log = hw.parse_llama_log(fixture("llama-log--ollama-server-proxmox-vm-n-threads-batch-minus-1.txt"))
    assert (log["n_threads"], log["n_threads_batch"], log["total_threads"]) == (6, 6, 6)  # -1: as n_threads
    assert log["features"]["AVX2"] is True and log["features"]["AVX512"] is False
    vm = lscpu_cpu("lscpu--vm-xeon-gold-5117-24-sockets-hypervisor-no-avx512.txt")["flags"]
    comparison = hw.compare_engine_isa(log["features"], vm)
    assert comparison["needs_missing"] == ["AVX2"]  # this VM's vCPU shows FMA and F16C but no AVX2


def test_engine_isa_comparison_needs_both_sides():
    assert hw.compare_engine_isa(hw.unknown("no system_info"), ["avx2"]) == {
        "comparable": False, "reason": "no system_info"}
    assert hw.compare_engine_isa({"AVX2": True}, hw.unknown("no flags"))["comparable"] is False


# -------------------------------------------------------------------------------------- platform

def test_platform_declared_bare_metal_judges_a_twin_as_the_metal_it_stands_in_for():
    cpu = {"hypervisor": True, "hypervisor_vendor": "KVM"}
    platform = hw.detect_platform(cpu, {"sys_vendor": "hybrid-moe-kit", "product_name": "epyc-node twin"},
                                  "qemu", "bare_metal")
    assert platform["kind"] == "bare_metal" and platform["detected"] == "virtual"
    check = by_id(hw.evaluate({"cpu": dict(cpu, sockets=1, numa_nodes=4), "platform": platform}, LAB))
    assert check["platform"]["status"] == "pass" and "a hypervisor was detected" in check["platform"]["observed"]
    assert (check["numa_nodes_per_socket"]["status"], check["numa_nodes_per_socket"]["observed"]) == ("fail", 4)


def test_platform_bare_metal_amazon_metal_instance_without_hypervisor_flag():
    platform = hw.detect_platform({"hypervisor": False}, {"sys_vendor": "Amazon EC2", "product_name": "c5n.metal"})
    assert platform["kind"] == "bare_metal"


# ------------------------------------------------------------------------------------- evaluate

def test_every_listed_check_is_produced_once_with_all_fields():
    checks = hw.evaluate(good_genoa_facts(), GENOA_4090)
    assert [c["id"] for c in checks] == list(hw.CHECK_IDS)
    for check in checks:
        assert set(check) == {"id", "status", "observed", "expected", "why", "remedy"}
        assert check["status"] in ("pass", "warn", "fail") and check["why"] and check["remedy"]


def test_a_correct_genoa_node_passes_everything():
    checks = hw.evaluate(good_genoa_facts(), GENOA_4090)
    assert [(c["id"], c["observed"]) for c in checks if c["status"] != "pass"] == []
    summary = hw.summarize(checks)
    assert summary["fail"] == 0 and summary["pass"] == len(hw.CHECK_IDS)


def test_twin_fail_layout_fails_nps_smt_and_channels_only():
    """The layout of molecule/bios_checklist_fail: 8 vCPUs, 4 nodes, 2 threads/core, 8 of 12 DIMMs."""
    facts = good_genoa_facts()
    facts["cpu"].update({"sockets": 1, "numa_nodes": 4, "threads_per_core": 2, "smt_active": True,
                         "hypervisor": True, "flags": ["fpu", "sse4_2"]})
    facts["platform"] = hw.detect_platform(facts["cpu"], None, "qemu", "bare_metal")
    facts["numa"] = {"nodes": dict((n, {"cpus": "%d-%d" % (2 * n, 2 * n + 1), "size_mb": 512, "packages": [0]})
                                   for n in range(4))}
    facts["memory"] = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-9454p-genoad12-9of12-channels.txt"), 12)
    facts["gpus"] = []
    facts["pcie_aspm_policy"] = "default"
    checks = by_id(hw.evaluate(facts, LAB))
    assert (checks["numa_nodes_per_socket"]["status"], checks["numa_nodes_per_socket"]["observed"]) == ("fail", 4)
    assert (checks["smt_disabled"]["status"], checks["smt_disabled"]["observed"]) == ("fail", "on")
    assert (checks["memory_channels_populated"]["status"], checks["memory_channels_populated"]["observed"]) == (
        "fail", "9/12")
    assert "NPS1" in checks["numa_nodes_per_socket"]["remedy"]
    assert "SMT Control = Disable" in checks["smt_disabled"]["remedy"]
    summary = hw.summarize(checks.values())
    assert summary["failed_ids"] == ["numa_nodes_per_socket", "smt_disabled", "memory_channels_populated"]


def test_twin_pass_layout_with_a_memory_only_node_passes_nps_and_reports_the_node():
    """The layout of molecule/bios_checklist_pass: 2 vCPUs on node 0, node 1 memory only (CXL-like)."""
    facts = good_genoa_facts()
    facts["platform"] = hw.detect_platform({"hypervisor": True}, None, "qemu", "bare_metal")
    facts["numa"] = {"nodes": {0: {"cpus": "0-1", "size_mb": 1976, "packages": [0]},
                               1: {"cpus": "", "size_mb": 512, "packages": []}}}
    facts["gpus"] = []
    checks = by_id(hw.evaluate(facts, LAB))
    assert (checks["numa_nodes_per_socket"]["status"], checks["numa_nodes_per_socket"]["observed"]) == ("pass", 1)
    assert checks["numa_memory_only_nodes"]["status"] == "warn"
    assert checks["numa_memory_only_nodes"]["observed"] == "node 1: 0.5 GB, no CPU"
    assert hw.summarize(checks.values())["fail"] == 0


def test_milan_8_channels_at_3200_pass_with_the_milan_profile_and_fail_with_genoa():
    facts = good_genoa_facts()
    facts["memory"] = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-7742-gigabyte-g242-z11-8of8.txt"), 8)
    checks = by_id(hw.evaluate(facts, MILAN_4090))
    assert checks["memory_channels_populated"]["status"] == "pass"
    assert checks["memory_speed"]["observed"] == "3200 MT/s, 204.8 GB/s theoretical"
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    assert checks["memory_channels_populated"]["status"] == "fail"
    assert checks["memory_speed"]["status"] == "fail"


def test_numa_balancing_on_is_warn_when_kernel_tuning_follows_else_fail():
    facts = good_genoa_facts()
    facts["numa"]["nodes"][1] = {"cpus": "32-63", "size_mb": 386000, "packages": [0]}
    facts["numa_balancing"] = 1
    assert by_id(hw.evaluate(facts, GENOA_4090))["numa_balancing_disabled"]["status"] == "warn"
    assert by_id(hw.evaluate(facts, GENOA_4090, numa_balancing_fixed_later=False))[
        "numa_balancing_disabled"]["status"] == "fail"
    facts["numa_balancing"] = "absent"
    assert by_id(hw.evaluate(facts, GENOA_4090))["numa_balancing_disabled"]["status"] == "pass"
    facts["numa_balancing"] = hw.unknown("reads 'x'")
    assert by_id(hw.evaluate(facts, GENOA_4090))["numa_balancing_disabled"]["status"] == "warn"


@pytest.mark.parametrize("state,status", [("disabled", "pass"), ("not_efi", "pass"), ("enabled", "warn"),
                                          (hw.unknown("no mokutil"), "warn")])
def test_secure_boot(state, status):
    facts = good_genoa_facts()
    facts["secure_boot"] = state
    assert by_id(hw.evaluate(facts, GENOA_4090))["secure_boot"]["status"] == status


def test_unknown_topology_is_a_warning_not_a_pass():
    facts = good_genoa_facts()
    facts["cpu"] = {"flags": hw.unknown("no Flags line")}
    facts["numa"] = {}
    checks = by_id(hw.evaluate(facts, GENOA_4090))
    for check_id in ("numa_nodes_per_socket", "smt_disabled", "cpu_isa", "numa_memory_only_nodes",
                     "numa_memoryless_cpu_nodes", "numa_memory_placement"):
        assert checks[check_id]["status"] == "warn", check_id


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
    md = hw.render_markdown("epyc-node", checks, facts, summary)
    assert md.startswith("<!--") and "# Preflight report: epyc-node" in md
    assert "| fail | smt_disabled | on | off |" in md
    assert "%d pass, 0 warn, 1 fail: smt_disabled" % (len(checks) - 1) in md
    assert "(EPYC 9004 (Genoa, Zen 4))" in md and "(driver nvidia)" in md
    json.dumps({"checks": checks, "facts": facts})  # the report must serialise


def test_cpu_without_any_listed_isa_passes_an_empty_requirement_and_says_so():
    facts = good_genoa_facts()
    facts["cpu"]["flags"] = ["fpu", "sse4_2", "popcnt"]  # what a QEMU Nehalem vCPU shows
    check = by_id(hw.evaluate(facts, LAB))["cpu_isa"]
    assert check["status"] == "pass" and check["observed"] == ["no AVX2/AVX-512/AMX flags visible"]


def test_table_cuts_long_observed_values_but_the_check_keeps_them():
    facts = good_genoa_facts()
    facts["memory"] = hw.parse_dmidecode_memory(fixture("dmidecode--1x-epyc-7443p-r7515-2of16.txt"), 12)
    checks = hw.evaluate(facts, GENOA_4090)
    observed = by_id(checks)["memory_channels_populated"]["observed"]
    assert observed.startswith("at most 2/12 (the DIMM labels (Dell")
    row = [line for line in hw.render_table(checks).splitlines() if "memory_channels_populated" in line][0]
    assert observed[:33] + "..." in row and observed not in row


def test_every_fixture_is_listed_in_the_index_with_a_source():
    index = fixture("INDEX.md")
    names = sorted(n for n in os.listdir(FIXTURES) if n.endswith(".txt"))
    assert len(names) >= 16 + 25
    for name in names:
        row = [line for line in index.splitlines() if line.startswith("| %s |" % name)]
        assert row, name
        assert row[0].split(" | ")[1].strip(), name  # a source


def test_the_waivable_ids_of_the_role_are_the_checks_of_the_package():
    import yaml
    specs = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "bios_checklist", "meta", "argument_specs.yml")
    with open(specs) as handle:
        options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert options["bios_checklist_waive"]["choices"] == list(hw.CHECK_IDS)
