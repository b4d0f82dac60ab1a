# -*- coding: utf-8 -*-
# Pure parsing and judging logic behind the bios_checklist role.
#
# Nothing here touches the system: every function takes command output (or already parsed facts)
# and returns plain data, so the unit tests in tests/unit/ can feed it real outputs saved as
# fixtures. The module library/hmk_hardware_facts.py runs the commands and calls these functions.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

UNKNOWN = "unknown"

# ISA flags the report always lists, as /proc/cpuinfo spells them.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512vbmi", "amx_tile",
             "amx_int8", "amx_bf16")

CHECK_IDS = ("numa_nodes_per_socket", "smt_disabled", "memory_channels_populated", "memory_speed",
             "numa_balancing_disabled", "pcie_aspm_policy", "gpu_present", "gpu_pcie_link",
             "gpu_numa_node", "gpu_vram", "cpu_isa", "secure_boot", "model_disk_space")


def _lines(text):
    return (text or "").replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _int(value, default=None):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def parse_cpulist(text):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus = []
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.extend(range(int(low), int(high) + 1))
        else:
            cpus.append(int(part))
    return cpus


# --------------------------------------------------------------------------------------- lscpu

_LSCPU_KEY = re.compile(r"^(\s*)([A-Za-z][^:]*?):\s*(.*)$")


def parse_lscpu(text):
    """Parse `LANG=C lscpu`, both the flat (util-linux < 2.38) and the nested layout.

    The nested layout wraps the Flags value at a fixed width and may split a flag mid-word
    ("a" / "md_lbr_v2"): continuation lines are joined back by cutting exactly the value column,
    never by splitting on whitespace first.
    """
    raw = {}
    flags_text = None
    value_col = 0
    for line in _lines(text):
        if flags_text is not None:
            # A continuation line has nothing left of the value column.
            if line.strip() and not line[:value_col].strip():
                flags_text += line[value_col:]
                continue
            raw["Flags"] = flags_text
            flags_text = None
        match = _LSCPU_KEY.match(line)
        if not match:
            continue
        key, value = match.group(2).strip(), match.group(3).strip()
        if key == "Flags":
            flags_text = line[match.start(3):]
            value_col = match.start(3)
            continue
        raw[key] = value
    if flags_text is not None:
        raw["Flags"] = flags_text

    sockets = _int(raw.get("Socket(s)"))
    cores_per_socket = _int(raw.get("Core(s) per socket"))
    threads_per_core = _int(raw.get("Thread(s) per core"))
    numa_nodes = _int(raw.get("NUMA node(s)"))
    flags = sorted(set(raw.get("Flags", "").split()))
    node_cpus = {}
    for key, value in raw.items():
        node = re.match(r"^NUMA node(\d+) CPU\(s\)$", key)
        if node:
            node_cpus[int(node.group(1))] = parse_cpulist(value)
    return {
        "model": raw.get("Model name", UNKNOWN),
        "vendor": raw.get("Vendor ID", UNKNOWN),
        "cpus": _int(raw.get("CPU(s)")),
        "sockets": sockets,
        "cores_per_socket": cores_per_socket,
        "threads_per_core": threads_per_core,
        "physical_cores": sockets * cores_per_socket if sockets and cores_per_socket else None,
        "numa_nodes": numa_nodes,
        "numa_node_cpus": node_cpus,
        "flags": flags,
        "hypervisor": "hypervisor" in flags or "Hypervisor vendor" in raw,
    }


def parse_cpuinfo_flags(text):
    """Flags of the first processor in /proc/cpuinfo (one line, never wrapped)."""
    for line in _lines(text):
        match = re.match(r"^flags\s*:\s*(.*)$", line)
        if match:
            return sorted(set(match.group(1).split()))
    return []


def isa_summary(flags):
    """Which of the ISA extensions that decide build flags are visible."""
    present = set(flags or [])
    summary = dict((flag, flag in present) for flag in ISA_FLAGS)
    summary["amx"] = any(flag.startswith("amx") for flag in present)
    return summary


# ------------------------------------------------------------------------------------- numactl

