# -*- coding: utf-8 -*-
# The one hardware-parsing and judging package of the kit: the preflight (bios_checklist role, through the
# hmk_hardware_facts module), the doctor and validate (filter plugins) all read command output through these
# functions, so a node is judged the same way everywhere.
#
# Nothing here touches the system: every function takes command output (or already parsed facts) and returns
# plain data, so tests/unit/test_hmk_hardware.py feeds it real outputs saved as fixtures.
#
# A fact that cannot be read is never None, an empty list or False: it is the marker unknown(reason), a dict
# {"unknown": "<why>"}, so a caller that forgets to check cannot read "no AVX-512" or "0 channels" out of it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_engine_log

UNKNOWN = "unknown"

# ISA flags the report always lists, as /proc/cpuinfo spells them.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512vbmi", "amx_tile",
             "amx_int8", "amx_bf16")

CHECK_IDS = ("platform", "numa_nodes_per_socket", "numa_memory_only_nodes", "numa_memoryless_cpu_nodes",
             "numa_memory_placement", "smt_disabled", "memory_channels_populated", "memory_speed",
             "numa_balancing_disabled", "pcie_aspm_policy", "gpu_present", "gpu_pcie_link", "gpu_numa_node",
             "gpu_vram", "cpu_isa", "secure_boot", "model_disk_space")

# What a judge concludes, before a caller maps it to its own scale (preflight pass/warn/fail, doctor
# ok/info/warning/critical): ok; minor (a measurable loss or a risk); bad (a large loss); unknown (could not be
# read: never a pass); absent (nothing to judge, e.g. no GPU on a CPU-only profile); hidden (a virtual machine
# cannot see it: the host's BIOS decides).
VERDICTS = ("ok", "minor", "bad", "unknown", "absent", "hidden")
PREFLIGHT_STATUS = {"ok": "pass", "minor": "warn", "bad": "fail", "unknown": "warn", "absent": "pass",
                    "hidden": "warn"}


def unknown(reason):
    """The marker of a fact that could not be read, with the reason."""
    return {UNKNOWN: str(reason)}


def is_unknown(value):
    return isinstance(value, dict) and UNKNOWN in value and len(value) == 1


def known(value):
    return value is not None and not is_unknown(value)


def why_unknown(value):
    return value[UNKNOWN] if is_unknown(value) else ""


def _lines(text):
    return (text or "").replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _int(value, default=None):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _known_int(value, reason):
    number = _int(value)
    return number if number is not None else unknown(reason)


def parse_cpulist(text):
    """A CPU or node list in any of the forms the tools print, as sorted numbers.

    sysfs/lscpu '0-3,8,10-11'; numactl's plain '0 1 2 3'; numactl --cpu-compress '0-15, 32-47 (32)' (the count
    in parentheses is not a CPU).
    """
    text = re.sub(r"\(\d+\)\s*$", "", (text or "").strip())
    cpus = []
    for part in re.split(r"[,\s]+", text):
        if not part:
            continue
        match = re.match(r"^(\d+)(?:-(\d+))?$", part)
        if not match:
            raise ValueError("not a CPU list: %r" % text)
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        cpus.extend(range(low, high + 1))
    return sorted(set(cpus))


# ------------------------------------------------------------------------------------------- CPU

_LSCPU_KEY = re.compile(r"^(\s*)([A-Za-z][^:]*?):\s*(.*)$")


def _lscpu_raw(text):
    """Key/value pairs of `LANG=C lscpu`, flat (util-linux < 2.38) or nested layout.

    The nested layout wraps the Flags value at a fixed width and may split a flag mid-word ("a" /
    "md_lbr_v2"): continuation lines are joined back by cutting exactly the value column, never by splitting
    on whitespace first.
    """
    raw = {}
    flags_text = None
    value_col = 0
    for line in _lines(text):
        if flags_text is not None:
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
        raw.setdefault(key, value)
    if flags_text is not None:
        raw["Flags"] = flags_text
    return raw


def parse_lscpu(text):
    """Topology, identity and flags from `LANG=C lscpu`; every missing fact is unknown(reason)."""
    raw = _lscpu_raw(text)
    if not raw:
        reason = "no lscpu output"
        return {"model": unknown(reason), "vendor": unknown(reason), "family": unknown(reason),
                "model_number": unknown(reason), "cpus": unknown(reason), "sockets": unknown(reason),
                "cores_per_socket": unknown(reason), "threads_per_core": unknown(reason),
                "physical_cores": unknown(reason), "numa_nodes": unknown(reason), "numa_node_cpus": unknown(reason),
                "flags": unknown(reason), "hypervisor": unknown(reason), "hypervisor_vendor": unknown(reason)}

    def field(key):
        return _known_int(raw.get(key), "lscpu prints no '%s' line" % key)

    sockets, cores = field("Socket(s)"), field("Core(s) per socket")
    node_cpus = {}
    for key, value in raw.items():
        node = re.match(r"^NUMA node(\d+) CPU\(s\)$", key)
        if node:
            node_cpus[int(node.group(1))] = parse_cpulist(value)
    flags = sorted(set(raw["Flags"].split())) if "Flags" in raw else unknown("lscpu prints no 'Flags' line")
    hypervisor_vendor = raw.get("Hypervisor vendor")
    if hypervisor_vendor:
        hypervisor = True
    elif known(flags):
        hypervisor = "hypervisor" in flags
    else:
        hypervisor = unknown("lscpu prints neither Flags nor 'Hypervisor vendor'")
    return {
        "model": raw.get("Model name") or unknown("lscpu prints no 'Model name' line"),
        "vendor": raw.get("Vendor ID") or unknown("lscpu prints no 'Vendor ID' line"),
        "family": field("CPU family"),
        "model_number": field("Model"),
        "cpus": field("CPU(s)"),
        "sockets": sockets,
        "cores_per_socket": cores,
        "threads_per_core": field("Thread(s) per core"),
        "physical_cores": sockets * cores if known(sockets) and known(cores) else
        unknown("needs Socket(s) and Core(s) per socket"),
        "numa_nodes": field("NUMA node(s)"),
        "numa_node_cpus": node_cpus or unknown("lscpu prints no 'NUMA nodeN CPU(s)' lines"),
        "flags": flags,
        "hypervisor": hypervisor,
        "hypervisor_vendor": hypervisor_vendor or (
            unknown("no 'Hypervisor vendor' line") if hypervisor is not False else "none"),
    }


def parse_cpuinfo(text):
    """/proc/cpuinfo: identity and flags of the first processor, and each logical CPU's package and core."""
    first, cpus, current = {}, {}, {}
    for line in _lines(text) + [""]:
        if not line.strip():
            if "processor" in current:
                cpu = _int(current["processor"])
                if cpu is not None:
                    cpus[cpu] = {"package": _int(current.get("physical id")), "core": _int(current.get("core id"))}
                if not first:
                    first = dict(current)
            current = {}
            continue
        match = re.match(r"^([^:]+?)\s*:\s*(.*)$", line)
        if match:
            current[match.group(1).strip()] = match.group(2).strip()
    if not first:
        reason = "no processor entries in /proc/cpuinfo"
        return {"vendor": unknown(reason), "family": unknown(reason), "model_number": unknown(reason),
                "model": unknown(reason), "flags": unknown(reason), "topology": unknown(reason)}
    return {
        "vendor": first.get("vendor_id") or unknown("no vendor_id line"),
        "family": _known_int(first.get("cpu family"), "no 'cpu family' line"),
        "model_number": _known_int(first.get("model"), "no 'model' line"),
        "model": first.get("model name") or unknown("no 'model name' line"),
        "flags": sorted(set(first["flags"].split())) if "flags" in first else unknown("no flags line"),
        "topology": cpus if all(c["package"] is not None for c in cpus.values()) else
        unknown("/proc/cpuinfo has no 'physical id' per processor"),
    }


def cpu_flags(value):
    """Normalise CPU flags: a /proc/cpuinfo 'flags : a b c' (x86) or 'Features : ...' (arm) line, a plain string
    or a list; sorted, lower case, without duplicates."""
    if value is None:
        return []
    if isinstance(value, (list, tuple, set)):
        return sorted({str(v).strip().lower() for v in value if str(v).strip()})
    text = str(value)
    flags = set()
    for line in text.splitlines() or [text]:
        if ":" in line:
            key, _unused, rest = line.partition(":")
            if key.strip() not in ("flags", "Features"):
                continue
            line = rest
        flags.update(word.lower() for word in line.split())
    return sorted(flags)


def isa_summary(flags):
    """Which of the ISA extensions that decide build flags are visible."""
    if not known(flags):
        return unknown(why_unknown(flags) or "no CPU flags")
    present = set(flags)
    summary = dict((flag, flag in present) for flag in ISA_FLAGS)
    summary["amx"] = any(flag.startswith("amx") for flag in present)
    return summary


# AMD server generations by (family, model range), with what the kit needs to know of each: memory channels
# per socket, and whether the NUMA layout is an NPS setting or the die layout.
_AMD_GENERATIONS = (
    (0x17, 0x00, 0x0F, "naples", "EPYC 7001 (Naples, Zen 1)", 8),
    (0x17, 0x30, 0x3F, "rome", "EPYC 7002 (Rome, Zen 2)", 8),
    (0x19, 0x00, 0x0F, "milan", "EPYC 7003 (Milan, Zen 3)", 8),
    (0x19, 0x10, 0x1F, "genoa", "EPYC 9004 (Genoa, Zen 4)", 12),
    (0x19, 0xA0, 0xAF, "siena", "EPYC 8004/9004 (Siena/Bergamo, Zen 4c)", None),
    (0x19, 0x60, 0x6F, "am5", "EPYC 4004 / Ryzen 7000 (AM5, Zen 4)", 2),
    (0x1A, 0x00, 0x1F, "turin", "EPYC 9005 (Turin, Zen 5)", 12),
)
# Intel server generations by family 6 model number: name and DDR channels per socket.
_INTEL_GENERATIONS = {
    85: ("skylake_sp", "Xeon Scalable 1st/2nd gen (Skylake-SP/Cascade Lake)", 6),
    106: ("icelake_sp", "Xeon Scalable 3rd gen (Ice Lake-SP)", 8),
    143: ("sapphire_rapids", "Xeon Scalable 4th gen / Xeon Max (Sapphire Rapids)", 8),
    207: ("emerald_rapids", "Xeon Scalable 5th gen (Emerald Rapids)", 8),
    173: ("granite_rapids", "Xeon 6 (Granite Rapids)", 12),
    175: ("sierra_forest", "Xeon 6 (Sierra Forest)", 12),
}


