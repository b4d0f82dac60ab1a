"""site.yml rebooted the VM twin exactly once, into the tuned kernel, and the second run did not reboot it."""
import glob
import os

import pytest

WANTED_ARGS = ["pcie_aspm.policy=performance", "numa_balancing=disable"]
SCRATCH = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "")


def runs():
    paths = sorted(glob.glob(os.path.join(SCRATCH, "site-run-*.log")))
    assert len(paths) == 2, paths  # converge and idempotence
    out = []
    for path in paths:
        with open(path) as handle:
            out.append(handle.read())
    return out


def test_the_node_booted_anew_once(host):
    first = host.file("/var/tmp/site-boot-0").content_string.strip()
    now = host.file("/proc/sys/kernel/random/boot_id").content_string.strip()
    assert first != now
    converge, again = runs()
    assert "TASK [The node reboots once for everything pending]" in converge
    assert "changed: [site-reboot]" in converge.split("TASK [The node reboots once for everything pending]")[1] \
        .split("TASK [")[0]
    assert "skipping: [site-reboot]" in again.split("TASK [The node reboots once for everything pending]")[1] \
        .split("TASK [")[0]


@pytest.mark.parametrize("arg", WANTED_ARGS)
def test_the_running_kernel_has_each_argument(host, arg):
    assert host.file("/proc/cmdline").content_string.split().count(arg) == 1


def test_the_kernel_stage_did_not_reboot_on_its_own():
    converge, _unused = runs()
    # The role's tasks print as "TASK [hmk.moe_kit.kernel_tuning : ...]" from the collection.
    section = converge.split("kernel_tuning : The node has rebooted once into the requested kernel arguments")[1]
    assert section.split("TASK [")[0].strip().splitlines()[-1].startswith("skipping: [site-reboot]")


def test_the_second_run_changed_nothing():
    _unused, again = runs()
    recap = [line for line in again.splitlines() if line.startswith("site-reboot ")][-1]
    assert "changed=0 " in recap and "failed=0 " in recap
