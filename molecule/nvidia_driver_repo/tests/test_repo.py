"""NVIDIA-repository path of the nvidia_driver role, against the STAND-IN repository prepare built
(stand-in packages carry NVIDIA's names and versions and say "STAND-IN" in their descriptions;
they are not NVIDIA software)."""
import importlib
import json
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))
nv = importlib.import_module("hmk_nvidia")

STANDIN_DIR = os.environ.get("HMK_STANDIN_DIR", "/var/tmp/hybrid-moe-kit/molecule-nvidia_driver_repo")
HELD = ["nvidia-open", "nvidia-persistenced", "nvidia-kernel-open-dkms", "libnvidia-compute", "nvidia-driver-pinning-570"]


@pytest.fixture(scope="module")
def throwaway_fingerprint():
    with open(os.path.join(STANDIN_DIR, "repo", "fingerprint"), encoding="ascii") as handle:
        return handle.read().strip()


@pytest.fixture(scope="module")
def image_kernel(host):
    lines = host.check_output("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' 'linux-image-[0-9]*'").splitlines()
    return [line.split()[1][len("linux-image-"):] for line in lines if line.startswith("ii")][0]


def test_packages_are_labelled_stand_ins(host):
    for name in ["nvidia-open", "nvidia-driver-pinning-570", "cuda-toolkit-12-8", "nvidia-kernel-open-dkms"]:
        description = host.check_output("dpkg-query -W -f='${Description}' %s" % name)
        assert description.startswith("STAND-IN for NVIDIA's %s" % name), description


def test_keyring_is_the_checked_key(host, throwaway_fingerprint):
    keyring = host.file("/etc/apt/keyrings/hmk-nvidia-cuda.asc")
    assert keyring.mode == 0o644
    assert nv.openpgp_fingerprint(keyring.content_string) == throwaway_fingerprint


def test_source_is_deb822_signed_by_that_keyring(host):
    source = host.file("/etc/apt/sources.list.d/hmk-nvidia-cuda.sources").content_string
    assert "URIs: http://127.0.0.1:18305/\n" in source
    assert "Suites: /\n" in source
    assert "Signed-By: /etc/apt/keyrings/hmk-nvidia-cuda.asc\n" in source


def _transactions(history):
    """/var/log/apt/history.log as a list of {field: value} per apt transaction, in order."""
    entries = []
    for block in re.split(r"\n\s*\n", history.strip()):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", block, re.M))
        if "Start-Date" in fields:
            entries.append(fields)
    return entries


def test_pinning_package_installed_alone_before_the_driver(host):
    entries = _transactions(host.file("/var/log/apt/history.log").content_string)
    installs = [entry.get("Install", "") for entry in entries]
    pin = [i for i, text in enumerate(installs) if "nvidia-driver-pinning-570:" in text]
    driver = [i for i, text in enumerate(installs) if re.search(r"(^|, )nvidia-open:amd64 \(570\.124\.06-1", text)]
    assert len(pin) == 1 and len(driver) == 1, installs
    assert pin[0] < driver[0]
    assert installs[pin[0]].count(":") == 1, "pinning transaction installed more: " + installs[pin[0]]


def test_pin_holds_the_branch_although_a_newer_one_is_offered(host):
    policy = host.check_output("apt-cache policy nvidia-open")
    assert "Installed: 570.124.06-1" in policy
    assert "575.51.03-1" in policy, "the stand-in repository offers 575 too"
    assert "Candidate: 570.124.06-1" in policy
    assert host.package("nvidia-open").version == "570.124.06-1"


def test_driver_packages_are_held(host):
    held = host.check_output("apt-mark showhold").split()
    for name in HELD:
        assert name in held, (name, held)


def test_upgrade_would_not_move_the_driver(host):
    simulation = host.check_output("apt-get -s upgrade")
    assert not re.search(r"^Inst (nvidia|libnvidia)", simulation, re.M), simulation


def test_unattended_upgrades_blacklist(host):
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    for pattern in ("nvidia-", "libnvidia-", "cuda-"):
        assert 'Unattended-Upgrade::Package-Blacklist:: "%s";' % pattern in dump


def test_stand_in_module_built_by_dkms_for_the_image_kernel(host, image_kernel):
    assert host.check_output("uname -r") != image_kernel
    status = host.check_output("dkms status -k %s" % image_kernel)
    assert re.search(r"^nvidia/570\.124\.06, %s, x86_64: installed" % re.escape(image_kernel), status, re.M), status
    assert host.file("/lib/modules/%s/updates/dkms/nvidia.ko" % image_kernel).is_file


def test_nouveau_blacklisted_in_the_image_kernels_initramfs(host, image_kernel):
    listing = host.check_output("lsinitramfs /boot/initrd.img-%s" % image_kernel).splitlines()
    assert "etc/modprobe.d/blacklist-nouveau.conf" in listing


def test_toolkit_on_path_for_login_shells(host):
    out = host.check_output("bash -lc 'command -v nvcc; nvcc --version; echo LD=$LD_LIBRARY_PATH'")
    assert out.splitlines()[0] == "/usr/local/cuda-12.8/bin/nvcc"
    assert nv.nvcc_release(out) == "12.8"
    assert "LD=/usr/local/cuda-12.8/lib64" in out


def test_persistence_daemon_enabled_not_started_without_gpu(host):
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert not service.is_running


def test_no_power_limit_unit_when_none_is_set(host):
    assert not host.file("/etc/systemd/system/hmk-nvidia-power-limit.service").exists


def test_role_reported_no_gpu(host, image_kernel):
    status = json.loads(host.file("/var/lib/hybrid-moe-kit/nvidia_driver.json").content_string)
    assert status["gpus_present"] is False and status["gpu_checks"] == "skipped: no GPU on this node"
    assert status["toolkit"] == "12.8" and status["branch"] == "570" and status["boot_kernel"] == image_kernel


def test_check_mode_on_the_fresh_twin_reported_changes(host):
    recap = host.file("/var/tmp/hmk-side-effect-check-recap.txt").content_string
    assert int(re.search(r"changed=(\d+)", recap).group(1)) > 0
    assert "failed=0" in recap


def test_wrong_fingerprint_was_refused_naming_both(host, throwaway_fingerprint):
    text = host.file("/var/tmp/hmk-side-effect-wrong-fingerprint.txt").content_string
    assert throwaway_fingerprint in text and "0123456789ABCDEF0123456789ABCDEF01234567" in text
    assert "Nothing was added to apt" in text


def test_incompatible_pair_was_refused_naming_both(host):
    text = host.file("/var/tmp/hmk-side-effect-incompatible.txt").content_string
    assert "CUDA toolkit 12.8 needs NVIDIA driver >= 570.26 but the driver is 550" in text