def cpu_generation(vendor, family, model_number, model_name=""):
    """{key, name, vendor, channels_per_socket} from the CPU family and model; unknown where they do not say."""
    vendor = vendor if known(vendor) else ""
    if not known(family) or not known(model_number):
        return {"key": UNKNOWN, "name": "CPU family/model not readable", "vendor": vendor or UNKNOWN,
                "channels_per_socket": unknown("CPU family/model not readable")}
    if "AMD" in vendor:
        for fam, low, high, key, name, channels in _AMD_GENERATIONS:
            if family == fam and low <= model_number <= high:
                if key == "siena" and "EPYC 97" in str(model_name):
                    name, channels = "EPYC 97x4 (Bergamo, Zen 4c)", 12
                elif key == "siena":
                    channels = 6
                return {"key": key, "name": name, "vendor": "amd", "channels_per_socket": channels}
        return {"key": "amd_other", "name": "AMD family %#x model %#x" % (family, model_number), "vendor": "amd",
                "channels_per_socket": unknown("AMD family %#x model %#x is not a known EPYC" % (family, model_number))}
    if "Intel" in vendor:
        if family == 6 and model_number in _INTEL_GENERATIONS:
            key, name, channels = _INTEL_GENERATIONS[model_number]
            return {"key": key, "name": name, "vendor": "intel", "channels_per_socket": channels}
        return {"key": "intel_other", "name": "Intel family %d model %d" % (family, model_number), "vendor": "intel",
                "channels_per_socket": unknown("Intel family %d model %d is not a known Xeon" % (family, model_number))}
    return {"key": "other", "name": str(model_name or vendor or "unknown CPU"), "vendor": vendor or UNKNOWN,
            "channels_per_socket": unknown("not an x86 server CPU the kit knows")}


# DMI system vendors/products that only virtual machines report (QEMU/KVM, VMware, Hyper-V, VirtualBox, Xen,
# clouds). Amazon's "Amazon EC2" also names bare-metal instances, so it counts only with the hypervisor flag.
_VM_DMI = (r"^QEMU", r"^KVM", r"Standard PC \((Q35|i440FX)", r"^VMware", r"^VirtualBox", r"^innotek", r"^Xen",
           r"^HVM domU", r"^Bochs", r"^Parallels", r"^Google Compute Engine", r"^OpenStack", r"^oVirt",
           r"^RHEV", r"^Microsoft Corporation.*Virtual Machine", r"^Virtual Machine$", r"^Red Hat KVM",
           r"^Nutanix AHV", r"^BHYVE", r"^Apple Virtualization")


def parse_dmi_system(text):
    """System manufacturer and product from `dmidecode -t 1` (or a full dmidecode)."""
    system, block = {}, False
    for line in _lines(text):
        if re.match(r"^Handle 0x[0-9A-Fa-f]+, DMI type 1,", line):
            block = True
            continue
        if block and not line.strip():
            break
        match = re.match(r"^\s+(Manufacturer|Product Name):\s*(.*?)\s*$", line) if block else None
        if match:
            system[match.group(1)] = match.group(2)
    return {"sys_vendor": system.get("Manufacturer") or unknown("no DMI type 1 Manufacturer"),
            "product_name": system.get("Product Name") or unknown("no DMI type 1 Product Name")}


def detect_platform(cpu, dmi=None, detect_virt=None, declared="auto"):
    """Whether the node is bare metal or a virtual machine, and from what evidence.

    declared: the profile's `platform` (auto | bare_metal | virtual). A twin that stands in for a bare-metal
    node declares bare_metal: it is judged as the machine whose layout it emulates, and the report says so.
    """
    evidence = []
    cpu = cpu or {}
    if cpu.get("hypervisor") is True:
        vendor = cpu.get("hypervisor_vendor")
        evidence.append("CPU hypervisor flag%s" % (" (%s)" % vendor if known(vendor) and vendor != "none" else ""))
    dmi = dmi or {}
    label = " ".join(str(dmi.get(k)) for k in ("sys_vendor", "product_name") if known(dmi.get(k)))
    if label and any(re.search(pattern, str(dmi.get(k)))
                     for pattern in _VM_DMI for k in ("sys_vendor", "product_name") if known(dmi.get(k))):
        evidence.append("DMI system '%s'" % label)
    if known(detect_virt) and detect_virt not in ("", "none"):
        evidence.append("systemd-detect-virt --vm: %s" % detect_virt)
    detected = "virtual" if evidence else "bare_metal"
    if declared in ("bare_metal", "virtual"):
        kind = declared
        source = "declared in the profile (platform: %s)" % declared
    else:
        kind, source = detected, "detected"
    return {"kind": kind, "detected": detected, "source": source,
            "evidence": evidence or ["no hypervisor flag, no virtual DMI system"]}


# --------------------------------------------------------------------------------------------- NUMA

def _size_mb(text):
    match = re.match(r"^\s*(\d+)\s*MB", text or "")
    if match:
        return int(match.group(1))
    return unknown("size %r is not a number of MB" % (text or "").strip())


def parse_numactl(text):
    """`numactl --hardware`, plain or --cpu-compress: nodes with CPUs and memory, and the distances."""
    nodes, distances, in_distances = {}, [], False
    for line in _lines(text):
        line = line.strip()
        match = re.match(r"^node (\d+) (cpus|size|free)\s*:\s*(.*)$", line)
        if match:
            node = nodes.setdefault(int(match.group(1)), {"cpus": [], "size_mb": unknown("no size line"),
                                                          "free_mb": unknown("no free line")})
            if match.group(2) == "cpus":
                node["cpus"] = parse_cpulist(match.group(3))
            else:
                node[match.group(2) + "_mb"] = _size_mb(match.group(3))
            continue
        if line.startswith("node distances"):
            in_distances = True
            continue
        if in_distances:
            row = re.match(r"^(\d+):\s+(.*)$", line)
            if row:
                distances.append([int(v) for v in row.group(2).split()])
    if not nodes:
        return {"node_count": unknown("no 'node N cpus:' lines in the numactl output"), "nodes": {},
                "distances": unknown("no numactl output"), "remote_distances": unknown("no numactl output")}
    remote = sorted(set(v for i, row in enumerate(distances) for j, v in enumerate(row) if i != j))
    return {"node_count": len(nodes), "nodes": nodes,
            "distances": distances or unknown("numactl printed no distance table"),
            "remote_distances": remote or unknown("numactl printed no distance table")}


def numa_layout(nodes):
    """Classify NUMA nodes: CPU-bearing ones per socket, memory-only ones, memory-less CPU ones.

    nodes: {id: {"cpus": [...] or "0-15,32-47", "size_mb": int | unknown, "packages": [socket ids]}} from
    sysfs (the module adds the packages of each node's CPUs) or numactl (no packages: sockets not known).
    """
    if not nodes:
        reason = unknown("no NUMA node list")
        return {"cpu_nodes": reason, "memory_only": reason, "memoryless_cpu": reason, "per_socket": reason}
    nodes = dict((int(k), _node(v)) for k, v in nodes.items())
    cpu_nodes = sorted(n for n, node in nodes.items() if node["cpus"])
    memory_only = [{"node": n, "size_mb": node["size_mb"]} for n, node in sorted(nodes.items())
                   if not node["cpus"] and known(node["size_mb"]) and node["size_mb"] > 0]
    memoryless = [n for n in cpu_nodes if known(nodes[n]["size_mb"]) and nodes[n]["size_mb"] == 0]
    per_socket = {}
    for n in cpu_nodes:
        packages = nodes[n].get("packages")
        if not packages or not known(packages):
            per_socket = unknown("which socket each node sits on is not known")
            break
        if len(packages) != 1:
            per_socket = unknown("node %d spans sockets %s" % (n, ", ".join(str(p) for p in packages)))
            break
        per_socket.setdefault(str(packages[0]), []).append(n)
    return {"cpu_nodes": cpu_nodes, "memory_only": memory_only, "memoryless_cpu": memoryless,
            "per_socket": per_socket}


def _node(node):
    node = dict(node or {})
    cpus = node.get("cpus")
    node["cpus"] = parse_cpulist(cpus) if isinstance(cpus, str) else list(cpus or [])
    node.setdefault("size_mb", unknown("node memory size not read"))
    return node


# ---------------------------------------------------------------------------------------- dmidecode

def _mts(value):
    match = re.match(r"^\s*(\d+)\s*(MT/s|MHz)", value or "")
    return int(match.group(1)) if match else None


def _size_gb(value):
    match = re.match(r"^\s*(\d+)\s*(kB|MB|GB|TB)\b", value or "")
    if not match:
        return None
    factor = {"kB": 1.0 / (1024 * 1024), "MB": 1.0 / 1024, "GB": 1, "TB": 1024}[match.group(2)]
    return int(match.group(1)) * factor


_NOT_SPECIFIED = re.compile(r"(?i)^\s*(not specified|unknown|none|to be filled.*)?\s*$")


