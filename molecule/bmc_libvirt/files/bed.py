"""The bmc_libvirt scenario's BMC: a private libvirt session daemon, one QEMU domain under it, and sushy-tools'
Redfish emulator (its libvirt driver) in front, all on 127.0.0.1 and all under one directory.

    python bed.py up DIR FIXTURE      (create.yml)   python bed.py down DIR   (destroy.yml)

Run with the interpreter that has sushy-tools and the libvirt binding (the kit's venv; HMK_SUSHY_PYTHON names
another). Why it is built this way:
- libvirt runs as a session daemon (libvirtd in unprivileged mode) of the user `nobody`: as root, libvirtd is the
  system daemon, with its config, state and networks under /etc and /var. A session daemon keeps its config, state,
  logs and socket under the XDG_* directories given to it, all inside DIR, has no default network and cannot create
  bridges or firewall rules. Root (Molecule, the emulator, the verify) connects to its socket by path.
- The domain is TCG (type qemu: no /dev/kvm needed), 128 MiB, 1 vCPU, no disk, no NIC: SeaBIOS finds nothing to
  boot and waits, which costs about 2 % of a core. Its BIOS attributes are the ones sushy-tools' libvirt driver
  reads from the domain's <metadata> (namespace below): the HPE ProLiant DL325 Gen11's real attributes with
  NPS2 and SMT on, both wrong for the kit.
- The Redfish service is sushy-tools' own application, unchanged, started by emulator.py (only a request log added)
  with TLS and basic auth (a bcrypt htpasswd); the password is random per run and lives only in DIR (mode 0600).
Every process started here is recorded by PID in DIR/bed.json; `down` ends those and no others.
"""
import base64
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from xml.sax.saxutils import quoteattr

HERE = Path(__file__).resolve().parent
DOMAIN = "bmc-node"  # also the Molecule platform (the Ansible host)
UUID = "27946b59-9e44-4fa7-8e91-f3527a1ef094"
USER = "hmk-admin"
SUSHY_NS = "http://openstack.org/xmlns/libvirt/sushy"
DAEMON_USER = "nobody"


def paths(work):
    home = work / "libvirt"
    return {
        "home": home,
        "socket": home / "runtime" / "libvirt" / "libvirt-sock",
        "qemu_log": home / "cache" / "libvirt" / "qemu" / "log" / (DOMAIN + ".log"),
        "qemu_pid": home / "runtime" / "libvirt" / "qemu" / "run" / (DOMAIN + ".pid"),
    }


def uri(work):
    return "qemu:///session?socket=%s" % paths(work)["socket"]


def client_env(work):
    """libvirt's clients (virsh, the emulator) keep what they write in DIR/client, not in root's home."""
    client = work / "client"
    return dict(os.environ, XDG_CONFIG_HOME=str(client / "config"), XDG_CACHE_HOME=str(client / "cache"),
                XDG_RUNTIME_DIR=str(client / "runtime"))


def virsh(work, *args, check=True):
    return subprocess.run(["virsh", "-q", "-c", uri(work)] + list(args), check=check, capture_output=True, text=True,
                          env=client_env(work))


def wait_for(what, probe, timeout, log=None):
    deadline = time.time() + timeout
    while not probe():
        if time.time() > deadline:
            tail = Path(log).read_text()[-2000:] if log and Path(log).exists() else ""
            sys.exit("%s did not come up within %d s. %s" % (what, timeout, tail))
        time.sleep(0.2)


def bios_attributes(fixture):
    """The DL325 Gen11's attributes, as the fixture holds them, with NPS2 and SMT on."""
    attributes = json.loads(Path(fixture).read_text())["Attributes"]
    attributes = {k: v for k, v in attributes.items() if isinstance(v, (str, int, bool))}
    attributes["NumaMemoryDomainsPerSocket"] = "TwoMemoryDomainsPerSocket"
    attributes["ProcSMT"] = "Enabled"
    return attributes


