"""The BMC vendor map against real attribute dumps and registries (tests/fixtures/bmc/INDEX.md names each source)."""
import json
import re
from pathlib import Path

import pytest

from ansible_collections.hmk.moe_kit.plugins.filter import bmc as bmc_filter
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_bmc_vendors as vendors
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_hardware

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bmc"


def dump(name):
    return json.loads((FIXTURES / name).read_text())["Attributes"]


def by_id(result):
    return dict((c["id"], c) for c in result["checks"])


SETTINGS = json.loads((FIXTURES / "weka-bios-settings.json").read_text())["settings"]
HPE_REGISTRY = json.loads((FIXTURES / "hpe-ilo6-170-bios-registry.json").read_text())


def test_shared_check_ids_are_the_preflights_own():
    assert set(vendors.SHARED_WITH_PREFLIGHT) <= set(hmk_hardware.CHECK_IDS)
    assert set(vendors.CHECK_IDS) - set(vendors.SHARED_WITH_PREFLIGHT) == {
        "pcie_acs", "above_4g_decoding", "resizable_bar", "power_determinism", "iommu"}
    for vendor in vendors.VENDORS.values():
        assert set(vendor["checks"]) == set(vendors.CHECK_IDS)


def test_every_mapped_value_appears_in_a_stored_source():
    """No value in the map was guessed: each raw value is in a dump, WEKA's settings or HPE's registry."""
    seen = {}
    for path in FIXTURES.glob("*.json"):
        data = json.loads(path.read_text())
        for name, value in (data.get("Attributes") or {}).items():
            seen.setdefault(name, set()).add(str(value))
    for per_arch in SETTINGS.values():
        for per_model in (per_arch or {}).values():
            for attrs in (per_model or {}).values():
                for name, value in (attrs or {}).items():
                    seen.setdefault(name, set()).add(str(value))
    for name, values in HPE_REGISTRY["allowed_values"].items():
        seen.setdefault(name, set()).update(values)
    for key, vendor in vendors.VENDORS.items():
        for check_id, spec in vendor["checks"].items():
            if "unknown" in spec:
                continue
            if "attribute" in spec:
                names = [spec["attribute"]]
            else:
                regex = re.compile(spec["pattern"])
                names = [n for n in seen if regex.match(n)]
            assert names, (key, check_id)
            values = set().union(*(seen[n] for n in names))
            for raw in spec["values"]:
                assert raw in values, (key, check_id, raw, sorted(values))
            for name, raw in (spec.get("with") or {}).items():
                assert raw in seen[name], (key, name, raw)


def test_hpe_attributes_the_map_names_exist_in_the_ilo6_registry():
    names = set(HPE_REGISTRY["attribute_names"])
    for check_id, spec in vendors.VENDORS["hpe"]["checks"].items():
        if "attribute" in spec:
            assert spec["attribute"] in names, check_id
        elif "pattern" in spec:
            assert any(re.match(spec["pattern"], n) for n in names), check_id
    assert not [n for n in names if re.search(r"Above4G|ResizableBar|ReBar|Acs[A-Z]?", n)]


def test_dell_r6615_as_shipped_fails_smt_and_power_determinism():
    result = vendors.judge("dell", dump("dell-poweredge-r6615.json"), vendors.wanted({}))
    checks = by_id(result)
    assert checks["numa_nodes_per_socket"]["status"] == "pass"
    assert checks["numa_nodes_per_socket"]["attributes"] == {"NumaNodesPerSocket": "1"}
    assert checks["smt_disabled"]["status"] == "fail" and checks["smt_disabled"]["observed"] == "on"
    assert checks["pcie_aspm_policy"]["status"] == "pass"
    assert checks["power_determinism"]["observed"] == "power"
    assert checks["iommu"]["observed"] == "enabled" and checks["iommu"]["expected"] == "any (not judged)"
    assert checks["above_4g_decoding"]["observed"] == "unknown"
    assert "MmioLimit" in checks["above_4g_decoding"]["reason"]
    assert checks["pcie_acs"]["status"] == "warn"
    assert result["changes"] == {"LogicalProc": "Disabled", "DeterminismSlider": "PerfDeterminism"}
    assert all(c["source"] == "bmc" for c in result["checks"])