def parse_numactl(text):
    """Parse `numactl --hardware`: nodes with their CPUs and memory, and the distance matrix."""
    nodes = {}
    distances = []
    in_distances = False
    for line in _lines(text):
        match = re.match(r"^node (\d+) (cpus|size|free):\s*(.*)$", line)
        if match:
            node = nodes.setdefault(int(match.group(1)), {"cpus": [], "size_mb": None, "free_mb": None})
            if match.group(2) == "cpus":
                node["cpus"] = [int(c) for c in match.group(3).split()]
            else:
                node[match.group(2) + "_mb"] = _int(match.group(3).split()[0] if match.group(3) else None)
            continue
        if line.startswith("node distances"):
            in_distances = True
            continue
        if in_distances:
            row = re.match(r"^\s*(\d+):\s+(.*)$", line)
            if row:
                distances.append([int(v) for v in row.group(2).split()])
    remote = sorted(set(v for i, row in enumerate(distances) for j, v in enumerate(row) if i != j))
    sizes = [n["size_mb"] for n in nodes.values() if n["size_mb"] is not None]
    return {
        "node_count": len(nodes),
        "nodes": nodes,
        "cpus": sum(len(n["cpus"]) for n in nodes.values()),
        "distances": distances,
        "remote_distances": remote,
        "memoryless_nodes": sorted(i for i, n in nodes.items() if n["size_mb"] == 0),
        "memory_balanced": bool(sizes) and min(sizes) > 0 and max(sizes) - min(sizes) <= 0.05 * max(sizes),
    }


# ------------------------------------------------------------------------------------ dmidecode

def _mts(value):
    match = re.match(r"^\s*(\d+)\s*(MT/s|MHz)", value or "")
    return int(match.group(1)) if match else None


def _size_gb(value):
    match = re.match(r"^\s*(\d+)\s*(kB|MB|GB|TB)\b", value or "")
    if not match:
        return None
    factor = {"kB": 1.0 / (1024 * 1024), "MB": 1.0 / 1024, "GB": 1, "TB": 1024}[match.group(2)]
    return int(match.group(1)) * factor


def dimm_channel(locator, bank_locator):
    """(socket, channel) a DIMM sits on, or None when the labels do not say.

    Knows the AMD reference labels ("P0 CHANNEL A", "P0_Node0_Channel0_Dimm0", in the bank or
    the device locator) and
    letter+slot locators ("P1-DIMMA1", "DIMM_A1", "CPU1_DIMM_B2"). Vendor labels such as Dell's
    "A1".."A16" do not name the channel.
    """
    for label in (bank_locator or "", locator or ""):
        channel = re.search(r"(?i)channel[\s_]*([0-9a-z]+)", label)
        if channel:
            socket = re.match(r"(?i)^\s*(?:p|cpu|socket)[\s_]*(\d+)", label)
            return (socket.group(1) if socket else "0", channel.group(1).upper())
    slot = re.match(r"(?i)^\s*(?:(?:p|cpu)(\d+)[-_\s]*)?dimm[-_\s]*([a-z])(\d*)\s*$", locator or "")
    if slot:
        return (slot.group(1) or "0", slot.group(2).upper())
    return None


def parse_dmidecode_memory(text):
    """Parse `dmidecode -t 17` (or a full dmidecode): every slot, populated or not."""
    dimms = []
    block = None
    for line in _lines(text) + [""]:
        if re.match(r"^Handle 0x[0-9A-Fa-f]+, DMI type 17,", line):
            block = {}
            continue
        if block is None:
            continue
        if not line.strip() or line.startswith("Handle "):
            dimms.append(block)
            block = None
            continue
        match = re.match(r"^\s+([^:]+):\s*(.*?)\s*$", line)
        if match:
            block[match.group(1)] = match.group(2)
    slots = []
    for d in dimms:
        size = d.get("Size", "")
        populated = _size_gb(size) is not None
        slots.append({
            "locator": d.get("Locator", ""),
            "bank_locator": d.get("Bank Locator", ""),
            "populated": populated,
            "size_gb": _size_gb(size) if populated else 0,
            "type": d.get("Type", UNKNOWN) if populated else None,
            "speed_mts": _mts(d.get("Speed")) if populated else None,
            "configured_speed_mts": _mts(d.get("Configured Memory Speed") or d.get("Configured Clock Speed"))
            if populated else None,
            "channel": dimm_channel(d.get("Locator"), d.get("Bank Locator")),
        })
    populated = [s for s in slots if s["populated"]]
    speeds = [s["configured_speed_mts"] for s in populated if s["configured_speed_mts"]]
    rated = [s["speed_mts"] for s in populated if s["speed_mts"]]
    if populated and all(s["channel"] for s in populated):
        channels = len(set(s["channel"] for s in populated))
        channels_total = len(set(s["channel"] for s in slots if s["channel"]))
        channel_source = "labels"
    else:
        # Labels do not name channels: at most one channel per populated DIMM.
        channels = len(populated)
        channels_total = None
        channel_source = "dimm_count_upper_bound" if populated else "none"
    speed_known = bool(populated) and len(speeds) == len(populated)
    min_speed = min(speeds) if speed_known else None
    return {
        "slots_total": len(slots),
        "slots_populated": len(populated),
        "slots": slots,
        "total_gb": sum(s["size_gb"] for s in populated),
        "types": sorted(set(s["type"] for s in populated if s["type"])),
        "rated_speed_mts": min(rated) if rated and len(rated) == len(populated) else None,
        "configured_speed_mts": min_speed,
        "speeds_mixed": len(set(speeds)) > 1,
        "channels_populated": channels,
        "channels_total": channels_total,
        "channel_source": channel_source,
        "dimms_per_channel": max([sum(1 for s in populated if s["channel"] == c)
                                  for c in set(s["channel"] for s in populated)] or [0])
        if channel_source == "labels" else None,
        "bandwidth_gbs": theoretical_bandwidth_gbs(channels, min_speed),
    }


