"""Unit tests for plugins/filter/hmk_nvidia.py: the toolkit/driver table (CUDA 12.x and 13.x, the
13.4+ releases without a bundled driver, minor-version compatibility), version parsing (odd versions
included), the Blackwell/open-module and CUDA 13 architecture rules (from the profile and from the
GPUs the node shows), the error texts, the repository key fingerprint and the post-check parsers."""
import base64
import importlib
import io
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))

nv = importlib.import_module("hmk_nvidia")

HARDWARE = os.path.join(ROOT, "tests", "fixtures", "hardware")
FIXTURES = os.path.join(HARDWARE, "own")

# Throwaway keys made with GnuPG 2.2 (`gpg --quick-gen-key ... ed25519|rsa2048`, then
# `gpg --export-options export-minimal --armor --export`); the fingerprints are what
# `gpg --with-colons --list-keys` printed for them.
ED25519_KEY = """-----BEGIN PGP PUBLIC KEY BLOCK-----

mDMEaw0clBYJKwYBBAHaRw8BAQdA6UjTjaWSNbXVb73HnMa65FW4z53j1vf66qgM
Kzzy3IS0JGhtayB1bml0IHRlc3Qga2V5IDx1bml0QGhtay5pbnZhbGlkPoiQBBMW
CAA4FiEEmT7rHvcqzheYh9yCfOdvnRU/lUAFAmsNHJQCGwMFCwkIBwIGFQoJCAsC
BBYCAwECHgECF4AACgkQfOdvnRU/lUCV2QD9HZr8Cu+5KnXgYN+SrwkW9/QV8Amh
QOlGdt/x2W+aFHwBAO4Ei+3wGahHnVvQzciz95FXsJ1J7XYD1/HhoDoIu24N
=bagz
-----END PGP PUBLIC KEY BLOCK-----
"""
ED25519_FPR = "993EEB1EF72ACE179887DC827CE76F9D153F9540"

RSA_KEY = """-----BEGIN PGP PUBLIC KEY BLOCK-----
Comment: an armor header line, which must be skipped

mQENBGsNHJ4BCADF7pkkkU2BM975JDokXi+MOIKz8U/P8yJLqMduNLMmn612fLVy
GCdpni5jAVq18sN0CmzFUMzbXF8ecaZrSZT3yUE+r4Zbijm+KFgrTNqU/64zEBVL
rvAsBAMyBjXlNlwh+KK056ejf8IaOCBIfx0YilfczHla0fnhNUmeBmFtKaeSLGvK
nm1YNP+Q0Oc/XNSSukaZ1ziHH6jwdMhzNtb9rAaYlK3NzlJOKxT2AAC9qwgDvhyz
PKEzZDcJ7dFoBnqNWobmjx+PjvBMVTNKnZteAIhivj1hDD5M/DH8XyUEpWYP9al3
sfak+jkOf983hIEAqoSkValBQdmnBXhI3iZDABEBAAG0HmhtayB1bml0IHJzYSA8
cnNhQGhtay5pbnZhbGlkPokBTgQTAQoAOBYhBCjy/zQIgfjTGnp1eSPK+EsZpvBe
BQJrDRyeAhsDBQsJCAcCBhUKCQgLAgQWAgMBAh4BAheAAAoJECPK+EsZpvBeIZ4I
AI1kGeesoIhjlpmP5aWNTeSb+DJe7CbqnG1tjLm5bsj9VFoiX9w+7uouX1i4DL97
MayUOW2/lR2hx7xMejEMIENHMOUsKPjyBin0C0riUWtzO7G325D8trTqcMvogeLt
w1UP1RTC+qazlR+ZxZ0++/d3AENLqlLIXhiW7u5TGxUowZ6ZEEPyIkiRnCOnE8ve
CAyZQm4hxrmy4fs4TClr6ShTN5trGSxox/mbzkrAl0E8ZNy5gJE5iCnnLRdrnIU2
UA+IK/4/vZsWdNl6DR97vn11Qa7pg1IrizkMirLNN9H9RyIZV/Rpmxlnrho/5i2y
Ok0J8umRLENUmnE4va8uVXM=
=/Oz8
-----END PGP PUBLIC KEY BLOCK-----
"""
RSA_FPR = "28F2FF340881F8D31A7A757923CAF84B19A6F05E"


# --- the table -------------------------------------------------------------------------------