def domain_xml(attributes):
    rows = "\n".join("        <sushy:attribute name=%s value=%s/>" % (quoteattr(k), quoteattr(str(v)))
                     for k, v in sorted(attributes.items()))
    return """<domain type='qemu'>
  <name>%s</name>
  <uuid>%s</uuid>
  <metadata>
    <sushy:bios xmlns:sushy='%s'>
      <sushy:attributes>
%s
      </sushy:attributes>
    </sushy:bios>
  </metadata>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <memballoon model='none'/>
  </devices>
</domain>
""" % (DOMAIN, UUID, SUSHY_NS, rows)


def host_network():
    """The host's links and firewall rules, as create found them: the verify compares them after the runs."""
    state = {"links": sorted(n.name for n in Path("/sys/class/net").iterdir())}
    for name, argv in (("iptables", ["iptables-save"]), ("ip6tables", ["ip6tables-save"]),
                       ("nft", ["nft", "list", "ruleset"])):
        if shutil.which(argv[0]):
            out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
            state[name] = [line for line in out.splitlines() if not line.startswith("#")]  # no timestamps
    return state


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_libvirtd(work, state):
    p = paths(work)
    account = pwd.getpwnam(DAEMON_USER)
    for sub in ("config", "cache", "runtime"):
        (p["home"] / sub).mkdir(parents=True, exist_ok=True)
    for path in [p["home"]] + [p["home"] / sub for sub in ("config", "cache", "runtime")]:
        os.chown(path, account.pw_uid, account.pw_gid)
        path.chmod(0o700)
    # nobody must reach DIR: it lies under $HMK_STATE, whose directories are traversable (Molecule's ephemeral
    # directory, under /root/.cache, is not).
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(p["home"]), "LC_ALL": "C",
           "XDG_CONFIG_HOME": str(p["home"] / "config"), "XDG_CACHE_HOME": str(p["home"] / "cache"),
           "XDG_RUNTIME_DIR": str(p["home"] / "runtime")}
    log = open(work / "libvirtd.log", "w")
    proc = subprocess.Popen(["setpriv", "--reuid", str(account.pw_uid), "--regid", str(account.pw_gid),
                             "--clear-groups", "/usr/sbin/libvirtd"],
                            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=str(p["home"]))
    state["libvirtd_pid"] = proc.pid  # setpriv execs libvirtd: the same PID
    save(work, state)
    wait_for("libvirtd", lambda: p["socket"].exists() and virsh(work, "uri", check=False).returncode == 0, 30,
             work / "libvirtd.log")


def save(work, state):
    (work / "bed.json").write_text(json.dumps(state, indent=2) + "\n")


def start_emulator(work, python, port, state, emulator=HERE / "emulator.py", uuid=UUID):
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    key.chmod(0o600)
    import bcrypt  # the emulator's interpreter runs this script and has it (sushy-tools' auth needs it)
    password = secrets.token_urlsafe(18)
    htpasswd = work / "htpasswd"
    htpasswd.write_text("%s:%s\n" % (USER, bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()))
    credentials = work / "credentials.json"
    credentials.touch(mode=0o600)
    credentials.write_text(json.dumps({"bmc_username": USER, "bmc_password": password}))
    (work / "emulator.conf").write_text(
        "SUSHY_EMULATOR_AUTH_FILE = %r\nSUSHY_EMULATOR_LIBVIRT_URI = %r\n"
        # Its virtual media and other state in DIR: by default sushy-tools keeps them in /tmp across restarts, where
        # an earlier bed's inserted CD would still count as inserted.
        "SUSHY_EMULATOR_STATE_DIR = %r\n" % (str(htpasswd), uri(work), str(work / "emulator-state")))
    log = open(work / "emulator.log", "w")
    proc = subprocess.Popen([python, str(emulator), str(work / "requests.log"), "--",
                             "--config", str(work / "emulator.conf"), "-i", "127.0.0.1", "-p", str(port),
                             "--ssl-certificate", str(cert), "--ssl-key", str(key)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=client_env(work))
    state["emulator_pid"] = proc.pid  # recorded before the wait: destroy ends it even when it never answers
    save(work, state)
    context = ssl.create_default_context(cafile=str(cert))
    context.check_hostname = False

    def answers():
        if proc.poll() is not None:
            sys.exit("sushy-emulator ended: %s" % (work / "emulator.log").read_text()[-2000:])
        request = urllib.request.Request("https://127.0.0.1:%d/redfish/v1/Systems/%s" % (port, uuid))
        request.add_header("Authorization", "Basic " + base64.b64encode(
            ("%s:%s" % (USER, password)).encode()).decode())
        try:
            return urllib.request.urlopen(request, context=context, timeout=2).status == 200
        except (OSError, urllib.error.HTTPError):
            return False

    wait_for("sushy-emulator", answers, 60, work / "emulator.log")


def new_bed(work, uuid):
    """DIR made afresh (refused while a bed is up in it), the host's network as found, and the bed's first state."""
    if (work / "bed.json").exists():
        sys.exit("%s/bed.json exists: a bed is still up (bed.py down %s first)" % (work, work))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, mode=0o711)
    (work / "network-before.json").write_text(json.dumps(host_network(), indent=2) + "\n")
    return {"dir": str(work), "uri": uri(work), "domain": DOMAIN, "uuid": uuid}


