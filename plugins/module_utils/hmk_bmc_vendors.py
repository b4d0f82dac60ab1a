# -*- coding: utf-8 -*-
# The BIOS checklist read through the BMC: the ONE map from the kit's checklist items to each vendor's Redfish BIOS
# attribute names and values, and the pure functions that judge a node's attributes and plan the change.
#
# Every name and value below was seen in a public source: a real attribute dump of the vendor's AMD EPYC server or
# the vendor's own registry documentation (tests/fixtures/bmc/INDEX.md names each one; the unit tests read the
# stored excerpts). A value no source showed is NOT in the map: read from a BMC it is reported as unknown, and a
# wanted value the map has no spelling for is reported as not writable, never guessed. Adding a value means adding
# its source to the INDEX and its excerpt to the fixtures.
#
# Nothing here talks to a BMC: the bmc role reads through community.general.redfish_info and writes through
# redfish_config/redfish_command; this file only turns attributes into verdicts and verdicts into a PATCH body.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

UNKNOWN = "unknown"

# The checks, in report order. The first three are the OS-side preflight's ids (bios_checklist: the same facts seen
# from the BMC); the others can only be read from the BMC, so the preflight has no id for them.
CHECKS = (
    ("numa_nodes_per_socket", "NUMA nodes per socket (NPS)"),
    ("smt_disabled", "SMT (simultaneous multithreading)"),
    ("pcie_aspm_policy", "PCIe ASPM"),
    ("pcie_acs", "PCIe ACS (access control services)"),
    ("above_4g_decoding", "Above 4G decoding (64-bit MMIO)"),
    ("resizable_bar", "Resizable BAR"),
    ("power_determinism", "Determinism / power profile"),
    ("iommu", "IOMMU"),
)
CHECK_IDS = tuple(c[0] for c in CHECKS)
SHARED_WITH_PREFLIGHT = ("numa_nodes_per_socket", "smt_disabled", "pcie_aspm_policy")

# Canonical values per check (what the report and the wanted values speak); "auto" is the firmware deciding.
CANONICAL = {
    "numa_nodes_per_socket": ("0", "1", "2", "4", "auto"),
    "smt_disabled": ("on", "off", "auto"),
    "pcie_aspm_policy": ("enabled", "disabled", "auto"),
    "pcie_acs": ("enabled", "disabled", "auto"),
    "above_4g_decoding": ("enabled", "disabled", "auto"),
    "resizable_bar": ("enabled", "disabled", "auto"),
    "power_determinism": ("performance", "power", "auto"),
    "iommu": ("enabled", "disabled", "auto"),
}

WHY = {
    "numa_nodes_per_socket": "NPS splits the routed experts over NUMA nodes; generation reads most weights remotely.",
    "smt_disabled": "Inference threads should equal physical cores; SMT siblings share the vector units.",
    "pcie_aspm_policy": "ASPM puts the GPU link into low-power states; waking it delays every expert copy.",
    "pcie_acs": "ACS routes peer-to-peer PCIe traffic through the root complex (judged only when asked).",
    "above_4g_decoding": "GPUs with large BARs need 64-bit MMIO above 4 GiB or they are not enumerated.",
    "resizable_bar": "Resizable BAR maps the whole GPU memory for the CPU instead of a 256 MiB window.",
    "power_determinism": "Power determinism lets each socket clock differently; performance determinism keeps "
                         "the clocks the memory bandwidth was measured at.",
    "iommu": "The IOMMU matters for passthrough and DMA isolation (judged only when asked).",
}

_ENABLED = {"Enabled": "enabled", "Disabled": "disabled"}