def test_wekapod_r6615_reads_performance_determinism():
    checks = by_id(vendors.judge("dell", dump("weka-wekapod-r6615.json"), vendors.wanted({})))
    assert checks["power_determinism"] == dict(checks["power_determinism"], status="pass", observed="performance")


def test_dell_r670_resizable_bar_is_read_where_gpus_are_expected():
    checks = by_id(vendors.judge("dell", dump("dell-poweredge-r670.json"), vendors.wanted({"gpus": {"count": 1}})))
    assert checks["resizable_bar"]["status"] == "pass"
    assert checks["pcie_aspm_policy"]["status"] == "fail"  # PcieAspmL1: Enabled on this R670


def test_hpe_dl325_gen11_reads_nps1_smt_on_and_per_slot_aspm():
    result = vendors.judge("hpe", dump("hpe-proliant-dl325-gen11.json"), vendors.wanted({}))
    checks = by_id(result)
    assert checks["numa_nodes_per_socket"]["observed"] == "1"
    assert checks["smt_disabled"]["status"] == "fail"
    aspm = checks["pcie_aspm_policy"]
    assert aspm["status"] == "pass" and len(aspm["attributes"]) >= 3
    assert all(re.match(r"^PciSlot\d+Aspm$", n) for n in aspm["attributes"])
    assert checks["power_determinism"]["status"] == "pass"
    assert checks["iommu"]["observed"] == "disabled"
    for check_id in ("pcie_acs", "above_4g_decoding", "resizable_bar"):
        assert checks[check_id]["observed"] == "unknown"
    assert result["changes"] == {"ProcSMT": "Disabled"}


def test_hpe_gen10plus_auto_nps_and_power_determinism_are_fixed_with_manual_control():
    attrs = dump("hpe-proliant-dl325-gen10plus.json")
    result = vendors.judge("hpe", attrs, vendors.wanted({}))
    checks = by_id(result)
    assert checks["numa_nodes_per_socket"]["observed"] == "auto"
    assert checks["numa_nodes_per_socket"]["status"] == "fail"
    assert checks["power_determinism"]["observed"] == "power"
    assert result["changes"]["NumaMemoryDomainsPerSocket"] == "OneMemoryDomainPerSocket"
    assert result["changes"]["PerformanceDeterminism"] == "PerformanceDeterministic"
    assert result["changes"]["DeterminismControl"] == "DeterminismCtrlManual"
    assert vendors.diff(attrs, result["changes"])["DeterminismControl"] == {
        "before": "DeterminismCtrlAuto", "after": "DeterminismCtrlManual"}


def test_lenovo_sr635v3_smt_is_fixed_and_auto_64bit_mmio_cannot_be_written_without_a_known_value():
    result = vendors.judge("lenovo", dump("lenovo-thinksystem-sr635v3.json"), vendors.wanted({}))
    checks = by_id(result)
    assert checks["numa_nodes_per_socket"]["status"] == "pass"
    assert checks["smt_disabled"]["status"] == "fail"
    assert result["changes"] == {"Processors_SMTMode": "Disabled"}
    assert checks["above_4g_decoding"]["observed"] == "auto"
    assert result["unwritable"] == ["above_4g_decoding"]
    assert "no Lenovo (XClarity) value for enabled" in checks["above_4g_decoding"]["reason"]
    assert checks["power_determinism"]["status"] == "pass"


def test_supermicro_names_are_matched_across_the_board_suffix():
    attrs = dump("supermicro-as-1115cs-tnr.json")
    result = vendors.judge("supermicro", attrs, vendors.wanted({"gpus": {"count": 1}}))
    checks = by_id(result)
    assert checks["numa_nodes_per_socket"]["attributes"] == {"NUMANodesPerSocket_703E": "NPS4"}
    assert checks["numa_nodes_per_socket"]["observed"] == "4"
    assert checks["numa_nodes_per_socket"]["status"] == "fail"
    assert result["changes"] == {"NUMANodesPerSocket_703E": "NPS1"}
    assert checks["smt_disabled"]["status"] == "pass"
    assert checks["above_4g_decoding"]["status"] == "pass"
    assert checks["resizable_bar"]["status"] == "fail" and result["unwritable"] == ["resizable_bar"]
    assert checks["pcie_acs"]["observed"] == "auto"
    # another board, another suffix: the same setting
    assert vendors.read("supermicro", {"SMTControl_1234": "Disabled"})["smt_disabled"]["value"] == "off"


