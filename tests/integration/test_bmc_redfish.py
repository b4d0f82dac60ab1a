"""The bmc role against a real Redfish service: sushy-tools' sushy-emulator (fake systems driver, BIOS attributes
kept by tests/integration/bmc_emulator.py), on 127.0.0.1 with TLS and basic auth, loaded with the real attribute
names and values of an HPE ProLiant DL325 Gen11 (tests/fixtures/bmc/). Each test runs playbooks/baremetal.yml with
ansible-playbook, as an operator would.

sushy-tools is not one of the kit's requirements: the emulator runs from the interpreter named by
HMK_SUSHY_PYTHON (a venv with sushy-tools==2.2.0), or from this one when it has sushy_tools. Without either, every
test here is skipped with the reason printed; nothing is faked in its place.
"""
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import ssl
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "bmc"
LAUNCHER = Path(__file__).with_name("bmc_emulator.py")
USER, PASSWORD = "hmk-admin", "Redfish-test-pw-7"


def _sushy_python():
    named = os.environ.get("HMK_SUSHY_PYTHON")
    if named:
        return named
    if importlib.util.find_spec("sushy_tools") is not None:
        return sys.executable
    return None


SUSHY_PYTHON = _sushy_python()
REASON = ("SKIPPED LOUDLY: sushy-tools (sushy-emulator) is not installed: the bmc role's Redfish test needs it. "
          "Install sushy-tools==2.2.0 in the kit's venv (requirements.txt) or point HMK_SUSHY_PYTHON at an "
          "interpreter that has it.")
if SUSHY_PYTHON is None:
    print("\n" + REASON, file=sys.stderr)
pytestmark = pytest.mark.skipif(SUSHY_PYTHON is None, reason=REASON)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hpe_state():
    """The DL325 Gen11's attributes with NPS2 and SMT on (both wrong for the kit), and the iLO 6 registry's allowed
    values for the attributes the map writes, so the emulator refuses what iLO would refuse."""
    node = json.loads((FIXTURES / "hpe-proliant-dl325-gen11.json").read_text())["Attributes"]
    registry = json.loads((FIXTURES / "hpe-ilo6-170-bios-registry.json").read_text())["allowed_values"]
    attributes = {k: v for k, v in node.items() if isinstance(v, (str, int, bool))}
    attributes["NumaMemoryDomainsPerSocket"] = "TwoMemoryDomainsPerSocket"
    attributes["ProcSMT"] = "Enabled"
    return {"attributes": attributes, "allowed": registry}