# vendor -> how it is recognised, where the names come from, and one entry per check:
#   attribute: exact name | pattern: regex (Supermicro suffixes a per-board id, HPE has one ASPM switch per slot)
#   values: raw value -> canonical value (only the values a source showed)
#   with: attributes written together with this one (raw values), e.g. HPE's determinism needs manual control
#   unknown: why this vendor's BIOS has no attribute for the check (reported as unknown, never mapped by guess)
VENDORS = {
    "dell": {
        "name": "Dell (iDRAC)",
        "manufacturers": ("dell",),
        "sources": ("weka-defaults-db#Dell PowerEdge R6615", "weka-defaults-db#Dell PowerEdge R670",
                    "weka-defaults-db#WEKApod - R6615", "weka-bios-settings#Dell"),
        "checks": {
            "numa_nodes_per_socket": {"attribute": "NumaNodesPerSocket", "values": {"1": "1"}},
            "smt_disabled": {"attribute": "LogicalProc", "values": {"Enabled": "on", "Disabled": "off"}},
            "pcie_aspm_policy": {"attribute": "PcieAspmL1", "values": _ENABLED},
            "pcie_acs": {"unknown": "no ACS attribute in the PowerEdge R6615 or R670 BIOS attributes"},
            "above_4g_decoding": {"unknown": "the PowerEdge R6615 (Genoa) BIOS has MmioLimit but no Above 4G switch"},
            "resizable_bar": {"attribute": "PcieResizableBar", "values": {"Enabled": "enabled"}},
            "power_determinism": {"attribute": "DeterminismSlider",
                                  "values": {"PerfDeterminism": "performance", "PowerDeterminism": "power"}},
            "iommu": {"attribute": "IommuSupport", "values": _ENABLED},
        },
    },
    "hpe": {
        "name": "HPE (iLO)",
        "manufacturers": ("hpe", "hewlett packard enterprise"),
        "sources": ("hpe-ilo6-170-bios-registry", "weka-defaults-db#HPE ProLiant DL325 Gen11",
                    "weka-bios-settings#Hpe"),
        "checks": {
            "numa_nodes_per_socket": {"attribute": "NumaMemoryDomainsPerSocket",
                                      "values": {"OneMemoryDomainPerSocket": "1", "TwoMemoryDomainsPerSocket": "2",
                                                 "FourMemoryDomainsPerSocket": "4", "Auto": "auto"}},
            "smt_disabled": {"attribute": "ProcSMT", "values": {"Enabled": "on", "Disabled": "off"}},
            "pcie_aspm_policy": {"pattern": r"^PciSlot\d+Aspm$",
                                 "values": {"Auto": "auto", "Disabled": "disabled", "AspmL1Enabled": "enabled"}},
            "pcie_acs": {"unknown": "no ACS attribute in the iLO 6 1.70 BIOS registry"},
            "above_4g_decoding": {"unknown": "no Above 4G attribute in the iLO 6 1.70 BIOS registry"},
            "resizable_bar": {"unknown": "no Resizable BAR attribute in the iLO 6 1.70 BIOS registry"},
            "power_determinism": {"attribute": "PerformanceDeterminism",
                                  "values": {"PerformanceDeterministic": "performance",
                                             "PowerDeterministic": "power"},
                                  "with": {"DeterminismControl": "DeterminismCtrlManual"}},
            "iommu": {"attribute": "ProcAmdIoVt", "values": _ENABLED},
        },
    },
    "lenovo": {
        "name": "Lenovo (XClarity)",
        "manufacturers": ("lenovo",),
        "sources": ("weka-defaults-db#Lenovo ThinkSystem SR635 V3", "weka-bios-settings#Lenovo"),
        "checks": {
            "numa_nodes_per_socket": {"attribute": "Memory_NUMANodesperSocket", "values": {"NPS1": "1"}},
            "smt_disabled": {"attribute": "Processors_SMTMode", "values": {"Enabled": "on", "Disabled": "off"}},
            "pcie_aspm_policy": {"unknown": "no ASPM attribute in the ThinkSystem SR635 V3 BIOS attributes"},
            "pcie_acs": {"unknown": "no ACS attribute in the ThinkSystem SR635 V3 BIOS attributes"},
            "above_4g_decoding": {"attribute": "DevicesandIOPorts_PCI64BitResourceAllocation",
                                  "values": {"Auto": "auto"}},
            "resizable_bar": {"unknown": "no Resizable BAR attribute in the ThinkSystem SR635 V3 BIOS attributes"},
            "power_determinism": {"attribute": "Processors_DeterminismSlider", "values": {"Performance": "performance"}},
            "iommu": {"attribute": "DevicesandIOPorts_IOMMU", "values": {"Enabled": "enabled"}},
        },
    },
    "supermicro": {
        "name": "Supermicro",
        "manufacturers": ("supermicro",),
        "sources": ("weka-defaults-db#Supermicro AS -1115CS-TNR", "weka-bios-settings#Supermicro"),
        "checks": {
            "numa_nodes_per_socket": {"pattern": r"^NUMANodesPerSocket(_[0-9A-F]{4})?$",
                                      "values": {"NPS1": "1", "NPS4": "4"}},
            "smt_disabled": {"pattern": r"^SMTControl(_[0-9A-F]{4})?$", "values": {"Disabled": "off"}},
            "pcie_aspm_policy": {"pattern": r"^ASPMSupport(_[0-9A-F]{4})?$", "values": {"Disabled": "disabled"}},
            "pcie_acs": {"pattern": r"^ACSEnable(_[0-9A-F]{4})?$", "values": {"Auto": "auto"}},
            "above_4g_decoding": {"pattern": r"^Above4GDecoding(_[0-9A-F]{4})?$", "values": {"Enabled": "enabled"}},
            "resizable_bar": {"pattern": r"^Re_SizeBARSupport(_[0-9A-F]{4})?$", "values": {"Disabled": "disabled"}},
            "power_determinism": {"unknown": "the H13 BIOS shows DeterminismControl (Auto/Manual) but no slider"},
            "iommu": {"pattern": r"^IOMMU(_[0-9A-F]{4})?$", "values": {"Enabled": "enabled", "Auto": "auto"}},
        },
    },
}