def up(work, fixture):
    state = new_bed(work, UUID)
    start_libvirtd(work, state)
    (work / "domain.xml").write_text(domain_xml(bios_attributes(fixture)))
    virsh(work, "define", str(work / "domain.xml"))
    virsh(work, "start", DOMAIN)  # the node is powered on, as a server in its rack is
    state["qemu_pid_at_create"] = int(paths(work)["qemu_pid"].read_text())
    port = free_port()
    state["address"] = "127.0.0.1:%d" % port
    start_emulator(work, sys.executable, port, state)
    save(work, state)
    print(json.dumps(state))


def ours(pid, name):
    """The PID still runs the program this bed started (not a reused PID)."""
    try:
        return name in Path("/proc/%d/cmdline" % pid).read_bytes().decode(errors="replace")
    except OSError:
        return False


def stop(pid, name, timeout=15):
    if not pid or not ours(pid, name):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout
    while ours(pid, name) and time.time() < deadline:
        time.sleep(0.2)
    if ours(pid, name):
        os.kill(pid, signal.SIGKILL)


def down(work):
    state_file = work / "bed.json"
    if not state_file.exists():
        print("nothing to stop: %s not found" % state_file)
        return
    state = json.loads(state_file.read_text())
    stop(state.get("emulator_pid"), "emulator.py")
    if paths(work)["socket"].exists() and ours(state["libvirtd_pid"], "libvirtd"):
        virsh(work, "destroy", DOMAIN, check=False)
        virsh(work, "undefine", DOMAIN, check=False)
    stop(state["libvirtd_pid"], "libvirtd")
    # The domain's QEMU was libvirtd's child: gone with `destroy`; ended here only if it is still that domain's.
    qemu_pid = paths(work)["qemu_pid"]
    if qemu_pid.exists():
        stop(int(qemu_pid.read_text()), "guest=" + DOMAIN)
    # The session daemon started virtlogd for the domain's QEMU log (it keeps one log across restarts, which the
    # verify reads; libvirtd's own file handler starts it anew at each start): it would idle 2 minutes past destroy.
    virtlogd_pid = paths(work)["home"] / "runtime" / "libvirt" / "virtlogd.pid"
    if virtlogd_pid.exists():
        stop(int(virtlogd_pid.read_text()), "virtlogd")
    state_file.unlink()
    # The daemon's and the domain's files and the credentials go; the logs and the reports stay for a post-mortem.
    shutil.rmtree(paths(work)["home"], ignore_errors=True)
    for name in ("credentials.json", "htpasswd", "key.pem"):
        (work / name).unlink(missing_ok=True)
    print("stopped: emulator %s, domain %s, libvirtd %s" % (state.get("emulator_pid"), DOMAIN, state["libvirtd_pid"]))


if __name__ == "__main__":
    if sys.argv[1] == "network":
        print(json.dumps(host_network()))
    elif sys.argv[1] == "up":
        up(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "down":
        down(Path(sys.argv[2]))
    else:
        sys.exit("usage: bed.py up DIR FIXTURE | down DIR")