@pytest.fixture
def bmc(tmp_path, request):
    """A running emulator: yields {address, dir, state}; stopped (by its own PID) after the test. A parametrized test
    may narrow the allowed values of attributes ({name: [values]}) to make the BMC refuse a write."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    digest = subprocess.run([SUSHY_PYTHON, "-c", "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), "
                             "bcrypt.gensalt(rounds=4)).decode())", PASSWORD],
                            check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "htpasswd").write_text("%s:%s\n" % (USER, digest))
    state = _hpe_state()
    state["allowed"].update(getattr(request, "param", {}))
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "emulator.conf").write_text(
        "SUSHY_EMULATOR_AUTH_FILE = %r\n"
        "SUSHY_EMULATOR_STATE_DIR = %r\n"
        "SUSHY_EMULATOR_FAKE_SYSTEMS = [{'uuid': '27946b59-9e44-4fa7-8e91-f3527a1ef094', 'name': 'epyc-node',"
        " 'power_state': 'On', 'nics': [{'mac': '00:5c:52:31:3a:9c', 'ip': '127.0.0.2'}]}]\n"
        % (str(tmp_path / "htpasswd"), str(tmp_path / "emulator-state")))
    port = _free_port()
    log = open(tmp_path / "emulator.log", "w")
    proc = subprocess.Popen([SUSHY_PYTHON, str(LAUNCHER), str(tmp_path / "state.json"), "--",
                             "--fake", "--config", str(tmp_path / "emulator.conf"), "-i", "127.0.0.1", "-p", str(port),
                             "--ssl-certificate", str(tmp_path / "cert.pem"), "--ssl-key", str(tmp_path / "key.pem")],
                            stdout=log, stderr=subprocess.STDOUT)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    deadline = time.time() + 30
    while True:
        try:
            urllib.request.urlopen("https://127.0.0.1:%d/redfish/v1/" % port, context=context, timeout=2)
            break
        except urllib.error.HTTPError:
            break  # 401: up, asking for credentials
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("sushy-emulator did not start: %s" % (tmp_path / "emulator.log").read_text()[-2000:])
            time.sleep(0.3)
    yield {"address": "127.0.0.1:%d" % port, "dir": tmp_path, "state": state}
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def run_play(bmc, *extra, user=USER, password=PASSWORD, address=None, check=False, node=None):
    """playbooks/baremetal.yml for one node whose BMC is the emulator; credentials travel in a vars file (mode 0600),
    the way a vault would give them, never on the command line. `node`: the node's connection (default: this machine,
    which answers)."""
    work = bmc["dir"]
    (work / "inventory.yml").write_text(json.dumps({"all": {"children": {"inference_nodes": {"hosts": {"epyc-node": (
        node or {"ansible_connection": "local", "ansible_python_interpreter": sys.executable})}}}}}))
    secrets = work / "secrets.json"
    secrets.write_text(json.dumps({"bmc_username": user, "bmc_password": password}))
    secrets.chmod(0o600)
    variables = {"bmc_address": address or bmc["address"], "bmc_validate_certs": False, "bmc_vendor": "hpe",
                 "bmc_report_dir": str(work / "reports"), "bmc_apply_poll_interval": 2, "bmc_apply_timeout": 120,
                 "bmc_timeout": 10}
    for item in extra:
        variables.update(item)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_LOCAL_TEMP=str(work / "tmp"))
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(work / "inventory.yml"),
           str(REPO / "playbooks" / "baremetal.yml"), "-e", "@" + str(secrets), "-e", json.dumps(variables)]
    if check:
        cmd.append("--check")
    r = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=600, check=False)
    report_path = work / "reports" / "epyc-node" / "bmc-bios.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return r, report


def _by_id(report):
    return dict((c["id"], c) for c in report["checks"])


def _applied_jobs(bmc):
    path = bmc["dir"] / "applied.log"
    return path.read_text().splitlines() if path.exists() else []


def test_report_flags_wrong_nps_and_smt_and_changes_nothing(bmc):
    r, report = run_play(bmc)
    assert r.returncode != 0, r.stdout
    assert "BIOS checks failed on epyc-node" in r.stdout
    checks = _by_id(report)
    assert checks["numa_nodes_per_socket"]["status"] == "fail"
    assert checks["numa_nodes_per_socket"]["observed"] == "2"
    assert checks["numa_nodes_per_socket"]["attributes"] == {"NumaMemoryDomainsPerSocket": "TwoMemoryDomainsPerSocket"}
    assert checks["smt_disabled"]["status"] == "fail"
    assert all(c["source"] == "bmc" for c in report["checks"])
    # iLO 6 has no Above 4G / Resizable BAR / ACS attribute: unknown, never guessed.
    assert checks["above_4g_decoding"]["observed"] == "unknown"
    assert report["planned"] == {
        "NumaMemoryDomainsPerSocket": {"before": "TwoMemoryDomainsPerSocket", "after": "OneMemoryDomainPerSocket"},
        "ProcSMT": {"before": "Enabled", "after": "Disabled"},
    }
    assert report["applied"] == {}
    assert _applied_jobs(bmc) == []


def test_check_mode_shows_the_exact_change_and_writes_nothing(bmc):
    r, report = run_play(bmc, {"bmc_bios_apply": True}, check=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "OneMemoryDomainPerSocket" in r.stdout and "Disabled" in r.stdout
    assert report["planned"]["NumaMemoryDomainsPerSocket"] == {"before": "TwoMemoryDomainsPerSocket",
                                                               "after": "OneMemoryDomainPerSocket"}
    assert report["planned"]["ProcSMT"] == {"before": "Enabled", "after": "Disabled"}
    _unused, again = run_play(bmc, {"bmc_fail_on_error": False})
    assert _by_id(again)["numa_nodes_per_socket"]["observed"] == "2"
    assert _applied_jobs(bmc) == []


def test_apply_power_cycles_once_rereads_and_a_second_run_changes_nothing(bmc):
    r, report = run_play(bmc, {"bmc_bios_apply": True})
    assert r.returncode == 0, r.stdout[-4000:]
    checks = _by_id(report)
    assert checks["numa_nodes_per_socket"]["status"] == "pass"
    assert checks["numa_nodes_per_socket"]["attributes"] == {"NumaMemoryDomainsPerSocket": "OneMemoryDomainPerSocket"}
    assert checks["smt_disabled"]["status"] == "pass"
    assert report["applied"]["ProcSMT"] == {"before": "Enabled", "after": "Disabled"}
    jobs = _applied_jobs(bmc)
    assert len(jobs) == 1, jobs  # one restart applied one settings job
    assert json.loads(jobs[0])["NumaMemoryDomainsPerSocket"] == "OneMemoryDomainPerSocket"

    r2, report2 = run_play(bmc, {"bmc_bios_apply": True})
    assert r2.returncode == 0, r2.stdout[-4000:]
    assert "changed=0" in r2.stdout
    assert report2["applied"] == {} and report2["planned"] == {}
    assert len(_applied_jobs(bmc)) == 1


@pytest.mark.parametrize("bmc", [{"ProcSMT": ["Enabled"]}], indirect=True)
def test_a_refused_attribute_is_reported_with_the_bmc_message_and_nothing_restarts(bmc):
    # this BMC's BIOS offers no SMT switch (a locked-down SKU): the PATCH is refused with a 400 and a message
    r, report = run_play(bmc, {"bmc_bios_apply": True})
    assert r.returncode != 0
    assert 'The BMC of epyc-node refused {"NumaMemoryDomainsPerSocket": "OneMemoryDomainPerSocket", "ProcSMT": ' \
           '"Disabled"}' in r.stdout, r.stdout[-3000:]
    # the BMC's own answer as the Redfish module passes it on: the status and the @Message.ExtendedInfo (sushy-tools
    # puts its text in error.message, which community.general does not read; iLO and iDRAC put it in ExtendedInfo)
    assert "HTTP Error 400 on PATCH request" in r.stdout and "Base.1.0.GeneralError" in r.stdout
    assert report is None
    assert _applied_jobs(bmc) == []


def test_wrong_credentials_stop_with_the_cause_and_change_nothing(bmc):
    r, report = run_play(bmc, {"bmc_bios_apply": True}, password="not-the-password")
    assert r.returncode != 0
    assert "refused the credentials" in r.stdout and "401" in r.stdout
    assert "not-the-password" not in r.stdout + r.stderr
    assert report is None
    assert _applied_jobs(bmc) == []


def test_an_unreachable_bmc_stops_with_the_cause(bmc):
    r, report = run_play(bmc, address="127.0.0.1:%d" % _free_port())
    assert r.returncode != 0
    assert "BMC is unreachable" in r.stdout
    assert report is None


def test_unknown_vendor_reports_every_check_unknown(bmc):
    r, report = run_play(bmc, {"bmc_vendor": "auto", "bmc_fail_on_error": False})
    assert r.returncode == 0, r.stdout[-3000:]
    assert report["vendor"] == "unknown" and "Sushy Emulator" in report["vendor_name"]
    assert {c["observed"] for c in report["checks"]} == {"unknown"}
    assert report["planned"] == {}


# ---- Installing the OS through virtual media (bmc_os_install) ----
UUID = "27946b59-9e44-4fa7-8e91-f3527a1ef094"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH1mkEmB1pV9OY8Kp0m3G3x3oZ6yVw4yq0WmC8dYFQ0r hmk-kit@control"
HASH = "$6$hmktestsalt$Zq0u3kQ5y7Wm9P1Q2rS3tU4vW5xY6zA7bC8dE9fG0hI1jK2lM3nO4pQ5rS6tU7vW8xY9zA0bC1dE2fG3hI4jK5"


@pytest.fixture
def mirror(tmp_path):
    """The operator's mirror: a local http.server on 127.0.0.1 serving the installer ISO (a stand-in file: the
    emulator downloads what it inserts, and nothing boots it) and the published seeds."""
    import hashlib
    import functools
    import http.server
    import threading
    root = tmp_path / "www"
    (root / "debian").mkdir(parents=True)
    image = root / "debian" / "debian-12.8.0-amd64-netinst.iso"
    image.write_bytes(b"hmk stand-in installer image\n" * 1000)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = "http://127.0.0.1:%d" % server.server_address[1]
    yield {"root": root, "url": base + "/debian/" + image.name, "base": base,
           "checksum": "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()}
    server.shutdown()
    server.server_close()


def _install_vars(bmc, mirror, **more):
    key = bmc["dir"] / "id_ed25519.pub"
    key.write_text(KEY + "\n")
    variables = {"bmc_os_install": True, "bmc_os_install_remaster": False, "bmc_fail_on_error": False,
                 "bmc_os_install_image_url": mirror["url"], "bmc_os_install_image_checksum": mirror["checksum"],
                 "bmc_os_install_publish_dir": str(mirror["root"] / "seeds"),
                 "bmc_os_install_publish_url": mirror["base"] + "/seeds",
                 "bmc_os_install_cache_dir": str(bmc["dir"] / "cache"),
                 "bmc_os_install_ssh_public_key_file": str(key), "bmc_os_install_timeout": 5,
                 "bmc_os_install_probe_timeout": 2}
    variables.update(more)
    return variables


def _silent_node():
    """A node without an OS: nothing answers SSH at its address."""
    return {"ansible_host": "127.0.0.1", "ansible_port": _free_port(), "ansible_user": "hmk",
            "ansible_python_interpreter": sys.executable}


def _requests(bmc):
    path = bmc["dir"] / "requests.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _redfish_get(bmc, path):
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request("https://%s%s" % (bmc["address"], path))
    import base64
    request.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode())
    return json.loads(urllib.request.urlopen(request, context=context, timeout=10).read())


def test_install_inserts_the_image_boots_cd_once_restarts_and_times_out_clearly_without_ssh(bmc, mirror):
    node = _silent_node()
    r, _report = run_play(bmc, _install_vars(bmc, mirror, bmc_os_install_admin_password_hash=HASH), node=node)
    out = r.stdout + r.stderr
    assert r.returncode != 0, r.stdout[-3000:]
    assert ("epyc-node did not open SSH on 127.0.0.1:%d within 5 s (bmc_os_install_timeout)" % node["ansible_port"]
            in out), r.stdout[-3000:]
    medium = _redfish_get(bmc, "/redfish/v1/Systems/%s/VirtualMedia/Cd" % UUID)
    assert medium["Image"] == mirror["url"] and medium["Inserted"] is True
    sent = _requests(bmc)
    boots = [q["body"]["Boot"] for q in sent if q["method"] == "PATCH" and q["path"].endswith("/Systems/" + UUID)]
    assert boots == [{"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Cd",
                      "BootSourceOverrideMode": "UEFI"}]
    resets = [q["body"]["ResetType"] for q in sent if q["path"].endswith("ComputerSystem.Reset")]
    assert resets == ["ForceRestart"]
    inserts = [q for q in sent if q["path"].endswith("VirtualMedia.InsertMedia")]
    assert [q["body"]["Image"] for q in inserts] == [mirror["url"]]
    # the order a BMC needs: medium, then boot override, then the restart
    order = [q["path"].rsplit("/", 1)[-1] for q in sent]
    assert order.index("VirtualMedia.InsertMedia") < order.index(UUID) < order.index("ComputerSystem.Reset")
    seed = (mirror["root"] / "seeds" / "epyc-node" / "preseed.cfg").read_text()
    assert KEY in seed and "preseed/late_command" in seed
    # the password hash is in the seed (the installer needs it) but in no output; the BMC password nowhere
    assert HASH not in out and PASSWORD not in out


def test_a_port_that_accepts_without_an_ssh_server_behind_it_is_not_taken_for_the_installed_node(bmc, mirror):
    """A NAT, a port forward or a load balancer accepts a connection before any sshd runs behind it (QEMU's
    user-mode port forward does, molecule/bmc_os_install found): the role waits for the SSH banner, not the port."""
    import socket
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def accept_and_close():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _peer = listener.accept()
                connection.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_close, daemon=True)
    thread.start()
    node = dict(_silent_node(), ansible_port=listener.getsockname()[1])
    try:
        r, _report = run_play(bmc, _install_vars(bmc, mirror), node=node)
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert r.returncode != 0
    assert ("epyc-node did not open SSH on 127.0.0.1:%d within 5 s (bmc_os_install_timeout)" % node["ansible_port"]
            in r.stdout), r.stdout[-3000:]


def test_an_installed_node_that_answers_as_itself_is_refused_and_nothing_changes(bmc, mirror):
    uuid_file = bmc["dir"] / "product_uuid"
    uuid_file.write_text(UUID.upper() + "\n")  # the kernel's view of SMBIOS on the node: the BMC's system
    r, _report = run_play(bmc, _install_vars(bmc, mirror), {"__bmc_os_uuid_path": str(uuid_file)})
    assert r.returncode != 0
    assert ("Refused to reinstall epyc-node: it already answers over SSH as this node (system UUID %s, the same as "
            "its BMC's). Nothing was changed." % UUID) in r.stdout, r.stdout[-3000:]
    assert "bmc_os_reinstall_confirm=epyc-node" in r.stdout
    assert _requests(bmc) == []
    assert not (mirror["root"] / "seeds").exists()
    assert _redfish_get(bmc, "/redfish/v1/Systems/%s/VirtualMedia/Cd" % UUID)["Inserted"] is False


def test_a_machine_with_another_uuid_at_the_node_address_is_refused_naming_the_mismatch(bmc, mirror):
    uuid_file = bmc["dir"] / "product_uuid"
    uuid_file.write_text("0b1c5c3e-0000-4000-8000-00000000beef\n")
    r, _report = run_play(bmc, _install_vars(bmc, mirror, bmc_os_reinstall_confirm="other-node"),
                          {"__bmc_os_uuid_path": str(uuid_file)})
    assert r.returncode != 0
    assert "another machine answers over SSH" in r.stdout and "check the inventory" in r.stdout, r.stdout[-3000:]
    assert _requests(bmc) == []


def test_install_check_mode_shows_the_plan_and_sends_nothing(bmc, mirror):
    r, _report = run_play(bmc, _install_vars(bmc, mirror), node=_silent_node(), check=True)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "virtual CD of epyc-node: %s" % mirror["url"] in r.stdout
    assert "then PowerForceRestart; the disk is wiped" in r.stdout
    assert _requests(bmc) == []
    assert _redfish_get(bmc, "/redfish/v1/Systems/%s/VirtualMedia/Cd" % UUID)["Inserted"] is False