def vendor_of(manufacturer, override="auto"):
    """The map's vendor key for a Redfish Manufacturer (or the operator's override), or None when unknown."""
    if override and override != "auto":
        return override if override in VENDORS else None
    text = (manufacturer or "").strip().lower()
    for key, vendor in VENDORS.items():
        if any(text.startswith(m) for m in vendor["manufacturers"]):
            return key
    return None


def _matching(spec, attributes):
    if "attribute" in spec:
        return [spec["attribute"]] if spec["attribute"] in attributes else []
    regex = re.compile(spec["pattern"])
    return sorted(name for name in attributes if regex.match(name))


def _combine(values):
    """One canonical value for several attributes (HPE's per-slot ASPM): all equal, else the worst of them."""
    distinct = set(values)
    if len(distinct) == 1:
        return values[0]
    if UNKNOWN in distinct:
        return UNKNOWN
    return "enabled" if "enabled" in distinct else "auto"


def read(vendor, attributes):
    """Each check as read: {id: {value, raw: {attribute: raw value}, reason}} (value 'unknown' with the reason)."""
    attributes = attributes or {}
    result = {}
    for check_id in CHECK_IDS:
        if vendor not in VENDORS:
            result[check_id] = {"value": UNKNOWN, "raw": {}, "reason": "vendor not in the map"}
            continue
        spec = VENDORS[vendor]["checks"][check_id]
        if "unknown" in spec:
            result[check_id] = {"value": UNKNOWN, "raw": {}, "reason": spec["unknown"]}
            continue
        names = _matching(spec, attributes)
        if not names:
            result[check_id] = {"value": UNKNOWN, "raw": {},
                                "reason": "attribute %s not on this BMC" % spec.get("attribute", spec.get("pattern"))}
            continue
        raw = dict((n, attributes[n]) for n in names)
        values = [spec["values"].get(str(attributes[n]), UNKNOWN) for n in names]
        value = _combine(values)
        reason = ""
        if value == UNKNOWN:
            reason = "value %s is not in the map" % ", ".join(
                "%s=%s" % (n, attributes[n]) for n in names if str(attributes[n]) not in spec["values"])
        result[check_id] = {"value": value, "raw": raw, "reason": reason}
    return result


def wanted(profile=None, overrides=None):
    """The wanted canonical value per check: NPS and SMT from the hardware profile (NPS1, SMT off without one), ASPM
    off, Above 4G on, performance determinism, Resizable BAR on where GPUs are expected; ACS and the IOMMU are only
    judged when the operator names a value (overrides: {check id: canonical value}, null drops a check)."""
    profile = profile or {}
    cpu = profile.get("cpu") or {}
    gpus = (profile.get("gpus") or {}).get("count") or 0
    want = {
        "numa_nodes_per_socket": str(cpu.get("numa_nodes_per_socket", 1)),
        "smt_disabled": "on" if cpu.get("smt") else "off",
        "pcie_aspm_policy": "disabled",
        "above_4g_decoding": "enabled",
        "power_determinism": "performance",
    }
    if gpus:
        want["resizable_bar"] = "enabled"
    for check_id, value in (overrides or {}).items():
        if value is None:
            want.pop(check_id, None)
        else:
            want[check_id] = str(value).lower()
    return want