def dimm_location(locator, bank_locator):
    """Where a DIMM sits, read from the vendor's labels: {socket, channel, dimm, convention}.

    socket and channel are None where the labels do not say (Dell 'A1', HPE 'PROC 1 DIMM 1', Lenovo 'DIMM 3'
    name the slot, not the channel). Conventions read: AMD reference BIOS bank locators ('P0 CHANNEL A',
    'P0_Node0_Channel0_Dimm0'; ASRock Rack, Tyan, HPE Cray, the twin), letter+slot locators (Supermicro
    'P1-DIMMA1'/'DIMMA1', ASUS 'DIMM_A1', HPE Cray 'CPU1_DIMM_A1', Gigabyte 'DIMM_P0_A0', Tyan 'P0_UMC0_CH_A0'),
    and the socket-only ones (Dell 'A1'/'B1' for CPU1/CPU2, HPE 'PROC 2 DIMM 5', Lenovo bank 'CPU 2').
    """
    locator, bank = (locator or "").strip(), (bank_locator or "").strip()
    for label in (bank, locator):
        match = re.search(r"(?i)^\s*(?:p|cpu|socket)[\s_]*(\d+)[\s_-]*(?:node\d+[\s_]*)?channel[\s_]*([0-9a-z]+)"
                          r"(?:[\s_]*dimm[\s_]*(\d+))?", label)
        if match:
            return {"socket": match.group(1), "channel": match.group(2).upper(),
                    "dimm": _int(match.group(3)), "convention": "bank-locator channel"}
    match = re.match(r"(?i)^(?:p|cpu)(\d+)[-_]?dimm[-_]?([a-z])(\d+)$", locator) or \
        re.match(r"(?i)^()dimm[-_]?([a-z])(\d+)$", locator)
    if match:
        return {"socket": match.group(1) or "0", "channel": match.group(2).upper(), "dimm": int(match.group(3)),
                "convention": "letter channel, digit slot"}
    match = re.match(r"(?i)^dimm_p(\d+)_([a-z])(\d+)$", locator)
    if match:
        return {"socket": match.group(1), "channel": match.group(2).upper(), "dimm": int(match.group(3)),
                "convention": "Gigabyte DIMM_Pn_<channel><slot>"}
    match = re.match(r"(?i)^p(\d+)_umc\d+_ch_([a-z])(\d+)$", locator)
    if match:
        return {"socket": match.group(1), "channel": match.group(2).upper(), "dimm": int(match.group(3)),
                "convention": "Tyan Pn_UMCm_CH_<channel><slot>"}
    match = re.match(r"(?i)^(?:proc|cpu)\s*(\d+)\s+dimm\s*(\d+)$", locator)
    if match:
        return {"socket": match.group(1), "channel": None, "dimm": int(match.group(2)),
                "convention": "HPE PROC n DIMM m (slot, not channel)"}
    match = re.match(r"^([A-H])(\d{1,2})$", locator)
    if match and _NOT_SPECIFIED.match(bank):
        return {"socket": str(ord(match.group(1)) - ord("A") + 1), "channel": None, "dimm": int(match.group(2)),
                "convention": "Dell <socket letter><slot> (slot, not channel)"}
    bank_cpu = re.match(r"(?i)^cpu\s*(\d+)$", bank)
    if bank_cpu:
        return {"socket": bank_cpu.group(1), "channel": None, "dimm": _int(re.sub(r"\D", "", locator)),
                "convention": "Lenovo DIMM n / CPU m (slot, not channel)"}
    return {"socket": None, "channel": None, "dimm": None, "convention": "labels name neither socket nor channel"}


def _dmi_blocks(text, dmi_type):
    blocks, block = [], None
    for line in _lines(text) + [""]:
        if re.match(r"^Handle 0x[0-9A-Fa-f]+, DMI type %d," % dmi_type, line):
            block = {}
            continue
        if block is None:
            continue
        if not line.strip() or line.startswith("Handle "):
            blocks.append(block)
            block = None
            continue
        match = re.match(r"^\s+([^:]+):\s*(.*?)\s*$", line)
        if match:
            block.setdefault(match.group(1), match.group(2))
    return blocks


def parse_dmidecode_memory(text, channels_per_socket=None):
    """`dmidecode -t 17` (or a full dmidecode): every slot, and which channels the DIMMs populate.

    channels_per_socket: the CPU's memory channels (hardware profile, or the CPU generation). With it the
    channel count can be told even where labels do not name channels: a socket whose every slot is populated
    has every channel populated, and a board with one slot per channel maps slots to channels. Otherwise the
    count is unknown with the reason, and channels_upper_bound says at most how many can be populated.
    """
    slots = []
    for d in _dmi_blocks(text, 17):
        size = _size_gb(d.get("Size", ""))
        populated = size is not None
        location = dimm_location(d.get("Locator"), d.get("Bank Locator"))
        slots.append({
            "locator": d.get("Locator", ""),
            "bank_locator": d.get("Bank Locator", ""),
            "populated": populated,
            "size_gb": size if populated else 0,
            "type": d.get("Type", UNKNOWN) if populated else None,
            "speed_mts": _mts(d.get("Speed")) if populated else None,
            "configured_speed_mts": _mts(d.get("Configured Memory Speed") or d.get("Configured Clock Speed"))
            if populated else None,
            "rank": _int(d.get("Rank")) if populated else None,
            "socket": location["socket"],
            "channel": (location["socket"], location["channel"]) if location["channel"] else None,
            "dimm": location["dimm"],
            "convention": location["convention"],
        })
    populated = [s for s in slots if s["populated"]]
    speeds = [s["configured_speed_mts"] for s in populated if s["configured_speed_mts"]]
    rated = [s["speed_mts"] for s in populated if s["speed_mts"]]
    if not slots:
        reason = "dmidecode lists no memory device (no SMBIOS type 17: a container, or firmware without it)"
    elif not populated:
        reason = "dmidecode lists %d slots and none populated" % len(slots)
    else:
        reason = None
    result = {
        "slots_total": len(slots),
        "slots_populated": len(populated),
        "slots": slots,
        "total_gb": sum(s["size_gb"] for s in populated),
        "types": sorted(set(s["type"] for s in populated if s["type"])),
        "rated_speed_mts": min(rated) if rated and len(rated) == len(populated) else
        unknown(reason or "a populated DIMM reports no rated Speed"),
        "configured_speed_mts": min(speeds) if populated and len(speeds) == len(populated) else
        unknown(reason or "a populated DIMM reports no Configured Memory Speed (Unknown)"),
        "speeds_mixed": len(set(speeds)) > 1,
    }
    result.update(_channels(slots, populated, channels_per_socket, reason))
    result["bandwidth_gbs"] = theoretical_bandwidth_gbs(result["channels_populated"], result["configured_speed_mts"])
    return result


def _channels(slots, populated, channels_per_socket, reason):
    """Channel count, total, DIMMs per channel and how they were told (see parse_dmidecode_memory)."""
    if reason:
        marker = unknown(reason)
        return {"channels_populated": marker, "channels_total": marker, "channels_upper_bound": 0 if slots else marker,
                "channel_source": "none", "dimms_per_channel": marker, "sockets_seen": []}
    sockets = sorted(set(s["socket"] for s in slots if s["socket"] is not None))
    if all(s["channel"] for s in populated):
        channels = set(s["channel"] for s in populated)
        labelled = set(s["channel"] for s in slots if s["channel"])
        per_channel = max(sum(1 for s in populated if s["channel"] == c) for c in channels)
        slots_per_channel = max(sum(1 for s in slots if s["channel"] == c) for c in labelled)
        return {"channels_populated": len(channels), "channels_total": len(labelled),
                "channels_upper_bound": len(channels), "channel_source": "labels",
                "dimms_per_channel": per_channel, "slots_per_channel": slots_per_channel,
                "sockets_seen": sorted(set(c[0] for c in labelled))}
    conventions = sorted(set(s["convention"] for s in populated if not s["channel"]))
    want = channels_per_socket if known(channels_per_socket) and channels_per_socket else None
    groups = {}
    for s in slots:
        groups.setdefault(s["socket"], []).append(s)
    bound = sum(min(sum(1 for s in g if s["populated"]), want or len(g)) for g in groups.values())
    exact, dpc, notes = 0, 1, []
    for socket, group in sorted(groups.items(), key=lambda item: str(item[0])):
        filled = sum(1 for s in group if s["populated"])
        if want and socket is not None and filled == len(group) and len(group) >= want:
            # Every slot of the socket holds a DIMM, so every channel does; more slots than channels is 2DPC.
            exact += want
            dpc = max(dpc, -(-len(group) // want))
            notes.append("socket %s: all %d slots populated" % (socket, len(group)))
        elif want and socket is not None and len(group) == want:
            exact += filled
            notes.append("socket %s: %d slots for %d channels, one per channel" % (socket, len(group), want))
        else:
            break
    else:
        return {"channels_populated": exact, "channels_total": want * len(groups), "channels_upper_bound": exact,
                "channel_source": "slot count (%s)" % "; ".join(notes), "dimms_per_channel": dpc,
                "sockets_seen": sockets}
    if want:
        detail = "the slots per socket (%s) are neither all populated nor one per channel" % ", ".join(
            "%s: %d of %d populated" % ("socket " + str(k) if k is not None else "unlabelled slots",
                                        sum(1 for s in g if s["populated"]), len(g))
            for k, g in sorted(groups.items(), key=lambda item: str(item[0])))
    else:
        detail = "the CPU's channel count is not known"
    why = "the DIMM labels (%s) do not name channels, and %s" % ("; ".join(conventions), detail)
    return {"channels_populated": unknown(why), "channels_total": unknown(why), "channels_upper_bound": bound,
            "channel_source": "unknown", "dimms_per_channel": unknown(why), "sockets_seen": sockets}


def theoretical_bandwidth_gbs(channels, mts):
    """channels x MT/s x 8 bytes, in GB/s (12 x 4800 x 8 = 460.8)."""
    if not known(channels) or not known(mts) or not channels or not mts:
        return unknown("needs the populated channel count and the configured MT/s")
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
    """`nvidia-smi --query-gpu=pci.bus_id,name,memory.total,pstate --format=csv,noheader,nounits`."""
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
            "vram_mib": _known_int(fields[2].split()[0] if fields[2] else None,
                                   "memory.total is %r" % fields[2]),
            "pstate": fields[3] if len(fields) > 3 else unknown("pstate not queried"),
        })
    return gpus


def parse_nvidia_smi_table(text):
    """The default `nvidia-smi` table (what people paste): one entry per GPU, driver and CUDA versions.

    Reads both headers: 'Driver Version: X CUDA Version: Y' and, from R610, 'KMD Version: X CUDA UMD Version: Y'.
    """
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
            "pstate": stats.group(1) if stats else unknown("no P-state on the second row"),
            "vram_used_mib": int(stats.group(2)) if stats else unknown("no memory usage on the second row"),
            "vram_mib": int(stats.group(3)) if stats else unknown("no memory usage on the second row"),
        })
    text = text or ""
    driver = re.search(r"(?:Driver|KMD) Version:\s*([0-9.]+)", text)
    cuda = re.search(r"CUDA (?:UMD )?Version:\s*([0-9.]+|N/A)", text)
    if "No running processes found" in text:
        processes = 0
    elif re.search(r"^\|\s+Processes:", text, re.M):
        processes = len([ln for ln in lines if re.match(r"^\|\s+\d+\s+\S+\s+\S+\s+\d+\s+[CG]\+?[CG]?\s", ln)])
    else:
        processes = unknown("the process table is not in the output")
    return {"gpus": gpus,
            "driver_version": driver.group(1) if driver else unknown("no 'Driver Version' or 'KMD Version'"),
            "cuda_version": cuda.group(1) if cuda else unknown("no 'CUDA Version'"),
            "processes": processes}