@pytest.mark.parametrize("toolkit, driver", [
    ("12.1", "530.30.02"),
    ("12.4", "550.54.14"),
    ("12.8", "570.26"),
    ("12.8.0", "570.26"),
    ("12.8.1", "570.124.06"),
    ("12.9", "575.51.03"),
    ("12.9.1", "575.51.03"),
    ("13.0", "580.65.06"),
    ("13", "580.65.06"),
    ("12-8", "570.26"),
    ("13.0.1", "580.82.07"),
    ("13.0.2", "580.95.05"),
    ("13.1", "590.44.01"),
    ("13.1.1", "590.48.01"),
    ("13.2", "595.45.04"),
    ("13.2.1", "595.58.03"),
    ("13.3", "610.43.02"),
    ("13.3.1", "610.43.02"),
    # No Linux driver comes with 13.4 and later: the oldest one they run on is the 13.x floor.
    ("13.4", "580.65.06"),
    ("13.5", "580.65.06"),
    ("13.5.0", "580.65.06"),
])
def test_minimum_driver_per_toolkit(toolkit, driver):
    assert nv.min_driver(toolkit) == driver


@pytest.mark.parametrize("driver, toolkit", [
    ("580", "13.0.2"), ("595", "13.2"), ("595.58.03", "13.2.1"), ("620", "13.3"), ("620", "13.0"), ("620", "12.8"),
])
def test_cuda13_pairs_the_table_vouches_for_pass(driver, toolkit):
    assert nv.compat_errors(driver, toolkit) == []


def test_cuda13_newer_than_the_branch_is_refused_naming_the_supported_branch_and_minor_version_compat():
    errors = nv.compat_errors("580", "13.3")
    assert len(errors) == 1
    text = errors[0]
    assert "CUDA toolkit 13.3 needs NVIDIA driver >= 610.43.02 but the driver is 580" in text
    assert 'nvidia_driver_branch to "610" or newer (supported: "620")' in text
    assert "nvidia_driver_allow_minor_version_compat: true" in text and "580.65.06" in text
    assert nv.compat_errors("580", "13.3", minor_version_compat=True) == []
    assert nv.compat_errors("595.45.04", "13.2.1")[0].startswith("CUDA toolkit 13.2.1 needs NVIDIA driver >= 595.58.03")


@pytest.mark.parametrize("toolkit", ["13.4", "13.5", "13.5.1"])
def test_cuda_13_4_and_later_come_without_a_driver_and_need_minor_version_compat(toolkit):
    for branch in ("580", "595", "620"):
        errors = nv.compat_errors(branch, toolkit)
        assert len(errors) == 1, errors
        assert "comes without a Linux driver" in errors[0] and ">= 580.65.06" in errors[0]
        assert "nvidia_driver_allow_minor_version_compat: true" in errors[0]
        assert nv.compat_errors(branch, toolkit, minor_version_compat=True) == []
    assert "needs NVIDIA driver >= 580.65.06 but the driver is 575" in nv.compat_errors("575", toolkit, minor_version_compat=True)[0]


def test_the_driver_required_on_the_node_follows_minor_version_compat():
    assert nv.required_driver("13.3") == "610.43.02"
    assert nv.required_driver("13.3", True) == "580.65.06"
    assert nv.required_driver("12.8", True) == "525.60.13"
    assert nv.required_driver("13.5", False) == "580.65.06"
    assert nv.required_driver("11.8", True) == "450.80.02"


def test_unknown_toolkit_is_refused_with_the_table_named():
    with pytest.raises(nv.CompatError) as err:
        nv.min_driver("12.7")
    assert "12.7" in str(err.value) and "MIN_DRIVER" in str(err.value)
    assert nv.compat_errors("570", "14.0")[0].startswith("CUDA toolkit 14.0 is not in the compatibility table")


@pytest.mark.parametrize("driver, toolkit", [
    ("570", "12.8"), ("570", "12.8.1"), ("570.124.06", "12.8.1"), ("570.26", "12.8"),
    ("575", "12.9"), ("580", "13.0"), ("580.65.06", "13.0"), ("580.95.05", "12.8"),
    ("550.54.14", "12.4"), ("535", "12.2"),
])
def test_compatible_pairs_pass(driver, toolkit):
    assert nv.compat_errors(driver, toolkit) == []


def test_branch_550_with_toolkit_12_8_names_both_versions_and_the_fix():
    errors = nv.compat_errors("550", "12.8")
    assert len(errors) == 1
    text = errors[0]
    assert "12.8" in text and "570.26" in text and "550" in text
    assert 'nvidia_driver_branch to "570"' in text
    assert 'nvidia_driver_cuda_toolkit_version to "12.4"' in text