def theoretical_bandwidth_gbs(channels, mts):
    """channels x MT/s x 8 bytes, in GB/s (12 x 4800 x 8 = 460.8)."""
    if not channels or not mts:
        return None
    return round(channels * mts * 8 / 1000.0, 1)


# ----------------------------------------------------------------------------------- nvidia-smi

def normalize_bdf(bus_id):
    """'00000000:01:00.0' or '01:00.0' -> '0000:01:00.0' (lower case, as sysfs names it)."""
    value = (bus_id or "").strip().lower()
    match = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$", value)
    if not match:
        return value
    domain = int(match.group(1) or "0", 16)
    return "%04x:%s:%s.%s" % (domain, match.group(2), match.group(3), match.group(4))


def parse_nvidia_smi_csv(text):
    """Parse `nvidia-smi --query-gpu=pci.bus_id,name,memory.total,pstate --format=csv,noheader,nounits`."""
    gpus = []
    for line in _lines(text):
        if not line.strip() or line.lower().startswith("pci.bus_id") or "NVIDIA-SMI has failed" in line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3:
            continue
        gpus.append({
            "pci_address": normalize_bdf(fields[0]),
            "model": fields[1],
            "vram_mib": _int(fields[2].split()[0] if fields[2] else None),
            "pstate": fields[3] if len(fields) > 3 else None,
        })
    return gpus