def parse_nvidia_smi_topo(text):
    """`nvidia-smi topo -m`: per GPU the CPU and NUMA affinity and the link to every peer."""
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
        numa = _int(row.get("NUMA Affinity"))
        gpus[name] = {
            "links": dict((k, v) for k, v in row.items() if re.match(r"^(GPU|NIC)\d+$", k)),
            "cpu_affinity": row.get("CPU Affinity") or unknown("no CPU Affinity column"),
            "numa_affinity": numa if numa is not None else unknown("NUMA Affinity is %r" % row.get("NUMA Affinity")),
        }
    return gpus


def parse_nvidia_smi_power(text):
    """`nvidia-smi --query-gpu=index,power.draw --format=csv,noheader,nounits -lms N`: [{gpu, watts}].

    Boards that do not report power print '[N/A]'; those lines are skipped, so no number is invented.
    """
    samples = []
    for line in _lines(text):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            samples.append({"gpu": int(parts[0]), "watts": float(parts[1])})
        except ValueError:
            continue
    return samples


# ----------------------------------------------------------------------------------- lspci / PCIe

def _gts(value):
    match = re.match(r"^\s*([0-9.]+)\s*GT/s", value or "")
    return float(match.group(1)) if match else None


PCIE_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_gen(gts):
    return PCIE_GEN.get(gts) if known(gts) else None


# A line people put in place of what they cut from a paste ("[ ... ]", "..."): the device goes on after it.
_ELISION = re.compile(r"^\s*(\[\s*\.\.\.\s*\]|\.\.\.)\s*$")
_PCI_VENDORS = (("NVIDIA", "10de"), ("Advanced Micro Devices", "1002"), ("Intel Corporation", "8086"))
_LSPCI_HEAD = re.compile(r"^(?:([0-9a-fA-F]{4,}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\s+(.+?):\s+(.*)$")


def _link_fields(body):
    cap = re.search(r"LnkCap:\s*Port #\d+, Speed ([0-9.]+GT/s)[^,]*, Width x(\d+)", body)
    sta = re.search(r"LnkSta:\s*Speed ([0-9.]+GT/s)( \(downgraded\))?[^,]*, Width x(\d+)( \(downgraded\))?", body)
    ctl = re.search(r"LnkCtl:\s*ASPM ([^;]+);", body)
    no_cap = "no LnkCap line (needs root, or the device is not PCI Express)"
    no_sta = "no LnkSta line (needs root, or the device is not PCI Express)"
    aspm = ctl.group(1).strip() if ctl else unknown("no LnkCtl line (needs root)")
    return {
        "max_speed_gts": _gts(cap.group(1)) if cap else unknown(no_cap),
        "max_width": int(cap.group(2)) if cap else unknown(no_cap),
        "current_speed_gts": _gts(sta.group(1)) if sta else unknown(no_sta),
        "current_width": int(sta.group(3)) if sta else unknown(no_sta),
        "speed_downgraded": bool(sta.group(2)) if sta else unknown(no_sta),
        "width_downgraded": bool(sta.group(4)) if sta else unknown(no_sta),
        "aspm": aspm,
        "aspm_enabled": aspm_states(aspm),
    }


def aspm_states(lnkctl_aspm):
    """'Disabled' -> []; 'L1 Enabled' -> ['L1']; 'L0s L1 Enabled' -> ['L0s', 'L1']; unreadable stays unknown."""
    if not known(lnkctl_aspm):
        return lnkctl_aspm
    if re.match(r"(?i)^disabled", lnkctl_aspm):
        return []
    return re.findall(r"L0s|L1", lnkctl_aspm)


def parse_lspci(text):
    """Every device of `lspci -vv`, `lspci -k` or `lspci -nnk` output: {bdf: device}.

    A device: class, description, driver in use (the kernel module bound to it, or unknown when lspci shows
    none), the modules that could drive it, NUMA node, and the link (capable vs current speed and width,
    ASPM state from LnkCtl). Fields lspci does not print for a device are unknown with the reason.
    """
    devices, current = {}, None
    for line in _lines(text):
        head = _LSPCI_HEAD.match(line)
        if head:
            bdf = normalize_bdf("%s:%s:%s.%s" % (head.group(1) or "0000", head.group(2), head.group(3),
                                                 head.group(4)))
            current = {"class": re.sub(r"\s*\[[0-9a-f]{4}\]$", "", head.group(5)), "description": head.group(6),
                       "body": []}
            devices[bdf] = current
            continue
        if current is not None and (line.startswith(("\t", " ")) or _ELISION.match(line)):
            current["body"].append(line)
        elif current is not None and line.strip() and not line.startswith("--"):
            current = None
    out = {}
    for bdf, dev in devices.items():
        body = "\n".join(dev.pop("body"))
        driver = re.search(r"Kernel driver in use:\s*(\S+)", body)
        modules = re.search(r"Kernel modules:\s*(.+)", body)
        numa = re.search(r"NUMA node:\s*(-?\d+)", body)
        vendor = re.search(r"\[([0-9a-f]{4}):[0-9a-f]{4}\]", dev["description"])
        entry = dict(dev)
        named = [vid for name, vid in _PCI_VENDORS if dev["description"].startswith(name)]
        entry.update({
            "vendor_id": vendor.group(1) if vendor else (named[0] if named else
                                                         unknown("lspci was run without -nn")),
            "driver": driver.group(1) if driver else unknown("no 'Kernel driver in use' line: no driver is bound "
                                                             "(or lspci ran without -k/-v)"),
            "modules": [m.strip() for m in modules.group(1).split(",")] if modules else [],
            "numa_node": int(numa.group(1)) if numa else unknown("no 'NUMA node' line"),
            "link": _link_fields(body),
        })
        out[bdf] = entry
    return out


def parse_sysfs_link(current_speed, max_speed, current_width, max_width):
    """Values of /sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}."""
    def value(parsed, name):
        return parsed if parsed is not None else unknown("%s not readable in sysfs" % name)

    return {
        "current_speed_gts": value(_gts(current_speed), "current_link_speed"),
        "max_speed_gts": value(_gts(max_speed), "max_link_speed"),
        "current_width": value(_int(current_width), "current_link_width"),
        "max_width": value(_int(max_width), "max_link_width"),
    }


# ----------------------------------------------------------------------------- small /proc, /sys

def parse_bracketed(text):
    """'default [performance] powersave' -> 'performance' (also THP's 'always [madvise] never')."""
    match = re.search(r"\[([^\]]+)\]", text or "")
    if match:
        return match.group(1)
    return (text or "").strip() or unknown("file missing or empty")


def parse_cmdline(text):
    """/proc/cmdline: every parameter, and what the kit judges in it (ASPM, NUMA balancing, isolcpus)."""
    line = next((ln for ln in _lines(text) if ln.strip() and not ln.lstrip().startswith("$")), "")
    params = {}
    for token in line.split():
        key, _sep, value = token.partition("=")
        params[key] = value if _sep else True
    return {"line": line.strip() or unknown("/proc/cmdline not read"), "params": params,
            "pcie_aspm": params.get("pcie_aspm", "unset"),
            "pcie_aspm_policy": params.get("pcie_aspm.policy", "unset"),
            "numa_balancing": params.get("numa_balancing", "unset")}


def parse_mokutil_sb_state(text):
    """`mokutil --sb-state` -> 'enabled' | 'disabled' | 'not_efi' | unknown."""
    low = (text or "").lower()
    if "secureboot enabled" in low:
        return "enabled"
    if "secureboot disabled" in low:
        return "disabled"
    if "efi variables are not supported" in low or "not supported on this system" in low:
        return "not_efi"
    return unknown("mokutil gave no SecureBoot state")


def parse_meminfo_total_gb(text):
    match = re.search(r"^MemTotal:\s+(\d+) kB", text or "", re.M)
    return round(int(match.group(1)) / 1024.0 / 1024.0, 1) if match else unknown("no MemTotal in /proc/meminfo")


def parse_governors(text):
    """`grep -r --include=scaling_governor . /sys/devices/system/cpu/cpufreq` -> {governor: policies}."""
    counts = {}
    for line in _lines(text):
        value = line.rsplit(":", 1)[-1].strip()
        if value:
            counts[value] = counts.get(value, 0) + 1
    return counts


# ------------------------------------------------------------------------------------- engine logs

# A systemd journal prefix (short, short-iso, short-precise) in front of an engine line.
_JOURNAL_PREFIX = re.compile(r"^(?:\S+T\S+|[A-Z][a-z]{2} [ \d]\d [\d:.]+) \S+ \S+?(?:\[\d+\])?: ")
# Engine feature names -> /proc/cpuinfo flags (ggml's names; SSE3 is 'pni' in the kernel's list).
ENGINE_ISA = (("SSE3", "pni"), ("SSSE3", "ssse3"), ("AVX", "avx"), ("AVX2", "avx2"), ("F16C", "f16c"),
              ("FMA", "fma"), ("BMI2", "bmi2"), ("AVX_VNNI", "avx_vnni"), ("AVX512", "avx512f"),
              ("AVX512_VBMI", "avx512vbmi"), ("AVX512_VNNI", "avx512_vnni"), ("AVX512_BF16", "avx512_bf16"),
              ("AMX_INT8", "amx_int8"))


def _engine_lines(text):
    """Log lines with journal prefixes removed and terminal-wrapped system_info lines joined back."""
    out = []
    for line in _lines(text):
        line = _JOURNAL_PREFIX.sub("", line).rstrip()
        if out and re.match(r"^\s*\|?\s*[A-Z][A-Z0-9_]* = -?\d+\s*\|", line) and \
                re.search(r"system[_ ]info", out[-1]) and not re.search(r"system[_ ]info", line):
            out[-1] = out[-1] + " " + line.strip()
            continue
        out.append(line)
    return out


