"""/proc/devices of both NVIDIA device namings against the inference unit's device rules
(plugins/module_utils/hmk_nvidia_devices.py; fixtures: tests/fixtures/proc-devices/INDEX.md).

systemd resolves DeviceAllow=char-GLOB with fnmatch(3) over the "Character devices:" section when it builds the
unit's device filter (src/core/bpf-devices.c, read in Debian's 252.39 and 257.13 sources); Python's
fnmatch.fnmatchcase is the same match for these patterns (no '/', no locale classes)."""
import importlib.util
from pathlib import Path

import pytest
import yaml

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_nvidia_devices as nvd

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "proc-devices"
UNIT_ALLOW = yaml.safe_load((REPO / "roles" / "inference_service" / "vars" / "main.yml").read_text())[
    "__inference_service_gpu_devices"]
OLD_ALLOW = ["char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps", "char-nvidia-caps-imex-channels"]

_spec = importlib.util.spec_from_file_location("inference_service_filters_nvd",
                                               REPO / "plugins" / "filter" / "inference_service.py")
svc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(svc)


def text(name):
    return (FIX / name).read_text()


def test_the_unit_allows_one_glob():
    assert UNIT_ALLOW == ["char-nvidia*"]


@pytest.mark.parametrize("name, naming, control", [
    ("twin-standin-r580.txt", "nvidia + nvidiactl (550.40 and newer)", ["nvidia", "nvidiactl"]),
    ("twin-standin-r535.txt", "nvidia-frontend (535 branch and older)", ["nvidia-frontend"]),
])
def test_both_namings_pass_the_units_glob_and_nothing_else_does(name, naming, control):
    result = nvd.nvidia(text(name), UNIT_ALLOW)
    assert result["naming"] == naming and result["control_major"] == 195
    assert result["problems"] == []
    assert result["uvm_major"] and result["uvm_major"] != 195
    assert result["allowed"] == result["names"]
    assert set(control) | {"nvidia-uvm", "nvidia-caps"} == set(result["names"])
    chars = nvd.parse(text(name))["char"]
    # the decoy and every other driver stay outside the rule
    assert "hmk-standin-decoy" in chars and "hmk-standin-decoy" not in result["allowed"]
    assert {"mem", "tty", "misc"} <= set(chars) and not {"mem", "tty", "misc"} & set(result["allowed"])


def test_the_rules_the_kit_had_before_refuse_the_newer_naming_only():
    newer = nvd.nvidia(text("twin-standin-r580.txt"), OLD_ALLOW)
    assert newer["missing_from_allow"] == ["nvidia", "nvidiactl"]
    assert newer["problems"][0]["what"].startswith("DeviceAllow=char-nvidia-frontend")
    assert nvd.nvidia(text("twin-standin-r535.txt"), OLD_ALLOW)["problems"] == []


def test_a_real_driver_listing_with_imex_channels_is_allowed_by_the_glob():
    result = nvd.nvidia(text("dra-driver-nvidia-gpu-pr304-excerpt.txt"), UNIT_ALLOW)
    assert result["names"] == ["nvidia-caps", "nvidia-caps-imex-channels"]
    assert result["allowed"] == result["names"]
    assert nvd.parse(text("dra-driver-nvidia-gpu-pr304-excerpt.txt"))["char"]["nvidia-caps"] == 511


def test_a_node_without_the_driver_fails_with_the_fix():
    result = svc.nvidia_devices(text("ci-machine-no-gpu.txt"), UNIT_ALLOW)
    assert result["naming"] is None and result["control_major"] is None
    assert len(result["problems"]) == 1
    assert "no NVIDIA driver" in result["problems"][0]["what"] and "playbooks/gpu.yml" in result["problems"][0]["fix"]


def test_a_driver_without_unified_memory_fails_with_the_boot_unit_as_fix():
    without_uvm = "\n".join(line for line in text("twin-standin-r580.txt").splitlines() if "nvidia-uvm" not in line)
    result = nvd.nvidia(without_uvm, UNIT_ALLOW)
    assert [p["what"] for p in result["problems"]] == [
        "/proc/devices lists the NVIDIA driver but not nvidia-uvm: CUDA cannot start without unified memory"]
    assert "hmk-nvidia-device-nodes.service" in result["problems"][0]["fix"]


def test_block_devices_are_not_character_devices():
    parsed = nvd.parse(text("ci-machine-no-gpu.txt"))
    assert parsed["block"]["virtblk"] == 254 and "virtblk" not in parsed["char"]