def parse_nvidia_smi_table(text):
    """Parse the default `nvidia-smi` table (what people paste): one entry per GPU."""
    gpus = []
    lines = _lines(text)
    for i, line in enumerate(lines):
        head = re.match(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+([0-9A-Fa-f:.]+)\s", line)
        if not head or i + 1 >= len(lines):
            continue
        stats = re.search(r"\s(P\d+)\s.*?(\d+)MiB\s*/\s*(\d+)MiB", lines[i + 1])
        gpus.append({
            "index": int(head.group(1)),
            "model": head.group(2),
            "persistence_mode": head.group(3),
            "pci_address": normalize_bdf(head.group(4)),
            "pstate": stats.group(1) if stats else None,
            "vram_used_mib": int(stats.group(2)) if stats else None,
            "vram_mib": int(stats.group(3)) if stats else None,
        })
    processes = None
    if "No running processes found" in (text or ""):
        processes = 0
    driver = re.search(r"Driver Version:\s*([0-9.]+)", text or "")
    return {"gpus": gpus, "driver_version": driver.group(1) if driver else None, "processes": processes}


def parse_nvidia_smi_topo(text):
    """Parse `nvidia-smi topo -m`: per GPU the CPU and NUMA affinity and the link to every peer."""
    header = None
    gpus = {}
    for line in _lines(text):
        if not line.strip():
            if header is not None:
                break
            continue
        if header is None and re.match(r"^\s+GPU0\b", line):
            header = re.split(r"\s{2,}|\t", line.strip())
            continue
        if header is None:
            continue
        cells = re.split(r"\s{2,}|\t", line.strip())
        name = cells[0].split()[0]
        values = [c.strip() for c in cells[1:]] if len(cells) > 1 else []
        if not name.startswith("GPU") or name.startswith("GPU NUMA"):
            continue
        row = dict(zip(header, values))
        gpus[name] = {
            "links": dict((k, v) for k, v in row.items() if re.match(r"^(GPU|NIC)\d+$", k)),
            "cpu_affinity": row.get("CPU Affinity"),
            "numa_affinity": _int(row.get("NUMA Affinity")),
        }
    return gpus


# ---------------------------------------------------------------------------------- lspci / PCIe

def _gts(value):
    match = re.match(r"^\s*([0-9.]+)\s*GT/s", value or "")
    return float(match.group(1)) if match else None


PCIE_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_gen(gts):
    return PCIE_GEN.get(gts) if gts else None


def parse_lspci_link(text):
    """LnkCap/LnkSta of one device from `lspci -vv -s <bdf>`."""
    cap = re.search(r"LnkCap:.*?Speed ([0-9.]+GT/s)[^,]*, Width x(\d+)", text or "")
    sta = re.search(r"LnkSta:\s*Speed ([0-9.]+GT/s)( \(downgraded\))?[^,]*, Width x(\d+)( \(downgraded\))?",
                    text or "")
    numa = re.search(r"NUMA node:\s*(-?\d+)", text or "")
    aspm = re.search(r"LnkCtl:\s*ASPM ([^;]+);", text or "")
    return {
        "max_speed_gts": _gts(cap.group(1)) if cap else None,
        "max_width": int(cap.group(2)) if cap else None,
        "current_speed_gts": _gts(sta.group(1)) if sta else None,
        "current_width": int(sta.group(3)) if sta else None,
        "speed_downgraded": bool(sta and sta.group(2)),
        "width_downgraded": bool(sta and sta.group(4)),
        "numa_node": int(numa.group(1)) if numa else None,
        "aspm": aspm.group(1).strip() if aspm else None,
    }


def parse_sysfs_link(current_speed, max_speed, current_width, max_width):
    """Values of /sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}."""
    return {
        "current_speed_gts": _gts(current_speed),
        "max_speed_gts": _gts(max_speed),
        "current_width": _int(current_width),
        "max_width": _int(max_width),
    }


# ----------------------------------------------------------------------------- small /proc, /sys

def parse_bracketed(text):
    """'default [performance] powersave' -> 'performance' (also THP's 'always [madvise] never')."""
    match = re.search(r"\[([^\]]+)\]", text or "")
    if match:
        return match.group(1)
    return (text or "").strip() or None


def parse_mokutil_sb_state(text):
    """`mokutil --sb-state` -> 'enabled' | 'disabled' | 'not_efi' | None (could not tell)."""
    low = (text or "").lower()
    if "secureboot enabled" in low:
        return "enabled"
    if "secureboot disabled" in low:
        return "disabled"
    if "efi variables are not supported" in low or "not supported on this system" in low:
        return "not_efi"
    return None


def parse_meminfo_total_gb(text):
    match = re.search(r"^MemTotal:\s+(\d+) kB", text or "", re.M)
    return round(int(match.group(1)) / 1024.0 / 1024.0, 1) if match else None


def parse_llama_log(text):
    """What an ik_llama.cpp / llama.cpp log tells about the host (threads, ISA, NUMA balancing)."""
    text = text or ""
    result = {"numa_balancing_warning": "/proc/sys/kernel/numa_balancing is enabled" in text,
              "cuda_devices": [], "features": {}, "n_threads": None, "n_threads_batch": None,
              "total_threads": None}
    for match in re.finditer(r"Device (\d+): (.+?), compute capability ([0-9.]+)", text):
        result["cuda_devices"].append({"index": int(match.group(1)), "name": match.group(2),
                                       "compute_capability": match.group(3)})
    mainline = re.search(r"n_threads = (\d+) \(n_threads_batch = (\d+)\) / (\d+)", text)
    ik = re.search(r"n_threads=(\d+) n_threads_batch=(\d+) total_threads=(\d+)", text)
    found = mainline or ik
    if found:
        result["n_threads"], result["n_threads_batch"], result["total_threads"] = [int(g) for g in found.groups()]
    for line in _lines(text):
        if "system_info" in line:
            for key, value in re.findall(r"([A-Z][A-Z0-9_]+) = (\d+)", line):
                result["features"][key] = value == "1"
    return result


# ------------------------------------------------------------------------------------ judging

def _check(check_id, status, observed, expected, why, remedy):
    return {"id": check_id, "status": status, "observed": observed, "expected": expected,
            "why": why, "remedy": remedy}


def _profile_get(profile, *path):
    value = profile or {}
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def evaluate(facts, profile, numa_balancing_fixed_later=True):
    """Judge gathered facts against the hardware profile (hmk_hardware). Returns the checks."""
    checks = []
    cpu = facts.get("cpu") or {}
    memory = facts.get("memory") or {}
    gpus = facts.get("gpus") or []
    virtual = " (virtual machine: the hypervisor decides this layout)" if cpu.get("hypervisor") else ""

    # NUMA nodes per socket (NPS).
    want_nps = _profile_get(profile, "cpu", "numa_nodes_per_socket") or 1
    sockets, nodes = cpu.get("sockets"), cpu.get("numa_nodes")
    why = ("NPS2/NPS4 split the routed experts over several nodes, so each thread reads most of the "
           "weights at remote bandwidth; KTransformers with USE_NUMA copies the experts per node.")
    remedy = ("BIOS: Advanced > AMD CBS > DF Common Options > Memory Addressing > NUMA nodes per socket "
              "= NPS1 (read it with `numactl --hardware` or `lscpu | grep NUMA`)")
    if not sockets or not nodes:
        checks.append(_check("numa_nodes_per_socket", "warn", UNKNOWN, want_nps, why,
                             "Read it with `lscpu` (Socket(s), NUMA node(s)) or `ls -d /sys/devices/system/node/node*`; "
                             + remedy))
    else:
        nps = nodes / float(sockets)
        nps = int(nps) if nps == int(nps) else round(nps, 2)
        checks.append(_check("numa_nodes_per_socket", "pass" if nps == want_nps else "fail", nps, want_nps,
                             why + virtual, remedy))

    # SMT.
    want_smt = bool(_profile_get(profile, "cpu", "smt"))
    smt = cpu.get("smt_active")
    why = ("Inference threads should equal physical cores; SMT siblings share the AVX-512 units and "
           "cost about 18% of generation speed.")
    remedy = ("BIOS: Advanced > AMD CBS > CPU Common Options > Performance > CCD/Core/Thread Enablement > "
              "SMT Control = Disable (runtime only: `echo off > /sys/devices/system/cpu/smt/control`)")
    want_text = "on" if want_smt else "off"
    if smt is None:
        checks.append(_check("smt_disabled", "warn", UNKNOWN, want_text, why,
                             "Read `/sys/devices/system/cpu/smt/active` or `lscpu | grep 'Thread(s) per core'`; "
                             + remedy))
    else:
        observed = "on" if smt else "off"
        checks.append(_check("smt_disabled", "pass" if smt == want_smt else "fail", observed, want_text,
                             why + virtual, remedy if not want_smt else "BIOS: SMT Control = Enable"))

    # Memory channels.
    per_socket = _profile_get(profile, "memory", "channels_per_socket")
    want_sockets = _profile_get(profile, "cpu", "sockets") or sockets or 1
    want_channels = per_socket * want_sockets if per_socket else None
    channels = memory.get("channels_populated")
    why = ("Generation speed is bound by DRAM bandwidth = channels x MT/s x 8 bytes; "
           "8 of 12 channels loses a third of it.")
    remedy = "Populate one identical DIMM in every memory channel (see the board manual's population table)"
    how = ("Read it with `dmidecode -t 17` as root (Size, Locator, Bank Locator); containers and some VMs "
           "expose no SMBIOS memory devices, so check on the host or the BMC. ")
    expected = "%s/%s" % (want_channels, want_channels) if want_channels else "all"
    if not memory.get("slots_populated"):
        checks.append(_check("memory_channels_populated", "warn", UNKNOWN, expected, why, how + remedy))
    else:
        total = memory.get("channels_total") or want_channels
        observed = "%s/%s" % (channels, total if total else "?")
        if memory.get("channel_source") != "labels":
            observed += " (at most; DIMM labels do not name channels)"
        status = "pass" if want_channels is None or channels >= want_channels else "fail"
        if want_channels is None:
            status = "warn"
        checks.append(_check("memory_channels_populated", status, observed, expected, why, remedy))

    # Memory speed.
    want_speed = _profile_get(profile, "memory", "min_speed_mts")
    speed = memory.get("configured_speed_mts")
    why = "Bandwidth scales with the configured MT/s; two DIMMs per channel or a BIOS limit downclock it."
    remedy = ("BIOS: Advanced > AMD CBS > UMC Common Options > DDR Options > DDR Timing Configuration > "
              "Memory Clock Speed = Auto/%s; use one DIMM per channel" % (want_speed or "rated"))
    expected = ">= %s MT/s" % want_speed if want_speed else "rated speed"
    if not speed:
        checks.append(_check("memory_speed", "warn", UNKNOWN, expected, why,
                             "Read 'Configured Memory Speed' in `dmidecode -t 17` as root (empty or Unknown "
                             "in containers and some firmware); " + remedy))
    else:
        observed = "%s MT/s" % speed
        if memory.get("rated_speed_mts") and memory["rated_speed_mts"] != speed:
            observed += " (rated %s MT/s)" % memory["rated_speed_mts"]
        if memory.get("bandwidth_gbs"):
            observed += ", %s GB/s theoretical" % memory["bandwidth_gbs"]
        status = "pass" if not want_speed or speed >= want_speed else "fail"
        checks.append(_check("memory_speed", status, observed, expected, why, remedy))

    # NUMA balancing.
    balancing = facts.get("numa_balancing")
    why = "Automatic NUMA page migration moves the experts around while serving (-50 to -65% generation)."
    remedy = ("The kernel_tuning role sets kernel.numa_balancing=0 later in site.yml; by hand: "
              "`sysctl -w kernel.numa_balancing=0` and persist it in /etc/sysctl.d/")
    if balancing is None:
        checks.append(_check("numa_balancing_disabled", "pass", "absent (kernel built without it)", 0, why,
                             "Nothing to do: /proc/sys/kernel/numa_balancing does not exist"))
    elif balancing == UNKNOWN:
        checks.append(_check("numa_balancing_disabled", "warn", UNKNOWN, 0, why,
                             "Read `cat /proc/sys/kernel/numa_balancing`; " + remedy))
    else:
        status = "pass" if balancing == 0 else ("warn" if numa_balancing_fixed_later else "fail")
        checks.append(_check("numa_balancing_disabled", status, balancing, 0, why, remedy))

    # PCIe ASPM.
    aspm = facts.get("pcie_aspm_policy")
    why = ("ASPM puts the GPU link into low-power states; waking it adds latency to every expert copy. "
           "`pcie_aspm=off` does not disable it (firmware settings stay).")
    remedy = ("Kernel command line `pcie_aspm.policy=performance` (kernel_tuning role) or BIOS: "
              "Advanced > PCI Subsystem Settings > ASPM Support = Disabled")
    if not aspm:
        checks.append(_check("pcie_aspm_policy", "warn", UNKNOWN, "performance", why,
                             "Read `cat /sys/module/pcie_aspm/parameters/policy` (bracketed value) or "
                             "`lspci -vv | grep 'LnkCtl:.*ASPM'`; " + remedy))
    else:
        status = "pass" if aspm == "performance" else ("fail" if aspm.startswith("powersave") or
                                                       aspm.startswith("powersupersave") else "warn")
        checks.append(_check("pcie_aspm_policy", status, aspm, "performance", why, remedy))

    # GPUs present.
    want_gpus = _profile_get(profile, "gpus", "count") or 0
    want_model = _profile_get(profile, "gpus", "model")
    why = "Attention, shared experts and the KV cache run on the GPU; a missing card breaks the hybrid split."
    remedy = ("Seat the card in an x16 slot, check its power cables and BIOS: Advanced > PCI Subsystem "
              "Settings > Above 4G Decoding = Enabled, Re-Size BAR = Enabled; list with `lspci -d 10de:`")
    observed = "%d (%s)" % (len(gpus), ", ".join("%s %s" % (g["pci_address"], g.get("model") or "?") for g in gpus)) \
        if gpus else 0
    expected = "%d%s" % (want_gpus, " x %s" % want_model if want_model and want_gpus else "")
    status = "pass" if len(gpus) == want_gpus else ("fail" if len(gpus) < want_gpus else "warn")
    checks.append(_check("gpu_present", status, observed, expected, why, remedy))

    # GPU PCIe link: width is wiring (fail); a lower speed is usually idle power saving (warn).
    want_width = _profile_get(profile, "gpus", "min_link_width") or 16
    why = ("Prompt processing copies CPU-resident experts to the GPU over PCIe; a narrow link caps it. "
           "GPUs drop to Gen1 at idle, so only the width is judged strictly.")
    remedy = ("Width: reseat the card in a CPU-attached x16 slot, check BIOS slot bifurcation (x16) and risers. "
              "Speed: re-check under load (`nvidia-smi -q -d PCIE` while serving); BIOS: PCIe link speed = Auto")
    if not gpus:
        checks.append(_check("gpu_pcie_link", "pass" if not want_gpus else "warn", "no GPU", "x%d" % want_width,
                             why, remedy))
    else:
        status, parts = "pass", []
        for g in gpus:
            link = g.get("link") or {}
            cw, mw = link.get("current_width"), link.get("max_width")
            cs, ms = link.get("current_speed_gts"), link.get("max_speed_gts")
            if cw is None or cs is None:
                parts.append("%s unknown" % g["pci_address"])
                status = "warn" if status == "pass" else status
                continue
            text = "%s x%s/%s %sGT/s/%sGT/s" % (g["pci_address"], cw, "x%s" % mw if mw else "?", cs, ms)
            if cw < want_width or (mw and cw < mw):
                status = "fail"
                text += " width downgraded"
            elif ms and cs < ms:
                status = "warn" if status == "pass" else status
                text += " speed downgraded (idle?)"
            parts.append(text)
        checks.append(_check("gpu_pcie_link", status, "; ".join(parts),
                             "x%d at max speed (speed judged under load)" % want_width, why, remedy))

    # GPU NUMA node.
    why = "On multi-node boxes, threads and buffers should sit on the GPU's node; -1 means firmware did not say."
    remedy = ("BIOS: enable ACPI SRAT L3 cache as NUMA domain = Disabled and keep NPS1; read "
              "`cat /sys/bus/pci/devices/<bdf>/numa_node`")
    if not gpus:
        checks.append(_check("gpu_numa_node", "pass", "no GPU", "known node or single node", why, remedy))
    else:
        unknown = [g["pci_address"] for g in gpus if g.get("numa_node") in (None, -1)]
        observed = ", ".join("%s node %s" % (g["pci_address"], g.get("numa_node")) for g in gpus)
        status = "warn" if unknown and (nodes or 1) > 1 else "pass"
        checks.append(_check("gpu_numa_node", status, observed, "known node or single node", why, remedy))

    # GPU VRAM.
    want_vram = _profile_get(profile, "gpus", "vram_gib")
    why = "The VRAM decides how many layers, which context length and which KV cache fit on the GPU."
    remedy = "Install the driver (gpu_driver role) and read `nvidia-smi --query-gpu=name,memory.total --format=csv`"
    expected = ">= %s GiB" % want_vram if want_vram else "any"
    if not gpus:
        checks.append(_check("gpu_vram", "pass" if not want_gpus else "warn", "no GPU", expected, why, remedy))
    else:
        vram = [g.get("vram_mib") for g in gpus]
        if any(v is None for v in vram):
            checks.append(_check("gpu_vram", "warn", UNKNOWN, expected, why,
                                 "nvidia-smi is not working yet (no driver?): " + remedy))
        else:
            observed = ", ".join("%.0f GiB" % (v / 1024.0) for v in vram)
            ok = not want_vram or all(v / 1024.0 >= want_vram * 0.95 for v in vram)
            checks.append(_check("gpu_vram", "pass" if ok else "fail", observed, expected, why,
                                 "Use the GPU model the profile names, or pick the profile that matches the card"))

    # CPU ISA.
    required = list(_profile_get(profile, "cpu", "isa_required") or [])
    flags = set(cpu.get("flags") or [])
    why = "GGML_NATIVE builds for the CPU it runs on; the profile's build flags assume these extensions."
    remedy = "Choose the hardware profile that matches this CPU (AVX2-only Zen 3 vs AVX-512 Zen 4)"
    if not flags:
        checks.append(_check("cpu_isa", "warn", UNKNOWN, required, why, "Read `grep -m1 flags /proc/cpuinfo`; " + remedy))
    else:
        missing = [f for f in required if f not in flags]
        observed = [f for f in ISA_FLAGS if f in flags] or ["no AVX2/AVX-512/AMX flags visible"]
        if missing:
            observed = observed + ["missing: " + ", ".join(missing)]
        if missing and cpu.get("hypervisor"):
            remedy = ("Not visible in this VM (the hypervisor masks them); pass the host CPU through "
                      "(`-cpu host`, libvirt host-passthrough) or run on the host. " + remedy)
        checks.append(_check("cpu_isa", "fail" if missing else "pass", observed, required, why, remedy))

    # Secure Boot.
    sb = facts.get("secure_boot")
    why = "With Secure Boot on, unsigned NVIDIA kernel modules do not load."
    remedy = ("BIOS: Security > Secure Boot = Disabled, or enroll a MOK and sign the modules "
              "(`mokutil --import`); read it with `mokutil --sb-state`")
    if sb in ("disabled", "not_efi"):
        checks.append(_check("secure_boot", "pass", "not EFI (legacy boot)" if sb == "not_efi" else "disabled",
                             "disabled or not EFI", why, remedy))
    elif sb == "enabled":
        checks.append(_check("secure_boot", "warn" if want_gpus else "pass", "enabled", "disabled or not EFI",
                             why, remedy))
    else:
        checks.append(_check("secure_boot", "warn", UNKNOWN, "disabled or not EFI", why,
                             "Install mokutil or read /sys/firmware/efi/efivars/SecureBoot-*; " + remedy))

    # Free space at the models path.
    want_free = _profile_get(profile, "models_min_free_gb")
    disk = facts.get("models_disk") or {}
    why = "The models (143-404 GB) need room for the download and its verification before the swap."
    remedy = ("Mount an NVMe volume at %s or free space there (`df -h %s`)"
              % (disk.get("path") or "the models path", disk.get("path") or "<models_path>"))
    expected = ">= %s GB" % want_free if want_free else "any"
    if disk.get("free_gb") is None:
        checks.append(_check("model_disk_space", "warn", UNKNOWN, expected, why, remedy))
    else:
        observed = "%s GB free on %s" % (disk["free_gb"], disk.get("checked_path"))
        ok = not want_free or disk["free_gb"] >= want_free
        checks.append(_check("model_disk_space", "pass" if ok else "warn", observed, expected, why,
                             remedy + " (warn only: a node that already holds its models has less free space)"))
    return checks


def apply_waivers(checks, waived):
    """Waived failing checks become 'warn' and say so; the report keeps the original status."""
    result = []
    for check in checks:
        check = dict(check)
        if check["id"] in (waived or []) and check["status"] == "fail":
            check["status"] = "warn"
            check["waived"] = True
        result.append(check)
    return result


def summarize(checks):
    counts = {"pass": 0, "warn": 0, "fail": 0}
    for check in checks:
        counts[check["status"]] += 1
    counts["failed_ids"] = [c["id"] for c in checks if c["status"] == "fail"]
    return counts


def _text(value):
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "-"
    return str(value)


def render_table(checks, width=36):
    """Fixed-width table for the play output; long observed values are cut here, not in the report."""
    def cut(value):
        value = _text(value)
        return value if len(value) <= width else value[:width - 3] + "..."

    rows = [("STATUS", "CHECK", "OBSERVED", "EXPECTED")]
    rows += [(c["status"].upper(), c["id"], cut(c["observed"]), _text(c["expected"])) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["%s  %s  %s  %s" % (r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]), r[3])
             for r in rows]
    for c in checks:
        if c["status"] != "pass":
            lines.append("%s (%s): %s" % (c["id"], c["status"], c["remedy"]))
    return "\n".join(lines)