def test_unknown_vendor_and_unknown_values_are_unknown_never_guessed():
    result = vendors.judge(None, dump("dell-poweredge-r6615.json"), vendors.wanted({}))
    assert {c["observed"] for c in result["checks"]} == {"unknown"}
    assert result["changes"] == {} and result["summary"]["fail"] == 0
    odd = vendors.read("hpe", {"ProcSMT": "Maybe"})
    assert odd["smt_disabled"] == {"value": "unknown", "raw": {"ProcSMT": "Maybe"},
                                   "reason": "value ProcSMT=Maybe is not in the map"}
    assert vendors.read("hpe", {})["smt_disabled"]["reason"] == "attribute ProcSMT not on this BMC"


@pytest.mark.parametrize("manufacturer, key", [
    ("Dell Inc.", "dell"), ("HPE", "hpe"), ("Hewlett Packard Enterprise", "hpe"), ("Lenovo", "lenovo"),
    ("Supermicro", "supermicro"), ("Sushy Emulator", None), ("ASRockRack", None), ("", None)])
def test_vendor_is_recognised_from_the_manufacturer(manufacturer, key):
    assert vendors.vendor_of(manufacturer) == key


def test_vendor_override_names_a_map_entry_or_nothing():
    assert vendors.vendor_of("Sushy Emulator", "hpe") == "hpe"
    assert vendors.vendor_of("Dell Inc.", "openbmc") is None


def test_wanted_values_follow_the_profile_and_the_overrides():
    want = vendors.wanted({"cpu": {"numa_nodes_per_socket": 2, "smt": True}, "gpus": {"count": 2}},
                          {"iommu": "Enabled", "power_determinism": None})
    assert want == {"numa_nodes_per_socket": "2", "smt_disabled": "on", "pcie_aspm_policy": "disabled",
                    "above_4g_decoding": "enabled", "resizable_bar": "enabled", "iommu": "enabled"}
    assert vendors.refusals({"iommu": "on", "nps": 1}) == [
        "bmc_bios_want.iommu: 'on' is not one of enabled, disabled, auto",
        "bmc_bios_want: nps is not a check id (numa_nodes_per_socket, smt_disabled, pcie_aspm_policy, pcie_acs, "
        "above_4g_decoding, resizable_bar, power_determinism, iommu)"]


def test_errors_name_their_cause():
    assert vendors.cause("HTTP Error 401 on GET request to 'https://10.0.0.5/redfish/v1/Systems'").startswith(
        "the BMC refused the credentials")
    assert vendors.cause("URL Error on GET request to 'https://10.0.0.5/redfish/v1/': [Errno 111] Connection "
                         "refused").startswith("the BMC is unreachable")
    assert "not trusted" in vendors.cause("URL Error: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")


def _facts(manufacturer, attributes, power="On"):
    return {"system": {"ret": True, "entries": [[{"system_uri": "/redfish/v1/Systems/1"},
                                                 {"Manufacturer": manufacturer, "Model": "m", "PowerState": power}]]},
            "bios_attribute": {"ret": True, "entries": [[{"system_uri": "/redfish/v1/Systems/1"}, attributes]]}}


def test_filter_reads_redfish_info_results_and_knows_when_a_change_took_effect():
    attrs = dump("hpe-proliant-dl325-gen11.json")
    report = bmc_filter.hmk_bmc_judge(_facts("HPE", attrs), {}, {}, "auto")
    assert report["vendor"] == "hpe" and report["diff"] == {"ProcSMT": {"before": "Enabled", "after": "Disabled"}}
    assert report["table"][0].startswith("STATUS")
    assert not bmc_filter.hmk_bmc_applied(_facts("HPE", attrs), report["changes"])
    done = dict(attrs, ProcSMT="Disabled")
    assert not bmc_filter.hmk_bmc_applied(_facts("HPE", done, power="Off"), report["changes"])
    assert bmc_filter.hmk_bmc_applied(_facts("HPE", done), report["changes"])
    with pytest.raises(bmc_filter.AnsibleFilterError, match="2 systems"):
        facts = _facts("HPE", attrs)
        facts["system"]["entries"] *= 2
        bmc_filter.hmk_bmc_judge(facts)