def test_full_version_below_the_update_minimum_is_refused():
    # 12.8 Update 1 raised the minimum from 570.26 to 570.124.06 within the same branch.
    text = " ".join(nv.compat_errors("570.86.10", "12.8.1"))
    assert "570.124.06" in text and "570.86.10" in text and "12.8.1" in text
    assert nv.compat_errors("570.86.10", "12.8") == []


def test_cuda13_needs_580_even_with_minor_version_compat():
    text = " ".join(nv.compat_errors("575", "13.0", minor_version_compat=True))
    assert "580.65.06" in text and "575" in text and "13.0" in text


def test_minor_version_compat_accepts_12x_from_525_only_when_asked():
    assert nv.compat_errors("550", "12.8", minor_version_compat=True) == []
    assert nv.compat_errors("525", "12.9", minor_version_compat=True) == []
    assert nv.compat_errors("520", "12.8", minor_version_compat=True) != []
    assert nv.compat_errors("550", "12.8") != []


def test_no_toolkit_checks_only_the_driver_rules():
    assert nv.compat_errors("535", None) == []
    assert nv.compat_errors("535", "") == []


# --- version parsing --------------------------------------------------------------------------

@pytest.mark.parametrize("text, parsed", [
    ("570.124.06", (570, 124, 6)),
    ("580.65.06", (580, 65, 6)),
    ("12.8.1", (12, 8, 1)),
    ("570", (570,)),
    (570, (570,)),
    ("535.261.03-1", (535, 261, 3)),
    ("1:570.124.06-0ubuntu1", (570, 124, 6)),
    ("12.8.93-1", (12, 8, 93)),
    ("575.51.03~rc1", (575, 51, 3)),
    (" 570.26 ", (570, 26)),
])
def test_versions_parse(text, parsed):
    assert nv.parse_version(text) == parsed


@pytest.mark.parametrize("bad", ["", None, "r570", "570.x", "latest", "5 70"])
def test_unreadable_versions_raise(bad):
    with pytest.raises(nv.CompatError):
        nv.parse_version(bad)


def test_unreadable_branch_is_an_error_not_a_crash():
    errors = nv.compat_errors("latest", "12.8")
    assert len(errors) == 1 and "latest" in errors[0]


def test_numeric_not_lexical_comparison():
    assert nv.version_ge("580.65.06", "580.9")       # 65 > 9, lexically '6' < '9'
    assert nv.version_ge("570.124.06", "570.26")
    assert not nv.version_ge("570.26", "570.124.06")
    assert nv.version_ge("570.26.0", "570.26")
    assert nv.driver_in_branch("570.124.06", "570")
    assert not nv.driver_in_branch("575.51.03", "570")
    assert not nv.driver_in_branch("N/A", "570")


def test_toolkit_series():
    assert nv.toolkit_series("12.8") == "12.8"
    assert nv.toolkit_series("12.8.1") == "12.8"
    assert nv.toolkit_series("13") == "13.0"


# --- architectures ----------------------------------------------------------------------------

@pytest.mark.parametrize("arch, value, name", [
    ("89", 89, "Ada Lovelace"), ("120", 120, "Blackwell"), ("sm_120", 120, "Blackwell"),
    ("12.0", 120, "Blackwell"), ("8.9", 89, "Ada Lovelace"), (61, 61, "Pascal"), ("70", 70, "Volta"),
    ("compute_90", 90, "Hopper"), ("100a", 100, "Blackwell"), ("75", 75, "Turing"),
])
def test_arch_parsing(arch, value, name):
    assert nv.parse_arch(arch) == value
    assert nv.arch_name(arch) == name


def test_unreadable_arch_is_reported():
    errors = nv.compat_errors("570", "12.8", True, ["RTX 5090"])
    assert len(errors) == 1 and "RTX 5090" in errors[0] and '"120"' in errors[0]


def test_blackwell_refuses_proprietary_modules():
    errors = nv.compat_errors("570", "12.8", open_modules=False, gpu_archs=["120"])
    assert len(errors) == 1
    assert "sm_120" in errors[0] and "nvidia_driver_open_modules: true" in errors[0] and "570" in errors[0]


def test_blackwell_on_open_modules_and_r570_passes():
    assert nv.compat_errors("570", "12.8", open_modules=True, gpu_archs=["120"]) == []
    assert nv.compat_errors("570.124.06", "12.8.1", True, ["89", "120"]) == []


