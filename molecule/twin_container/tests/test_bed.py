"""What the container bed promises: systemd is PID 1 and runs units; the container shares the
host's network without opening sshd on the host's port 22 and without a docker bridge."""


def test_systemd_is_pid1(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"


def test_unit_ran_under_systemd(host):
    assert host.service("twin-bed.service").is_running or host.file("/run/twin-bed").exists
    assert host.file("/run/twin-bed").content_string.strip() == "twin-bed-ok"


def test_boot_failed_units_are_none(host):
    failed = host.check_output("systemctl --failed --no-legend --plain")
    assert failed.strip() == ""


def test_sshd_not_started_without_twin_config(host):
    assert not host.service("ssh").is_running


def test_no_docker_bridge(host):
    links = host.check_output("ip -o link show")
    assert "docker0" not in links
