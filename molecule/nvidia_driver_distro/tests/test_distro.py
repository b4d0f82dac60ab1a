"""Debian 12's non-free NVIDIA driver installed by the nvidia_driver role in the container twin:
what an operator would check on the node after the play. Debian 12's branch (535) is past NVIDIA's
end of life: the side effect's refused run and the kept branch's warning are checked too."""
import json
import re

import pytest

DRIVER_PACKAGES = ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "nvidia-persistenced", "firmware-nvidia-gsp"]


@pytest.fixture(scope="module")
def image_kernel(host):
    """The kernel release of the image's installed linux-image package (what would boot)."""
    lines = host.check_output("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' 'linux-image-[0-9]*'").splitlines()
    releases = [line.split()[1][len("linux-image-"):] for line in lines if line.startswith("ii")]
    assert len(releases) == 1, releases
    return releases[0]


def test_image_kernel_is_not_the_running_host_kernel(host, image_kernel):
    # The container reports the host's kernel; the module must be for the image's one.
    assert host.check_output("uname -r") != image_kernel
    assert host.file("/lib/modules/%s" % image_kernel).is_directory


def test_dkms_shows_nvidia_installed_for_the_image_kernel(host, image_kernel):
    out = host.check_output("dkms status -k %s" % image_kernel)
    assert re.search(r"^nvidia-current/535\.[0-9.]+, %s, x86_64: installed" % re.escape(image_kernel), out, re.M), out


def test_module_file_exists_under_updates_dkms(host, image_kernel):
    ko = "/lib/modules/%s/updates/dkms/nvidia-current.ko" % image_kernel
    assert host.file(ko).is_file
    info = host.check_output("modinfo -F vermagic %s" % ko)
    assert info.split()[0] == image_kernel


def test_headers_for_the_image_kernel_are_installed(host, image_kernel):
    assert host.package("linux-headers-%s" % image_kernel).is_installed


def test_driver_packages_come_from_debian_non_free(host):
    for name in DRIVER_PACKAGES:
        assert host.package(name).is_installed, name
    assert host.package("nvidia-driver").version.startswith("535.")


def test_nouveau_blacklist_file(host):
    content = host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string
    assert re.search(r"^blacklist nouveau$", content, re.M)
    assert re.search(r"^options nouveau modeset=0$", content, re.M)


def test_nouveau_blacklist_is_in_the_image_kernels_initramfs(host, image_kernel):
    listing = host.check_output("lsinitramfs /boot/initrd.img-%s" % image_kernel).splitlines()
    assert "etc/modprobe.d/blacklist-nouveau.conf" in listing


def test_driver_packages_are_held(host):
    held = host.check_output("apt-mark showhold").split()
    for name in DRIVER_PACKAGES:
        assert name in held, (name, held)
    # Library packages of the branch are held too, not only the ones named.
    assert "libnvidia-ml1" in held


def test_branch_pin_is_in_effect(host):
    policy = host.check_output("apt-cache policy nvidia-kernel-dkms")
    assert re.search(r"\*\*\* 535\.[0-9.]+-\S+ 1000", policy), policy


def test_unattended_upgrades_blacklist_drop_in(host):
    drop_in = host.file("/etc/apt/apt.conf.d/51hmk-nvidia-blacklist")
    assert drop_in.mode == 0o644
    assert "Unattended-Upgrade::Package-Blacklist {" in drop_in.content_string
    # apt itself parses the drop-in into the list unattended-upgrades reads.
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    for pattern in ("nvidia-", "libnvidia-", "cuda-"):
        assert 'Unattended-Upgrade::Package-Blacklist:: "%s";' % pattern in dump, dump


def test_distribution_sources_file_untouched_and_non_free_added(host):
    assert host.file("/etc/apt/sources.list").content_string == host.file("/var/tmp/sources.list.before-role").content_string
    added = host.file("/etc/apt/sources.list.d/hmk-nvidia-distribution.sources").content_string
    assert "Components: contrib non-free non-free-firmware" in added
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in added


def test_persistence_daemon_enabled(host):
    assert host.service("nvidia-persistenced").is_enabled


def test_power_limit_unit_enabled_for_boot_but_not_run_without_gpu(host):
    unit = host.file("/etc/systemd/system/hmk-nvidia-power-limit.service").content_string
    assert "ExecStart=/usr/bin/nvidia-smi --power-limit=380" in unit
    assert "After=nvidia-persistenced.service" in unit
    assert host.service("hmk-nvidia-power-limit").is_enabled
    assert not host.service("hmk-nvidia-power-limit").is_running


def test_role_reported_no_gpu_plainly(host, image_kernel):
    status = json.loads(host.file("/var/lib/hybrid-moe-kit/nvidia_driver.json").content_string)
    assert status["gpus_expected"] == 0
    assert status["gpus_present"] is False
    assert status["gpu_checks"] == "skipped: no GPU on this node"
    assert status["boot_kernel"] == image_kernel
    assert status["dkms"] and status["dkms"][0].startswith("nvidia-current/535.")


def test_the_end_of_life_branch_was_refused_without_the_override(host):
    text = host.file("/var/tmp/hmk-side-effect-eol-branch.txt").content_string
    assert "branch 535 is outside NVIDIA's support table: it reached its end of life in June 2026" in text
    assert "R580 (long-term support branch, end of life June 2028)" in text and "R620" in text
    assert "Debian 12's own driver is branch 535" in text and "nvidia_driver_source: nvidia" in text


def test_the_kept_end_of_life_branch_is_recorded_with_its_date(host):
    status = json.loads(host.file("/var/lib/hybrid-moe-kit/nvidia_driver.json").content_string)
    assert status["branch"] == "535"
    assert len(status["branch_warnings"]) == 1, status["branch_warnings"]
    warning = status["branch_warnings"][0]
    assert "end of life in June 2026" in warning and "kept because nvidia_driver_allow_unsupported_branch is true" in warning