def test_blackwell_needs_r570():
    text = " ".join(nv.compat_errors("565", None, True, ["120"]))
    assert "sm_120" in text and "570" in text and "565" in text


def test_every_blackwell_compute_capability_refuses_proprietary_modules():
    for arch in ("100", "103", "120", "121", "10.0", "12.0", "sm_120"):
        errors = nv.compat_errors("580", None, open_modules=False, gpu_archs=[arch])
        assert len(errors) == 1 and "Blackwell" in errors[0] and "nvidia_driver_open_modules: true" in errors[0], arch


# --- the GPUs the node itself shows (lspci before the driver, nvidia-smi with one) --------------

LSPCI_5090 = ("01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GB202 [GeForce RTX 5090] [10de:2b85] (rev a1)\n"
              "01:00.1 Audio device [0403]: NVIDIA Corporation GB202 High Definition Audio Controller [10de:22e8] (rev a1)\n")
# Debian 12's pci.ids predates the card: lspci prints the id only.
LSPCI_5090_OLD_PCI_IDS = "0000:c1:00.0 VGA compatible controller [0300]: NVIDIA Corporation Device [10de:2b85] (rev a1)\n"
LSPCI_B200 = "1b:00.0 3D controller [0302]: NVIDIA Corporation GB100 [B200] [10de:2901] (rev a1)\n"