def render_markdown(host, checks, facts, summary):
    """The preflight.md report."""
    out = ["<!-- Written by the bios_checklist role (hybrid-moe-kit); regenerated on every run. -->",
           "# Preflight report: %s" % host, "",
           "%d pass, %d warn, %d fail%s" % (summary["pass"], summary["warn"], summary["fail"],
                                            (": " + ", ".join(summary["failed_ids"])) if summary["failed_ids"] else ""),
           "", "| status | check | observed | expected |", "|---|---|---|---|"]
    for c in checks:
        out.append("| %s | %s | %s | %s |" % (c["status"], c["id"], _text(c["observed"]).replace("|", "/"),
                                               _text(c["expected"]).replace("|", "/")))
    out += ["", "## Findings", ""]
    for c in checks:
        if c["status"] != "pass":
            out.append("- **%s** (%s%s): %s Remedy: %s" % (c["id"], c["status"], ", waived" if c.get("waived") else "",
                                                          c["why"], c["remedy"]))
    if all(c["status"] == "pass" for c in checks):
        out.append("- none")
    cpu = facts.get("cpu") or {}
    memory = facts.get("memory") or {}
    out += ["", "## Hardware", "",
            "- CPU: %s, %s socket(s), %s physical cores, %s thread(s)/core, %s NUMA node(s)"
            % (cpu.get("model"), cpu.get("sockets"), cpu.get("physical_cores"), cpu.get("threads_per_core"),
               cpu.get("numa_nodes")),
            "- Memory: %s GB total, %s of %s DIMM slots, %s MT/s, %s GB/s theoretical"
            % (facts.get("memory_total_gb"), memory.get("slots_populated"), memory.get("slots_total"),
               memory.get("configured_speed_mts"), memory.get("bandwidth_gbs")),
            "- GPUs: %s" % (", ".join("%s %s" % (g["pci_address"], g.get("model")) for g in facts.get("gpus") or [])
                            or "none"),
            "- Transparent hugepages: %s" % facts.get("transparent_hugepages"),
            "- Kernel command line: `%s`" % facts.get("cmdline"), ""]
    return "\n".join(out)