def refusals(overrides):
    """What is wrong with the operator's wanted values (unknown ids, values outside the canonical set)."""
    out = []
    for check_id, value in (overrides or {}).items():
        if check_id not in CANONICAL:
            out.append("bmc_bios_want: %s is not a check id (%s)" % (check_id, ", ".join(CHECK_IDS)))
        elif value is not None and str(value).lower() not in CANONICAL[check_id]:
            out.append("bmc_bios_want.%s: %r is not one of %s" % (check_id, value, ", ".join(CANONICAL[check_id])))
    return out


def _raw_for(spec, want):
    for raw, canonical in spec["values"].items():
        if canonical == want:
            return raw
    return None


def judge(vendor, attributes, want):
    """The report's checks ({id, status, observed, expected, attributes, source: bmc, why, reason}) and the plan:
    changes {attribute: raw value} that make every judged check pass, and the checks that cannot be written."""
    seen = read(vendor, attributes)
    checks, changes, unwritable = [], {}, []
    for check_id, label in CHECKS:
        got = seen[check_id]
        expected = want.get(check_id)
        if expected is None:
            status = "pass" if got["value"] != UNKNOWN else "warn"
            expected_text = "any (not judged)"
        elif got["value"] == expected:
            status = "pass"
            expected_text = expected
        elif got["value"] == UNKNOWN:
            status = "warn"
            expected_text = expected
        else:
            status = "fail"
            expected_text = expected
        check = {"id": check_id, "label": label, "status": status, "observed": got["value"],
                 "expected": expected_text, "attributes": got["raw"], "source": "bmc", "why": WHY[check_id]}
        if got["reason"]:
            check["reason"] = got["reason"]
        if status == "fail":
            spec = VENDORS[vendor]["checks"][check_id]
            raw = _raw_for(spec, expected)
            if raw is None:
                check["reason"] = "no %s value for %s is known to the map" % (VENDORS[vendor]["name"], expected)
                unwritable.append(check_id)
            else:
                for name in got["raw"]:
                    if str(attributes[name]) != raw:
                        changes[name] = raw
                for name, value in (spec.get("with") or {}).items():
                    if name in attributes and str(attributes[name]) != value:
                        changes[name] = value
        checks.append(check)
    return {"checks": checks, "changes": changes, "unwritable": unwritable, "summary": summarize(checks)}


def summarize(checks):
    counts = {"pass": 0, "warn": 0, "fail": 0}
    for check in checks:
        counts[check["status"]] += 1
    counts["failed_ids"] = [c["id"] for c in checks if c["status"] == "fail"]
    counts["unknown_ids"] = [c["id"] for c in checks if c["observed"] == UNKNOWN]
    return counts


def diff(attributes, changes):
    """The exact change, as check mode shows it: {attribute: {before, after}}."""
    return dict((name, {"before": (attributes or {}).get(name), "after": value})
                for name, value in sorted(changes.items()))


def table(checks):
    rows = [("STATUS", "CHECK", "OBSERVED", "EXPECTED", "ATTRIBUTES")]
    for c in checks:
        attrs = ", ".join("%s=%s" % kv for kv in sorted(c["attributes"].items())) or c.get("reason", "-")
        rows.append((c["status"].upper(), c["id"], c["observed"], c["expected"], attrs))
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    return ["  ".join(str(r[i]).ljust(widths[i]) for i in range(4)) + "  " + str(r[4]) for r in rows]


def applied(power_state, attributes, changes):
    """True when the node is on and every written attribute reads back as written."""
    return power_state == "On" and all(str((attributes or {}).get(n)) == str(v) for n, v in (changes or {}).items())


def cause(message):
    """What a failed Redfish call means for the operator, from the module's message (which names no secret)."""
    text = str(message or "")
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return ("the BMC's TLS certificate is not trusted (install a signed one, or bmc_validate_certs: false "
                "on a closed network): " + text)
    if "HTTP Error 401" in text or "HTTP Error 403" in text:
        return "the BMC refused the credentials (check bmc_username/bmc_password in the vault): " + text
    if "URL Error" in text or "Connection refused" in text or "timed out" in text or "No route" in text:
        return "the BMC is unreachable (check bmc_address, the network and that Redfish is on): " + text
    return "the BMC answered with an error: " + text