def parse_llama_log(text):
    """What an ik_llama.cpp / llama.cpp log tells about the host: threads, the ISA the build uses, CUDA devices.

    Reads every system_info form: the old 'system_info: n_threads = 64 / 128 | AVX = 1 | ...', mainline's
    'n_threads = 80 (n_threads_batch = 80) / 512 | CPU : SSE3 = 1 | ...' (which lists only the features the
    build has), and the server's 'n_threads=16 n_threads_batch=32 total_threads=32 system_info="..."' in any
    key order, with -1 meaning "as n_threads"; lines wrapped by a terminal or prefixed by the journal.
    """
    lines = _engine_lines(text)
    joined = "\n".join(lines)
    result = {"numa_balancing_warning": "/proc/sys/kernel/numa_balancing is enabled" in joined}
    # The device lines are read by the same parser as the GPU placement proof's.
    cuda = hmk_engine_log.parse(joined)["cuda"]
    if cuda["device_count"] is not None or cuda["devices"]:
        result["cuda_devices"] = cuda["devices"]
    else:
        result["cuda_devices"] = unknown("the log has no ggml_cuda_init device list")
    info = [ln for ln in lines if re.search(r"system_info|system info \|", ln)]
    reason = "the log has no system_info line (the engine prints it once at start)"
    threads = {"n_threads": unknown(reason), "n_threads_batch": unknown(reason), "total_threads": unknown(reason)}
    features, form = unknown(reason), "none"
    if info:
        line = info[-1]
        old = re.search(r"n_threads = (\d+)(?: \(n_threads_batch = (-?\d+)\))? / (\d+)", line)
        if old:
            threads = {"n_threads": int(old.group(1)),
                       "n_threads_batch": int(old.group(2)) if old.group(2) else int(old.group(1)),
                       "total_threads": int(old.group(3))}
            form = "mainline" if "CPU :" in line else "classic"
        server = dict((k, int(v)) for k, v in re.findall(r"\b(n_threads|n_threads_batch|total_threads)=(-?\d+)", line))
        if server:
            form = "server"
            for key in threads:
                if key in server:
                    threads[key] = server[key]
                else:
                    threads[key] = unknown("the server line has no %s" % key)
        if known(threads["n_threads_batch"]) and threads["n_threads_batch"] < 0 and known(threads["n_threads"]):
            threads["n_threads_batch"] = threads["n_threads"]
        block = line.split("CPU :", 1)[1] if "CPU :" in line else line
        pairs = re.findall(r"\b([A-Z][A-Z0-9_]+) = (\d+)", block)
        features = dict((k, v == "1") for k, v in pairs) if pairs else unknown("system_info lists no features")
        if known(features) and form == "mainline":
            # Mainline prints only the features the build has: a missing name is one it was built without.
            for name, _flag in ENGINE_ISA:
                features.setdefault(name, False)
    result.update(threads)
    result["features"] = features
    result["system_info_form"] = form
    return result


def compare_engine_isa(features, cpu_flags):
    """The engine build's ISA against the CPU's: what the build lacks that the CPU has, and the reverse.

    built_without: the CPU has it, the engine does not use it (a generic or foreign build: slower).
    needs_missing: the engine was built for it and the CPU lacks it (built on another CPU class: SIGILL).
    """
    if not known(features):
        return {"comparable": False, "reason": why_unknown(features)}
    if not known(cpu_flags):
        return {"comparable": False, "reason": "CPU flags not readable: " + why_unknown(cpu_flags)}
    flags = set(cpu_flags)
    built_without, needs_missing, matched = [], [], []
    for name, flag in ENGINE_ISA:
        if name not in features:
            continue
        if features[name] and flag not in flags:
            needs_missing.append(name)
        elif not features[name] and flag in flags:
            built_without.append(name)
        elif features[name]:
            matched.append(name)
    return {"comparable": True, "built_without": built_without, "needs_missing": needs_missing, "matched": matched}


# ------------------------------------------------------------------------------------ judging

def _verdict(verdict, observed, expected, why, fix, **data):
    result = {"verdict": verdict, "observed": observed, "expected": expected, "why": why, "fix": fix}
    result.update(data)
    return result


def _profile_get(profile, *path):
    value = profile or {}
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _platform(facts):
    platform = facts.get("platform")
    if isinstance(platform, dict) and platform.get("kind"):
        return platform
    cpu = facts.get("cpu") or {}
    return detect_platform(cpu)


def _virtual(facts):
    return _platform(facts)["kind"] == "virtual"


def _generation(facts):
    cpu = facts.get("cpu") or {}
    generation = cpu.get("generation")
    if isinstance(generation, dict):
        return generation
    return cpu_generation(cpu.get("vendor"), cpu.get("family"), cpu.get("model_number"), cpu.get("model"))


def _hidden(what, seen, fix_host):
    return _verdict("hidden", "not visible in a virtual machine (%s)" % seen, "checked on the host",
                    "%s is set in the host's BIOS; a virtual machine sees the layout its hypervisor gives it." % what,
                    fix_host)


def judge_platform(facts, profile=None):
    platform = _platform(facts)
    evidence = "; ".join(platform["evidence"])
    if platform["kind"] == "virtual":
        return _verdict("minor", "virtual machine (%s, %s)" % (evidence, platform["source"]), "bare metal",
                        "BIOS settings (NPS, SMT, memory channels, ASPM, PCIe) belong to the host and cannot be "
                        "seen or fixed from a guest; only what the guest controls is judged here.",
                        "Check the host's BIOS against the checklist (or run the preflight on the host); give the "
                        "VM the GPU with vfio-pci passthrough, host CPU model (host-passthrough) and pinned vCPUs "
                        "on one NUMA node.", platform=platform)
    if platform["detected"] == "virtual":
        return _verdict("ok", "judged as bare metal (%s; a hypervisor was detected: %s)" % (
            platform["source"], evidence), "bare metal",
            "The profile says this node stands in for bare metal (a twin): its emulated layout is judged as the "
            "BIOS layout it imitates.", "Nothing to do.", platform=platform)
    return _verdict("ok", "bare metal (%s)" % evidence, "bare metal", "The BIOS checks apply.", "Nothing to do.",
                    platform=platform)


def _node_facts(facts):
    """NUMA nodes with CPUs and memory: sysfs (the module), else numactl, else lscpu's node CPU lists."""
    numa = facts.get("numa") or {}
    nodes = numa.get("nodes") if isinstance(numa, dict) else None
    if nodes:
        return dict((int(k), _node(v)) for k, v in nodes.items())
    cpu = facts.get("cpu") or {}
    node_cpus = cpu.get("numa_node_cpus")
    if known(node_cpus) and node_cpus:
        return dict((int(k), {"cpus": v, "size_mb": unknown("lscpu does not show node memory")})
                    for k, v in node_cpus.items())
    return None


def _sockets(facts):
    cpu = facts.get("cpu") or {}
    sockets = cpu.get("sockets")
    return sockets if known(sockets) and sockets else None


_NPS_WHY = ("NPS2/NPS4 split the routed experts over several nodes, so each thread reads most of the weights at "
            "remote bandwidth; KTransformers with USE_NUMA copies the experts per node.")
_AMD_NPS_FIX = ("BIOS: Advanced > AMD CBS > DF Common Options > Memory Addressing > NUMA nodes per socket = NPS%s, "
                "and ACPI SRAT L3 Cache as NUMA Domain = Disabled (read it with `numactl --hardware` or "
                "`lscpu | grep NUMA`)")
_INTEL_SNC_FIX = ("BIOS: Socket Configuration > Uncore Configuration > Uncore General Configuration > SNC "
                  "(Sub-NUMA Clustering) = Disabled; on Xeon Max with HBM, Memory Mode = Flat keeps the HBM as "
                  "nodes of their own (read it with `numactl --hardware`)")


def judge_nps(facts, profile=None):
    """NUMA nodes per socket, counted over the nodes that carry CPUs (memory-only nodes are not NPS)."""
    want = _int(_profile_get(profile, "cpu", "numa_nodes_per_socket"), 1) or 1
    generation = _generation(facts)
    nodes = _node_facts(facts)
    cpu = facts.get("cpu") or {}
    layout = numa_layout(nodes) if nodes else None
    if layout:
        cpu_nodes = len(layout["cpu_nodes"])
    elif known(cpu.get("numa_nodes")) and cpu.get("numa_nodes"):
        cpu_nodes = cpu["numa_nodes"]
    else:
        cpu_nodes = None
    if _virtual(facts):
        return _hidden("NPS (nodes per socket)", "the guest has %s NUMA node(s) with CPUs" % (cpu_nodes or "?"),
                       "Check NPS%d in the host's BIOS. Inside the VM, give it one vNUMA node per host NUMA node "
                       "it spans and pin its vCPUs%s." % (want, "; run the engine with --numa distribute"
                                                          if (cpu_nodes or 1) > 1 else ""))
    sockets = _sockets(facts)
    per_socket = layout["per_socket"] if layout else unknown("no node list")
    if known(per_socket) and per_socket:
        counts = sorted(set(len(v) for v in per_socket.values()))
        nps = counts[0] if len(counts) == 1 else unknown("sockets differ: %s" % ", ".join(
            "socket %s: %d" % (s, len(v)) for s, v in sorted(per_socket.items())))
        basis = "%d node(s) with CPUs on %d socket(s)" % (cpu_nodes, len(per_socket))
    elif cpu_nodes and sockets:
        ratio = cpu_nodes / float(sockets)
        nps = int(ratio) if ratio == int(ratio) else round(ratio, 2)
        basis = "%d node(s) with CPUs on %d socket(s)" % (cpu_nodes, sockets)
    else:
        return _verdict("unknown", UNKNOWN, want, _NPS_WHY,
                        "Read it with `lscpu` (Socket(s), NUMA node(s)) or `numactl --hardware`; " +
                        (_AMD_NPS_FIX % want), basis="sockets=%s nodes with CPUs=%s" % (sockets, cpu_nodes))
    if not known(nps):
        return _verdict("bad", nps[UNKNOWN], want, _NPS_WHY, _AMD_NPS_FIX % want, basis=basis)
    key = generation.get("key")
    if key == "naples":
        if nps == 1:
            return _verdict("ok", nps, want, _NPS_WHY, "Nothing to do.", basis=basis + " (memory interleaved "
                            "across the dies)")
        return _verdict("minor", nps, "die layout (4 per socket) or socket interleave", (
            "EPYC 7001 (Naples) has one memory controller per die: %s is its hardware layout, not an NPS setting "
            "(Naples has none)." % basis),
            "Nothing to set in the BIOS for NPS. Run the engine NUMA-aware (ik_llama.cpp --numa distribute) or "
            "interleave its memory (`numactl --interleave=all`); where the BIOS offers Memory Interleaving = "
            "Socket, that makes one node per socket at some latency cost.", basis=basis)
    if generation.get("vendor") == "intel":
        fix = _INTEL_SNC_FIX
        why = _NPS_WHY.replace("NPS2/NPS4", "Sub-NUMA Clustering (SNC2/SNC4)")
    else:
        fix = _AMD_NPS_FIX % want
        why = _NPS_WHY
        if nps and nps > 4:
            fix += "; %s nodes per socket is the L3-as-NUMA layout" % nps
    if nps == want:
        return _verdict("ok", nps, want, why, "Nothing to do.", basis=basis)
    if nps < 1:
        fix += "; fewer than one node per socket is NPS0 (sockets interleaved)"
    return _verdict("bad", nps, want, why, fix, basis=basis)


