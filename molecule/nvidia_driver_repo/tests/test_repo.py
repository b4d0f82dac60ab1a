"""NVIDIA-repository path of the nvidia_driver role, against the STAND-IN repository prepare built
(stand-in packages carry NVIDIA's names and versions and say "STAND-IN" in their descriptions;
they are not NVIDIA software). nvidia-repo was a fresh node; nvidia-repo-keyring already had
cuda-keyring's source and keyring for the same URL (staged by prepare), which the role reuses."""
import importlib
import json
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))
# The filter imports the collection's module_utils (the shared validator), as it does in the roles.
sys.path.insert(0, os.path.join(ROOT, ".collections"))
nv = importlib.import_module("hmk_nvidia")

STANDIN_DIR = os.environ.get("HMK_STANDIN_DIR", "/var/tmp/hybrid-moe-kit/molecule-nvidia_driver_repo")
HELD = ["nvidia-open", "nvidia-persistenced", "nvidia-kernel-open-dkms", "libnvidia-compute", "nvidia-driver-pinning-580"]
CUDA_KEYRING_LIST = "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"
OWN_SOURCES = "/etc/apt/sources.list.d/hmk-nvidia-cuda.sources"


def set_up_nvidias_way(host):
    return host.backend.get_hostname() == "nvidia-repo-keyring"


@pytest.fixture(scope="module")
def throwaway_fingerprint():
    with open(os.path.join(STANDIN_DIR, "repo", "fingerprint"), encoding="ascii") as handle:
        return handle.read().strip()


@pytest.fixture(scope="module")
def image_kernel(host):
    lines = host.check_output("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' 'linux-image-[0-9]*'").splitlines()
    return [line.split()[1][len("linux-image-"):] for line in lines if line.startswith("ii")][0]


def test_packages_are_labelled_stand_ins(host):
    for name in ["nvidia-open", "nvidia-driver-pinning-580", "cuda-toolkit-12-8", "nvidia-kernel-open-dkms"]:
        description = host.check_output("dpkg-query -W -f='${Description}' %s" % name)
        assert description.startswith("STAND-IN for NVIDIA's %s" % name), description


def test_apt_reads_exactly_one_source_for_the_repository(host):
    update = host.run("apt-get update")
    assert update.rc == 0 and "Conflicting values" not in update.stderr, update.stderr
    listed = host.check_output("grep -rl 127.0.0.1:18305 /etc/apt/sources.list /etc/apt/sources.list.d/ || true").split()
    assert listed == ([CUDA_KEYRING_LIST] if set_up_nvidias_way(host) else [OWN_SOURCES])
    assert "http://127.0.0.1:18305" in host.check_output("apt-cache policy nvidia-open")


def test_the_roles_own_source_is_signed_by_the_checked_keyring_on_a_fresh_node(host, throwaway_fingerprint):
    if set_up_nvidias_way(host):
        assert not host.file(OWN_SOURCES).exists and not host.file("/etc/apt/keyrings/hmk-nvidia-cuda.asc").exists
        return
    keyring = host.file("/etc/apt/keyrings/hmk-nvidia-cuda.asc")
    assert keyring.mode == 0o644
    assert nv.openpgp_fingerprint(keyring.content_string) == throwaway_fingerprint
    source = host.file(OWN_SOURCES).content_string
    assert "URIs: http://127.0.0.1:18305/\n" in source
    assert "Suites: /\n" in source
    assert "Signed-By: /etc/apt/keyrings/hmk-nvidia-cuda.asc\n" in source


def test_cuda_keyrings_source_and_keyring_are_kept_as_they_were(host, throwaway_fingerprint):
    if not set_up_nvidias_way(host):
        assert not host.file(CUDA_KEYRING_LIST).exists
        return
    assert host.file(CUDA_KEYRING_LIST).content_string == \
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] http://127.0.0.1:18305/ /\n"
    keyring = host.file("/usr/share/keyrings/cuda-archive-keyring.gpg").content
    assert nv.openpgp_fingerprints(keyring) == [throwaway_fingerprint]
    before = host.file("/var/tmp/hmk-before/files").content_string
    assert host.check_output("sha256sum %s" % CUDA_KEYRING_LIST) in before.splitlines()


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
    pin = [i for i, text in enumerate(installs) if "nvidia-driver-pinning-580:" in text]
    driver = [i for i, text in enumerate(installs) if re.search(r"(^|, )nvidia-open:amd64 \(580\.95\.05-1", text)]
    assert len(pin) == 1 and len(driver) == 1, installs
    assert pin[0] < driver[0]
    assert installs[pin[0]].count(":") == 1, "pinning transaction installed more: " + installs[pin[0]]


@pytest.mark.parametrize("name", ["nvidia-open", "nvidia-kernel-open-dkms", "libnvidia-compute"])
def test_pin_holds_the_branch_although_a_newer_one_is_offered(host, name):
    # nvidia-open depends on ">=" versions, as NVIDIA's do: only the lock keeps the dependencies on R580.
    policy = host.check_output("apt-cache policy %s" % name)
    assert "Installed: 580.95.05-1" in policy
    assert "595.71.05-1" in policy, "the stand-in repository offers R595 too"
    assert "Candidate: 580.95.05-1" in policy
    assert host.package(name).version == "580.95.05-1"


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
    assert re.search(r"^nvidia/580\.95\.05, %s, x86_64: installed" % re.escape(image_kernel), status, re.M), status
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
    assert status["toolkit"] == "12.8" and status["branch"] == "580" and status["boot_kernel"] == image_kernel
    assert status["driver_version"] == "580.95.05"
    assert status["branch_warnings"] == []


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
    assert "branch 550 is outside NVIDIA's support table" in text