def read_hardware(name):
    with io.open(os.path.join(HARDWARE, name), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("text, shown", [
    (LSPCI_5090, ["01:00.0 NVIDIA Corporation GB202 [GeForce RTX 5090] [10de:2b85]"]),
    (LSPCI_5090_OLD_PCI_IDS, ["0000:c1:00.0 NVIDIA Corporation Device [10de:2b85]"]),
    (LSPCI_B200, ["1b:00.0 NVIDIA Corporation GB100 [B200] [10de:2901]"]),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n", ["NVIDIA RTX PRO 6000 Blackwell Workstation Edition"]),
    ("NVIDIA GB200\nNVIDIA B300 SXM6 AC\nNVIDIA GeForce RTX 5070 Ti\n",
     ["NVIDIA GB200", "NVIDIA B300 SXM6 AC", "NVIDIA GeForce RTX 5070 Ti"]),
], ids=["lspci-rtx5090", "lspci-old-pci-ids", "lspci-b200", "smi-rtx-pro-6000", "smi-names"])
def test_blackwell_gpus_are_recognised_by_name_or_pci_id(text, shown):
    assert nv.blackwell_gpus(text) == shown


def test_real_outputs_show_blackwell_only_where_it_is():
    assert len(nv.blackwell_gpus(read_hardware("nvidia-smi--1x-rtx5090-driver-595-cuda-13.2-p5.txt"))) == 1
    assert len(nv.blackwell_gpus(read_hardware("nvidia-smi--2x-rtx5090-r610-kmd-version-header.txt"))) == 2
    assert nv.blackwell_gpus(read_hardware("nvidia-smi--4x-rtx6000ada-esc8000a-2x-epyc-9374f.txt")) == []
    assert nv.blackwell_gpus(read_hardware("lspci-nnk--2x-rtx3090-nvidia-driver-grep-A3.txt")) == []


def test_blackwell_on_the_node_refuses_proprietary_modules_whatever_the_profile_says():
    errors = nv.node_gpu_errors(LSPCI_5090_OLD_PCI_IDS, "580", open_modules=False)
    assert len(errors) == 1
    assert "Blackwell" in errors[0] and "[10de:2b85]" in errors[0] and "nvidia_driver_open_modules: true" in errors[0]
    assert nv.node_gpu_errors(LSPCI_5090_OLD_PCI_IDS, "580", open_modules=True) == []
    assert nv.node_gpu_errors(read_hardware("lspci-nnk--2x-rtx3090-nvidia-driver-grep-A3.txt"), "580", False) == []
    assert nv.node_gpu_errors("", "535", False) == []


def test_blackwell_on_the_node_refuses_a_branch_before_r570():
    text = " ".join(nv.node_gpu_errors(LSPCI_B200, "535", open_modules=True))
    assert "B200" in text and "570 or newer" in text and "535" in text and 'nvidia_driver_branch to "580"' in text


def test_ada_runs_either_module_flavour():
    assert nv.compat_errors("570", "12.8", False, ["89", "89", "89", "89"]) == []
    assert nv.compat_errors("570", "12.8", True, ["89"]) == []


@pytest.mark.parametrize("arch, name", [("52", "Maxwell"), ("61", "Pascal"), ("70", "Volta")])
def test_cuda13_refused_for_maxwell_pascal_volta(arch, name):
    errors = nv.compat_errors("580", "13.0", open_modules=False, gpu_archs=[arch])
    assert len(errors) == 1
    assert "sm_%s" % arch in errors[0] and name in errors[0] and "13.0" in errors[0] and "12.9" in errors[0]
    assert nv.compat_errors("575", "12.9", open_modules=False, gpu_archs=[arch]) == []


def test_open_modules_refused_before_turing():
    errors = nv.compat_errors("570", "12.8", open_modules=True, gpu_archs=["61"])
    assert len(errors) == 1 and "sm_61" in errors[0] and "nvidia_driver_open_modules: false" in errors[0]


def test_no_gpu_profile_checks_only_versions():
    assert nv.compat_errors("570", "12.8", True, []) == []
    assert nv.compat_errors("570", "12.8", True, None) == []
    assert nv.compat_errors("570", "12.8", True, "") == []


# --- repository key ---------------------------------------------------------------------------

def test_fingerprint_of_an_ed25519_key_matches_gpg():
    assert nv.openpgp_fingerprint(ED25519_KEY) == ED25519_FPR


def test_fingerprint_of_an_rsa_key_with_armor_headers_matches_gpg():
    assert nv.openpgp_fingerprint(RSA_KEY) == RSA_FPR


def test_fingerprint_of_a_new_format_packet():
    body = "".join(line for line in ED25519_KEY.splitlines()[2:-2])
    data = base64.b64decode(body)
    assert data[0] == 0x98                      # old format, tag 6, one-byte length
    length = data[1]
    new_format = bytes([0xC6, length]) + data[2:]
    assert nv.openpgp_fingerprint(new_format) == ED25519_FPR


@pytest.mark.parametrize("bad", ["not a key", "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nAAAA\n-----END PGP PUBLIC KEY BLOCK-----"])
def test_not_a_key_is_refused(bad):
    with pytest.raises(nv.CompatError):
        nv.openpgp_fingerprint(bad)


def test_fingerprint_normalisation():
    assert nv.normalize_fingerprint("eb69 3b30 35cd 5710 e231  e123 a4b4 6996 3bf8 63cc") == \
        "EB693B3035CD5710E231E123A4B469963BF863CC"
    assert nv.normalize_fingerprint("0xEB693B3035CD5710E231E123A4B469963BF863CC") == \
        "EB693B3035CD5710E231E123A4B469963BF863CC"


# --- post-check parsers -----------------------------------------------------------------------

def test_nvidia_smi_rows():
    text = "0, NVIDIA GeForce RTX 4090, 570.124.06, 380.00\n1, NVIDIA GeForce RTX 4090, 570.124.06, 450.00\n"
    gpus = nv.parse_nvidia_smi_gpus(text)
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["driver_version"] == "570.124.06" and gpus[0]["power_limit_w"] == 380.0


def test_nvidia_smi_failure_text_yields_no_gpu():
    with io.open(os.path.join(FIXTURES, "nvidia-smi--no-driver.txt"), encoding="utf-8") as handle:
        assert nv.parse_nvidia_smi_gpus(handle.read()) == []
    assert nv.parse_nvidia_smi_gpus("0, NVIDIA GeForce RTX 5090, 575.51.03, [N/A]")[0]["power_limit_w"] is None


def test_nvcc_release():
    text = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Fri_Feb_21_20:23:50_PST_2025\nCuda compilation tools, release 12.8, V12.8.93\n"
            "Build cuda_12.8.r12.8/compiler.35583870_0\n")
    assert nv.nvcc_release(text) == "12.8"
    assert nv.nvcc_release("bash: nvcc: command not found") is None


def test_boot_kernel_is_the_newest_installed_release():
    assert nv.boot_kernel(["/boot/vmlinuz-6.1.0-9-amd64", "linux-image-6.1.0-50-amd64",
                           "linux-image-6.1.0-50-amd64-unsigned", "linux-image-amd64"]) == "6.1.0-50-amd64"
    assert nv.boot_kernel(["/boot/vmlinuz-6.8.0-45-generic", "/boot/vmlinuz-6.8.0-100-generic",
                           "/boot/vmlinuz-6.11.0-9-generic"]) == "6.11.0-9-generic"
    assert nv.boot_kernel([]) == ""