def judge_memory_only_nodes(facts, profile=None):
    nodes = _node_facts(facts)
    why = ("NUMA nodes with memory and no CPU (CXL memory expanders, HBM in flat mode, a Grace-Hopper GPU's "
           "memory) are slower or farther than local DRAM; experts placed there lose bandwidth, and they are not "
           "NPS nodes.")
    if not nodes:
        return _verdict("unknown", UNKNOWN, "none, or excluded from the engine's memory", why,
                        "Read `numactl --hardware` (nodes with 'cpus:' empty and a size)")
    layout = numa_layout(nodes)
    memory_only = layout["memory_only"]
    if not memory_only:
        if not any(known(n.get("size_mb")) for n in nodes.values()):
            return _verdict("unknown", "node memory sizes not readable", "none", why,
                            "Read `numactl --hardware` or /sys/devices/system/node/node*/meminfo")
        return _verdict("ok", "none", "none", why, "Nothing to do.", nodes=[])
    observed = ", ".join("node %d: %s GB, no CPU" % (m["node"], round(m["size_mb"] / 1024.0, 1)) for m in memory_only)
    cpu_nodes = ",".join(str(n) for n in layout["cpu_nodes"])
    return _verdict("minor", observed, "none, or excluded from the engine's memory", why,
                    "Keep the model in the CPU nodes' DRAM: run the service bound to them (`numactl --membind=%s`, "
                    "or --cpunodebind plus a preferred policy) and leave kernel memory tiering off for it; for HBM, "
                    "bind only what fits." % (cpu_nodes or "<cpu nodes>"), nodes=memory_only)


def judge_memoryless_cpu_nodes(facts, profile=None):
    nodes = _node_facts(facts)
    why = ("CPUs on a node without memory read every byte from another node: threads placed there run at remote "
           "bandwidth (often channels left empty under NPS2/NPS4).")
    if not nodes or not any(known(n.get("size_mb")) for n in nodes.values()):
        return _verdict("unknown", "node memory sizes not readable", "none", why,
                        "Read `numactl --hardware` (node N size: 0 MB with CPUs)")
    memoryless = numa_layout(nodes)["memoryless_cpu"]
    if not memoryless:
        return _verdict("ok", "none", "none", why, "Nothing to do.", nodes=[])
    observed = ", ".join("node %d (CPUs %s, 0 MB)" % (n, _cpu_ranges(nodes[n]["cpus"])) for n in memoryless)
    return _verdict("bad", observed, "none", why,
                    "Populate the empty memory channels of those nodes (or set NPS1 so every core shares all "
                    "channels); until then keep inference threads off them.", nodes=memoryless)


def _cpu_ranges(cpus):
    out, start, prev = [], None, None
    for cpu in list(cpus) + [None]:
        if start is None:
            start = prev = cpu
            continue
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        out.append("%d-%d" % (start, prev) if prev != start else str(start))
        start = prev = cpu
    return ",".join(out)


def judge_memory_placement(facts, profile=None):
    """Memory spread evenly over the CPU-bearing nodes (uneven DIMMs make one node's threads slower)."""
    nodes = _node_facts(facts)
    why = ("Each node's bandwidth comes from its own channels: uneven memory across nodes means some channels "
           "are empty or hold smaller DIMMs, and interleaved or distributed experts run at the slowest node's pace.")
    if not nodes:
        return _verdict("unknown", UNKNOWN, "even across nodes", why, "Read `numactl --hardware`")
    layout = numa_layout(nodes)
    sizes = [(n, nodes[n].get("size_mb")) for n in layout["cpu_nodes"]]
    if any(not known(size) for _n, size in sizes):
        return _verdict("unknown", "node memory sizes not readable", "even across nodes", why,
                        "Read `numactl --hardware`")
    if len(sizes) <= 1:
        return _verdict("ok", "one node with CPUs (%s GB)" % (round(sizes[0][1] / 1024.0, 1) if sizes else "?"),
                        "even across nodes", why, "Nothing to do.")
    values = [size for _n, size in sizes if size > 0]
    observed = ", ".join("node %d: %s GB" % (n, round(size / 1024.0, 1)) for n, size in sizes)
    if values and max(values) - min(values) <= 0.1 * max(values) and len(values) == len(sizes):
        return _verdict("ok", observed, "even across nodes", why, "Nothing to do.")
    return _verdict("minor", observed, "even across nodes (within 10%)", why,
                    "Populate the same DIMMs in every channel of every node (board manual's population table).")


def judge_smt(facts, profile=None):
    want = bool(_profile_get(profile, "cpu", "smt"))
    cpu = facts.get("cpu") or {}
    intel = _generation(facts).get("vendor") == "intel"
    name = "Hyper-Threading" if intel else "SMT"
    smt = cpu.get("smt_active")
    threads = cpu.get("threads_per_core")
    if (smt is None or not known(smt)) and known(threads) and threads:
        smt = threads > 1
    if _virtual(facts):
        return _hidden(name, "the guest sees %s thread(s) per core" % (threads if known(threads) else "?"),
                       "Turn %s %s in the host's BIOS; give the VM whole cores (pinned vCPUs, one vCPU per core) "
                       "and run one engine thread per vCPU." % (name, "on" if want else "off"))
    why = ("Inference threads should equal physical cores; %s siblings share the AVX-512 units and cost about 18%% of "
           "generation speed." % name)
    if intel:
        fix = "BIOS: Processor Configuration > Hyper-Threading [ALL] = Disable"
    else:
        fix = "BIOS: Advanced > AMD CBS > CPU Common Options > Performance > CCD/Core/Thread Enablement > SMT Control"
        fix += " = Disable"
    fix += " (runtime only: `echo off > /sys/devices/system/cpu/smt/control`)"
    want_text = "on" if want else "off"
    if smt is None or not known(smt):
        return _verdict("unknown", UNKNOWN, want_text, why,
                        "Read `/sys/devices/system/cpu/smt/active` or `lscpu | grep 'Thread(s) per core'`; " + fix)
    observed = "on" if smt else "off"
    if smt == want:
        return _verdict("ok", observed, want_text, why, "Nothing to do.", threads_per_core=threads)
    return _verdict("bad", observed, want_text, why, fix if not want else fix.replace("Disable", "Enable"),
                    threads_per_core=threads)


def want_channels(facts, profile):
    per_socket = _profile_get(profile, "memory", "channels_per_socket")
    if not per_socket:
        per_socket = _generation(facts).get("channels_per_socket")
    sockets = _profile_get(profile, "cpu", "sockets") or _sockets(facts) or 1
    if not known(per_socket) or not per_socket:
        return None, per_socket
    return int(per_socket) * int(sockets), int(per_socket)


def judge_memory_channels(facts, profile=None):
    memory = facts.get("memory") or {}
    want, per_socket = want_channels(facts, profile)
    why = ("Generation speed is bound by DRAM bandwidth = channels x MT/s x 8 bytes; 8 of 12 channels loses a third "
           "of it.")
    fix = "Populate one identical DIMM in every memory channel (see the board manual's population table)"
    expected = "%s/%s" % (want, want) if want else "all"
    if _virtual(facts):
        return _hidden("Memory channel population", "the guest's DIMM table is the hypervisor's",
                       "Read `dmidecode -t 17` on the host (or the BMC): want %s channels populated." % (want or "all"))
    if not memory.get("slots_populated"):
        return _verdict("unknown", UNKNOWN, expected, why,
                        "Read it with `dmidecode -t 17` as root (Size, Locator, Bank Locator); containers and some "
                        "VMs expose no SMBIOS memory devices, so check on the host or the BMC. " + fix,
                        reason=why_unknown(memory.get("channels_populated")) or "no populated DIMM listed")
    channels = memory.get("channels_populated")
    if not known(channels):
        bound = memory.get("channels_upper_bound")
        if want and known(bound) and bound < want:
            return _verdict("bad", "at most %s/%s (%s)" % (bound, want, channels[UNKNOWN]), expected, why, fix,
                            reason=channels[UNKNOWN])
        return _verdict("unknown", "%s DIMM(s) in %s slot(s); channels unknown: %s" % (
            memory.get("slots_populated"), memory.get("slots_total"), channels[UNKNOWN]), expected, why,
            "Count the populated channels from the board manual's slot map (or the BMC's memory inventory): two "
            "DIMMs per channel on half the channels looks the same here. " + fix, reason=channels[UNKNOWN])
    total = memory.get("channels_total") if known(memory.get("channels_total")) else want
    observed = "%s/%s" % (channels, want or total or "?")
    dpc = memory.get("dimms_per_channel")
    extra = {}
    if known(dpc) and dpc and dpc > 1:
        observed += " (%d DIMMs per channel)" % dpc
        extra["dimms_per_channel"] = dpc
    if want is None:
        return _verdict("unknown", observed + "; the CPU's channel count is not known", "all", why,
                        "Set memory.channels_per_socket in the hardware profile.", **extra)
    if channels >= want:
        return _verdict("ok", observed, expected, why, "Nothing to do.", **extra)
    return _verdict("bad", observed, expected, why, fix, **extra)


