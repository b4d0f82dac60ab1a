"""The end state after the replay and the drills: the node serves its recorded configuration, nothing is left half
written, and the twin runs without debugfs and with read-only release_agent files."""
import json

UNIT = "hmk-inference.service"
MARK = "hybrid-moe-kit service account"


def test_the_service_serves_and_starts_at_boot(host):
    svc = host.service(UNIT)
    assert svc.is_running and svc.is_enabled
    assert host.run("curl -fsS http://127.0.0.1:18551/health").rc == 0


def test_the_running_engine_is_the_recorded_one(host):
    pid = host.check_output("systemctl show -p MainPID --value %s" % UNIT)
    running = host.file("/proc/%s/cmdline" % pid).content.split(b"\0")[:-1]
    args = host.file("/etc/hmk/hmk-inference.args").content.split(b"\n")[:-1]
    assert running == args + [b"--api-key-file", b"/run/hmk-inference/api-key"]
    deployment = json.loads(host.file("/var/lib/hmk/inference/deployment.json").content_string)
    assert [a.encode() for a in deployment["argv"]] == args
    assert b"--no-slots" in running


def test_the_last_good_configuration_is_the_one_in_service(host):
    for name, path in (("unit", "/etc/systemd/system/hmk-inference.service"), ("args", "/etc/hmk/hmk-inference.args"),
                       ("api-key", "/etc/hmk/hmk-inference.api-key")):
        kept = host.file("/etc/hmk/hmk-inference.last-good/" + name)
        assert kept.mode == 0o600 and kept.user == "root"
        assert kept.content == host.file(path).content


def test_the_unit_checks_the_model_first_and_filters_addresses(host):
    unit = host.file("/etc/systemd/system/hmk-inference.service").content_string
    assert "--model-check /etc/hmk/hmk-inference.model.json" in unit
    assert "RestartPreventExitStatus=78" in unit
    assert "IPAddressDeny=any" in unit and "IPAddressAllow=localhost" in unit


def test_the_service_account_is_the_kits_and_the_login_account_untouched(host):
    moe = host.check_output("getent passwd moe").split(":")
    assert moe[4] == MARK and moe[6] == "/usr/sbin/nologin"
    drill = host.check_output("getent passwd hmkdrill").split(":")
    assert drill[5:] == ["/home/hmkdrill", "/bin/bash"]


def test_no_partial_download_outside_staging_and_the_rehash_timer_is_active(host):
    assert host.check_output("find /srv/models -name '*.partial' -not -path '/srv/models/.staging/*' | wc -l") == "0"
    assert host.service("hmk-model-rehash.timer").is_running
    record = json.loads(host.file("/var/lib/hmk/model-integrity.json").content_string)
    assert record["ok"] and record["files_checked"] >= 2


def test_the_twin_has_no_debugfs_and_read_only_release_agents(host):
    mounts = [line.split() for line in host.file("/proc/self/mounts").content_string.splitlines()]
    assert not [m for m in mounts if m[2] in ("debugfs", "tracefs")]
    hierarchies = [m[1] for m in mounts if m[2] == "cgroup" and not m[1].endswith("/release_agent")]
    for hierarchy in hierarchies:
        agent = hierarchy + "/release_agent"
        if host.file(agent).exists:
            assert host.run("sh -c 'echo /bin/true > %s'" % agent).rc != 0, agent