def judge_memory_speed(facts, profile=None):
    memory = facts.get("memory") or {}
    want = _profile_get(profile, "memory", "min_speed_mts")
    speed = memory.get("configured_speed_mts")
    rated = memory.get("rated_speed_mts")
    dpc = memory.get("dimms_per_channel")
    why = "Bandwidth scales with the configured MT/s; two DIMMs per channel or a BIOS limit downclock it."
    fix = ("BIOS: Advanced > AMD CBS > UMC Common Options > DDR Options > DDR Timing Configuration > Memory Clock "
           "Speed = Auto/%s; use one DIMM per channel" % (want or "rated"))
    expected = ">= %s MT/s" % want if want else "rated speed"
    if _virtual(facts):
        return _hidden("Memory speed", "the guest's DIMM table is the hypervisor's",
                       "Read 'Configured Memory Speed' in `dmidecode -t 17` on the host.")
    if not known(speed):
        return _verdict("unknown", UNKNOWN, expected, why,
                        "Read 'Configured Memory Speed' in `dmidecode -t 17` as root (empty or Unknown in containers "
                        "and some firmware); " + fix, reason=why_unknown(speed))
    observed = "%s MT/s" % speed
    downclocked = known(rated) and rated > speed
    if downclocked:
        observed += " (rated %s MT/s%s)" % (rated, ", %d DIMMs per channel" % dpc if known(dpc) and dpc and dpc > 1
                                            else "")
    bandwidth = memory.get("bandwidth_gbs")
    if known(bandwidth):
        observed += ", %s GB/s theoretical" % bandwidth
    if want and speed < want:
        return _verdict("bad", observed, expected, why, fix)
    if downclocked and not want:
        return _verdict("minor", observed, expected, why, fix)
    return _verdict("ok", observed, expected, why, "Nothing to do." if not downclocked else fix)


def judge_numa_balancing(facts, profile=None):
    value = facts.get("numa_balancing")
    nodes = _node_facts(facts)
    count = len(nodes) if nodes else (facts.get("cpu") or {}).get("numa_nodes")
    why = "Automatic NUMA page migration moves the experts around while serving (-50 to -65% generation)."
    fix = ("`sysctl -w kernel.numa_balancing=0` now; the kernel_tuning role makes it permanent (/etc/sysctl.d).")
    if value == "absent" or value is None:
        return _verdict("ok", "absent (kernel built without it)", 0, why,
                        "Nothing to do: /proc/sys/kernel/numa_balancing does not exist")
    if not isinstance(value, int) or isinstance(value, bool):
        return _verdict("unknown", UNKNOWN, 0, why, "Read `cat /proc/sys/kernel/numa_balancing`; want 0. " + fix)
    if value == 0:
        return _verdict("ok", 0, 0, why, "Nothing to do.", nodes=count)
    if known(count) and count == 1:
        return _verdict("minor", value, 0, why, "No effect on a single node; turn it off anyway so an NPS change "
                        "cannot bring the slowdown: " + fix, nodes=count)
    return _verdict("bad", value, 0, why, fix, nodes=count)


_ASPM_FIX = ("Kernel command line `pcie_aspm.policy=performance` (kernel_tuning role) or BIOS: Advanced > PCI "
             "Subsystem Settings > ASPM Support = Disabled. `pcie_aspm=off` does not disable it: it leaves the "
             "firmware's setting as it is.")


def judge_aspm(facts, profile=None):
    """ASPM from the policy file, the kernel command line and each GPU link's own LnkCtl state."""
    policy = facts.get("pcie_aspm_policy")
    cmdline = facts.get("cmdline")
    if not isinstance(cmdline, dict):
        cmdline = parse_cmdline(cmdline or "")
    why = ("ASPM puts the GPU link into low-power states; waking it adds latency to every expert copy. "
           "`pcie_aspm=off` does not disable it (firmware settings stay).")
    gpus = [g for g in facts.get("gpus") or [] if not _passed_through(g)]
    link_states = [(g.get("pci_address"), (g.get("link") or {}).get("aspm_enabled")) for g in gpus]
    enabled = [(bdf, states) for bdf, states in link_states if known(states) and states]
    parts = ["policy [%s]" % (policy if known(policy) else UNKNOWN)]
    if cmdline.get("pcie_aspm") != "unset":
        parts.append("cmdline pcie_aspm=%s" % cmdline["pcie_aspm"])
    if cmdline.get("pcie_aspm_policy") != "unset":
        parts.append("cmdline pcie_aspm.policy=%s" % cmdline["pcie_aspm_policy"])
    for bdf, states in link_states:
        parts.append("%s ASPM %s" % (bdf, (" ".join(states) + " enabled") if known(states) and states else
                                     ("disabled" if known(states) else "unread")))
    observed = "; ".join(parts)
    if _virtual(facts):
        return _hidden("PCIe ASPM", "the guest's links are emulated; %s" % observed,
                       "Set ASPM on the host (" + _ASPM_FIX + ")")
    if enabled:
        return _verdict("minor" if policy != "powersave" else "bad", observed, "disabled on the GPU links", why,
                        "The GPU link itself has ASPM on. " + _ASPM_FIX, links=enabled)
    if cmdline.get("pcie_aspm") == "off":
        return _verdict("minor", observed, "performance, or disabled in the BIOS", why,
                        "Replace `pcie_aspm=off` (the kernel then leaves ASPM as the firmware set it, and the policy "
                        "file says [default] whatever the links do) with `pcie_aspm.policy=performance`, or disable "
                        "ASPM in the BIOS. " + _ASPM_FIX)
    if not known(policy):
        return _verdict("unknown", observed, "performance", why,
                        "Read `cat /sys/module/pcie_aspm/parameters/policy` (bracketed value) or "
                        "`lspci -vv | grep 'LnkCtl:.*ASPM'`; " + _ASPM_FIX)
    if policy == "performance":
        return _verdict("ok", observed, "performance", why, "Nothing to do.")
    if policy.startswith("powersave") or policy.startswith("powersupersave"):
        return _verdict("bad", observed, "performance", why, _ASPM_FIX)
    if link_states and all(known(states) and not states for _bdf, states in link_states):
        return _verdict("ok", observed, "disabled on the GPU links", why,
                        "Nothing to do now (the firmware left the GPU links' ASPM off); " + _ASPM_FIX)
    return _verdict("minor", observed, "performance", why, "The firmware decides (policy default). " + _ASPM_FIX)


def _passed_through(gpu):
    return gpu.get("driver") in ("vfio-pci", "pci-stub")


def judge_gpu_present(facts, profile=None):
    gpus = facts.get("gpus") or []
    want = _int(_profile_get(profile, "gpus", "count"), 0) or 0
    model = _profile_get(profile, "gpus", "model")
    usable = [g for g in gpus if not _passed_through(g)]
    passed = [g for g in gpus if _passed_through(g)]
    why = "Attention, shared experts and the KV cache run on the GPU; a missing card breaks the hybrid split."
    fix = ("Seat the card in an x16 slot, check its power cables and BIOS: Advanced > PCI Subsystem Settings > Above "
           "4G Decoding = Enabled, Re-Size BAR = Enabled; list with `lspci -d 10de:`")
    expected = "%d%s" % (want, " x %s" % model if model and want else "")
    listed = ", ".join("%s %s" % (g["pci_address"], g.get("model") or "?") for g in usable)
    if passed:
        listed = (listed + "; " if listed else "") + ", ".join(
            "%s bound to %s (passed through to a VM)" % (g["pci_address"], g.get("driver")) for g in passed)
    data = {"usable": len(usable), "passed_through": [g["pci_address"] for g in passed]}
    if not gpus and not want:
        return _verdict("absent", 0, expected, why, "Nothing to do on a CPU-only node.", **data)
    if len(usable) < want:
        if passed:
            fix = ("The GPU is bound to %s: it belongs to a virtual machine. Unbind it (remove its id from "
                   "vfio-pci.ids / driver_override and reboot) to serve on this host, or run the kit in the VM it "
                   "is passed to. " % passed[0].get("driver")) + fix
        return _verdict("bad", "%d (%s)" % (len(usable), listed) if gpus else 0, expected, why, fix, **data)
    if len(usable) == want:
        return _verdict("ok", "%d (%s)" % (len(usable), listed), expected, why, "Nothing to do.", **data)
    return _verdict("minor", "%d (%s)" % (len(usable), listed), expected, why,
                    "Update gpus.count in the hardware profile to what the node has.", **data)


def judge_gpu_links(facts, profile=None):
    gpus = [g for g in facts.get("gpus") or [] if not _passed_through(g)]
    want_gpus = _int(_profile_get(profile, "gpus", "count"), 0) or 0
    want = _int(_profile_get(profile, "gpus", "min_link_width")) or 16
    why = ("Prompt processing copies CPU-resident experts to the GPU over PCIe; a narrow link caps it. GPUs drop to "
           "Gen1 at idle, so only the width is judged strictly.")
    fix = ("Width: reseat the card in a CPU-attached x16 slot, check BIOS slot bifurcation (x16) and risers. Speed: "
           "re-check under load (`nvidia-smi -q -d PCIE` while serving); BIOS: PCIe link speed = Auto")
    expected = "x%d at max speed (speed judged under load)" % want
    if not gpus:
        return _verdict("absent" if not want_gpus else "unknown", "no GPU", expected, why, fix)
    if _virtual(facts):
        return _hidden("The physical PCIe link", "a passed-through GPU sits behind an emulated root port",
                       "Read `lspci -vv -s <bdf>` (LnkCap/LnkSta) on the host while the GPU is busy.")
    verdict, parts, narrow_card = "ok", [], []
    for g in gpus:
        link = g.get("link") or {}
        cw, mw = link.get("current_width"), link.get("max_width")
        cs, ms = link.get("current_speed_gts"), link.get("max_speed_gts")
        bdf = g.get("pci_address")
        if not known(cw) or not known(cs) or cw is None or cs is None:
            parts.append("%s unknown" % bdf)
            verdict = "unknown" if verdict == "ok" else verdict
            continue
        text = "%s x%s/%s %sGT/s/%sGT/s" % (bdf, cw, "x%s" % mw if known(mw) and mw else "?", cs,
                                            ms if known(ms) and ms else "?")
        if known(mw) and mw and cw < mw:
            verdict = "bad"
            text += " width downgraded"
        elif cw < want:
            verdict = "bad"
            if known(mw) and mw and mw < want:
                text += " (the card itself is x%s)" % mw
                narrow_card.append(bdf)
            else:
                text += " narrower than x%d" % want
        elif known(ms) and ms and cs < ms:
            verdict = "minor" if verdict in ("ok", "unknown") else verdict
            text += " speed downgraded (idle?)"
        parts.append(text)
    if narrow_card:
        fix = ("The card's own link is narrower than x%d (LnkCap): no slot fixes that; use a x16 card or accept the "
               "prompt-processing cost. " % want) + fix
    return _verdict(verdict, "; ".join(parts), expected, why, fix)


def judge_gpu_numa(facts, profile=None):
    gpus = [g for g in facts.get("gpus") or [] if not _passed_through(g)]
    nodes = _node_facts(facts)
    count = len(numa_layout(nodes)["cpu_nodes"]) if nodes else (facts.get("cpu") or {}).get("numa_nodes")
    why = "On multi-node boxes, threads and buffers should sit on the GPU's node; -1 means firmware did not say."
    fix = ("BIOS: ACPI SRAT L3 Cache as NUMA Domain = Disabled and keep NPS1; read "
           "`cat /sys/bus/pci/devices/<bdf>/numa_node`")
    if not gpus:
        return _verdict("absent", "no GPU", "known node or single node", why, fix)
    unknown_nodes = [g["pci_address"] for g in gpus if not known(g.get("numa_node")) or g.get("numa_node") in (None, -1)]
    observed = ", ".join("%s node %s" % (g["pci_address"], g.get("numa_node") if known(g.get("numa_node")) else "?")
                         for g in gpus)
    multi = known(count) and (count or 1) > 1
    if unknown_nodes and multi:
        return _verdict("minor", observed, "known node or single node", why, fix)
    return _verdict("ok", observed, "known node or single node", why, "Nothing to do.")


def judge_gpu_vram(facts, profile=None):
    gpus = facts.get("gpus") or []
    usable = [g for g in gpus if not _passed_through(g)]
    want_gpus = _int(_profile_get(profile, "gpus", "count"), 0) or 0
    want = _profile_get(profile, "gpus", "vram_gib")
    why = "The VRAM decides how many layers, which context length and which KV cache fit on the GPU."
    fix = "Install the driver (gpu_driver role) and read `nvidia-smi --query-gpu=name,memory.total --format=csv`"
    expected = ">= %s GiB" % want if want else "any"
    if not usable:
        if gpus:
            return _verdict("bad" if want_gpus else "absent", "passed through to a VM (vfio-pci)", expected, why,
                            "The GPU is bound to vfio-pci on this host; its VRAM is the VM's.")
        return _verdict("absent" if not want_gpus else "unknown", "no GPU", expected, why, fix)
    vram = [g.get("vram_mib") for g in usable]
    if any(not known(v) or v is None for v in vram):
        return _verdict("unknown", UNKNOWN, expected, why, "nvidia-smi is not working yet (no driver?): " + fix)
    observed = ", ".join("%.0f GiB" % (v / 1024.0) for v in vram)
    ok = not want or all(v / 1024.0 >= want * 0.95 for v in vram)
    return _verdict("ok" if ok else "bad", observed, expected, why,
                    "Nothing to do." if ok else "Use the GPU model the profile names, or pick the profile that "
                    "matches the card")


def judge_cpu_isa(facts, profile=None):
    required = list(_profile_get(profile, "cpu", "isa_required") or [])
    cpu = facts.get("cpu") or {}
    flags = cpu.get("flags")
    why = "GGML_NATIVE builds for the CPU it runs on; the profile's build flags assume these extensions."
    fix = "Choose the hardware profile that matches this CPU (AVX2-only Zen 3 vs AVX-512 Zen 4)"
    if not known(flags) or not flags:
        return _verdict("unknown", UNKNOWN, required, why, "Read `grep -m1 flags /proc/cpuinfo`; " + fix)
    flags = set(flags)
    missing = [f for f in required if f not in flags]
    observed = [f for f in ISA_FLAGS if f in flags] or ["no AVX2/AVX-512/AMX flags visible"]
    if missing:
        observed = observed + ["missing: " + ", ".join(missing)]
    if missing and (_virtual(facts) or cpu.get("hypervisor") is True):
        fix = ("Not visible in this VM (the hypervisor masks them): the host CPU may have them. Pass the host CPU "
               "through (`-cpu host`, libvirt host-passthrough) or run on the host. " + fix)
    return _verdict("bad" if missing else "ok", observed, required, why, fix if missing else "Nothing to do.")


def judge_secure_boot(facts, profile=None):
    state = facts.get("secure_boot")
    want_gpus = _int(_profile_get(profile, "gpus", "count"), 0) or 0
    why = "With Secure Boot on, unsigned NVIDIA kernel modules do not load."
    fix = ("BIOS: Security > Secure Boot = Disabled, or enroll a MOK and sign the modules (`mokutil --import`); read "
           "it with `mokutil --sb-state`")
    if state in ("disabled", "not_efi"):
        return _verdict("ok", "not EFI (legacy boot)" if state == "not_efi" else "disabled", "disabled or not EFI",
                        why, fix)
    if state == "enabled":
        return _verdict("minor" if want_gpus else "ok", "enabled", "disabled or not EFI", why, fix)
    return _verdict("unknown", UNKNOWN, "disabled or not EFI", why,
                    "Install mokutil or read /sys/firmware/efi/efivars/SecureBoot-*; " + fix)


def judge_disk(facts, profile=None):
    want = _profile_get(profile, "models_min_free_gb")
    disk = facts.get("models_disk") or {}
    why = "The models (143-404 GB) need room for the download and its verification before the swap."
    fix = ("Mount an NVMe volume at %s or free space there (`df -h %s`)"
           % (disk.get("path") or "the models path", disk.get("path") or "<models_path>"))
    expected = ">= %s GB" % want if want else "any"
    if not known(disk.get("free_gb")) or disk.get("free_gb") is None:
        return _verdict("unknown", UNKNOWN, expected, why, fix)
    observed = "%s GB free on %s" % (disk["free_gb"], disk.get("checked_path"))
    ok = not want or disk["free_gb"] >= want
    return _verdict("ok" if ok else "minor", observed, expected, why,
                    fix + " (warn only: a node that already holds its models has less free space)")


def judge_governor(governors, want="performance"):
    """CPU frequency governors of every cpufreq policy ({governor: count}, see parse_governors)."""
    why = "A power-saving governor lowers the clocks between tokens and slows prompt processing."
    fix = ("Set `kernel_tuning_cpufreq_governor: %s` (kernel_tuning role) or `cpupower frequency-set -g %s`; BIOS: "
           "Determinism Slider = Performance." % (want, want))
    if not governors:
        return _verdict("absent", "no cpufreq governor", want, why, "Nothing to do here; on bare metal check "
                        "`cpupower frequency-info`.")
    others = sorted(g for g in governors if g != want)
    observed = ", ".join("%s: %d polic%s" % (g, n, "y" if n == 1 else "ies") for g, n in sorted(governors.items()))
    return _verdict("minor" if others else "ok", observed, want, why, fix if others else "Nothing to do.",
                    others=others)


JUDGES = (
    ("platform", judge_platform), ("numa_nodes_per_socket", judge_nps),
    ("numa_memory_only_nodes", judge_memory_only_nodes), ("numa_memoryless_cpu_nodes", judge_memoryless_cpu_nodes),
    ("numa_memory_placement", judge_memory_placement), ("smt_disabled", judge_smt),
    ("memory_channels_populated", judge_memory_channels), ("memory_speed", judge_memory_speed),
    ("numa_balancing_disabled", judge_numa_balancing), ("pcie_aspm_policy", judge_aspm),
    ("gpu_present", judge_gpu_present), ("gpu_pcie_link", judge_gpu_links), ("gpu_numa_node", judge_gpu_numa),
    ("gpu_vram", judge_gpu_vram), ("cpu_isa", judge_cpu_isa), ("secure_boot", judge_secure_boot),
    ("model_disk_space", judge_disk),
)


def _check(check_id, status, observed, expected, why, remedy):
    return {"id": check_id, "status": status, "observed": observed, "expected": expected,
            "why": why, "remedy": remedy}


def evaluate(facts, profile, numa_balancing_fixed_later=True):
    """Judge gathered facts against the hardware profile (hmk_hardware). Returns the preflight checks."""
    checks = []
    for check_id, judge in JUDGES:
        result = judge(facts, profile)
        status = PREFLIGHT_STATUS[result["verdict"]]
        if check_id == "numa_balancing_disabled" and status == "fail" and numa_balancing_fixed_later:
            status = "warn"
            result["fix"] = ("The kernel_tuning role sets kernel.numa_balancing=0 later in site.yml; by hand: "
                             "`sysctl -w kernel.numa_balancing=0` and persist it in /etc/sysctl.d/")
        checks.append(_check(check_id, status, result["observed"], result["expected"], result["why"], result["fix"]))
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
    if is_unknown(value):
        return "unknown (%s)" % value[UNKNOWN]
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


def _fact(value, unit=""):
    if is_unknown(value):
        return "unknown (%s)" % value[UNKNOWN]
    return "%s%s" % (value, unit)


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
    generation = cpu.get("generation") or {}
    nodes = _node_facts(facts)
    if nodes:
        layout = numa_layout(nodes)
        numa = "%d NUMA node(s), %d with CPUs" % (len(nodes), len(layout["cpu_nodes"]))
    else:
        numa = "%s NUMA node(s)" % _fact(cpu.get("numa_nodes"))
    out += ["", "## Hardware", "",
            "- CPU: %s (%s), %s socket(s), %s physical cores, %s thread(s)/core, %s"
            % (_fact(cpu.get("model")), generation.get("name", UNKNOWN), _fact(cpu.get("sockets")),
               _fact(cpu.get("physical_cores")), _fact(cpu.get("threads_per_core")), numa),
            "- Memory: %s GB total, %s of %s DIMM slots, %s MT/s, %s GB/s theoretical"
            % (_fact(facts.get("memory_total_gb")), memory.get("slots_populated"), memory.get("slots_total"),
               _fact(memory.get("configured_speed_mts")), _fact(memory.get("bandwidth_gbs"))),
            "- GPUs: %s" % (", ".join("%s %s%s" % (g["pci_address"], _fact(g.get("model")),
                                                   " (driver %s)" % g["driver"] if known(g.get("driver")) else "")
                                      for g in facts.get("gpus") or []) or "none"),
            "- Transparent hugepages: %s" % _fact(facts.get("transparent_hugepages")),
            "- Kernel command line: `%s`" % _fact((facts.get("cmdline") or {}).get("line")
                                                  if isinstance(facts.get("cmdline"), dict) else facts.get("cmdline")),
            ""]
    return "\n".join(out)
