"""Node doors (inference_service_door) and the gateway in front of them, as real HAProxy processes on 127.0.0.1.

tests/integration/door_play.yml runs the roles' own certificate tasks (the door CA and each node's two certificates,
made on this machine as on a control machine) and renders the roles' own templates: two doors, each in front of a
stand-in engine that records what reaches it, and the gateway balancing over both doors with a client certificate per
node. Only the process lines a test cannot keep (chroot, user, group, daemon, syslog) are dropped, as in
tests/unit/test_gateway_haproxy.py. Every process started here is ended by its PID.

What is shown: a client's request through the gateway reaches each node over TLS and the engine sees that node's own
key, never the client's; node A's client certificate does not open node B's door, nor does a certificate with the
right name from another CA; a plain-HTTP or certificate-less connection gets no answer; a path outside the allow-list
is refused at the door; a re-run issues nothing again, and a certificate within the renewal window is issued again;
an engine killed behind its door costs no request through the gateway and its node leaves rotation at once.
"""
import csv
import hashlib
import http.client
import http.server
import io
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from door_engine import engine_class  # the stand-in engine, in-process here and as its own process

REPO = Path(__file__).resolve().parents[2]
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CLIENT_KEY = "door-test-client-key-0123456789abcdef"
NODE_KEYS = {"node-a": "door-test-key-of-node-a-0123456789", "node-b": "door-test-key-of-node-b-9876543210"}
PROCESS_ONLY = ("chroot ", "user ", "group ", "daemon", "log /dev/log")

pytestmark = [
    pytest.mark.skipif(not os.access(HAPROXY, os.X_OK), reason="haproxy is not installed (Makefile DEB_PACKAGES)"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is needed for a foreign CA"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_play(work, variables, *args, ok=True, inventory=None):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(work / "tmp"), ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_CALLBACKS_ENABLED="ansible.posix.timer",
               ANSIBLE_CACHE_PLUGIN="memory")
    extra = work / "extra.json"
    extra.write_text(json.dumps(variables))
    extra.chmod(0o600)
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory or work / "inventory.json"),
           str(REPO / "tests" / "integration" / "door_play.yml"), "-e", "@" + str(extra), *args]
    r = subprocess.run(cmd, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=600, check=False)
    assert (r.returncode == 0) == ok, r.stdout[-6000:] + r.stderr[-3000:]
    return r


def process_config(path):
    text = path.read_text()
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(PROCESS_ONLY)) + "\n"


def start_haproxy(cfg, port, procs):
    check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs.append(proc)
    deadline = time.time() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "haproxy did not listen on %d" % port
            time.sleep(0.1)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("door")
    (work / "tmp").mkdir()
    ca_dir, gw_dir = work / "ca", work / "gw"
    gw_dir.mkdir(mode=0o700)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    nodes, engines, seen = {}, {}, {}
    for name in NODE_KEYS:
        seen[name] = []
        engines[name] = http.server.ThreadingHTTPServer(("127.0.0.1", 0), engine_class(seen[name]))
        threading.Thread(target=engines[name].serve_forever, daemon=True).start()
        nodes[name] = dict(local, inference_service_door=True, inference_service_host="127.0.0.1",
                           inference_service_port=free_port(),
                           inference_service_door_engine_port=engines[name].server_address[1],
                           inference_service_api_key=NODE_KEYS[name],
                           inference_service_door_config_dir=str(work / name),
                           # Prometheus may read node-a's /metrics through its door; node-b lets the gateway only.
                           inference_service_door_monitoring=(name == "node-a"))
    gw_port, stats_port = free_port(), free_port()
    (work / "inventory.json").write_text(json.dumps({"all": {"children": {
        "door_nodes": {"hosts": nodes}, "gateways": {"hosts": {"gw": local}}}}}))
    variables = {
        "hmk_test_repo": str(REPO), "hmk_door_ca_dir": str(ca_dir), "ansible_managed": "Ansible managed",
        "gateway_backend_group": "door_nodes", "gateway_nodes_share_loopback": True, "gateway_tls_self_signed": True,
        "gateway_clients": [{"name": "unit", "key": CLIENT_KEY}], "gateway_config_dir": str(gw_dir),
        "gateway_bind_address": "127.0.0.1", "gateway_port": gw_port, "gateway_stats_bind": "127.0.0.1:%d" % stats_port,
        "gateway_admin_socket": str(gw_dir / "admin.sock"), "__gateway_state_file": str(gw_dir / "state"),
        "gateway_health_interval": 1, "gateway_health_rise": 1, "gateway_min_nodes_up": 2,
    }
    first = run_play(work, variables)
    procs = []
    try:
        doors = {}
        for name, node in nodes.items():
            ddir = work / name
            shutil.copy(ca_dir / "ca.pem", ddir / "ca.pem")
            shutil.copy(ca_dir / name / "door.pem", ddir / "door.pem")
            shutil.copy(ca_dir / name / "door.key", ddir / "door.pem.key")
            (ddir / "engine-key.map").write_text("hmk_engine %s\n" % NODE_KEYS[name])
            cfg = ddir / "run.cfg"
            cfg.write_text(process_config(ddir / "haproxy.cfg"))
            start_haproxy(cfg, node["inference_service_port"], procs)
            doors[name] = node["inference_service_port"]
        # The gateway's own certificate for its clients (the role's tls.yml makes one the same way for a lab).
        (gw_dir / "tls").mkdir(mode=0o700)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", str(gw_dir / "tls" / "gateway.pem.key"),
                        "-out", str(gw_dir / "tls" / "gateway.pem")], check=True, capture_output=True)
        (gw_dir / "clients.map").write_text("%s unit\n" % hashlib.sha256(CLIENT_KEY.encode()).hexdigest())
        for empty in ("limits.map", "concurrency.map", "backend-key.map"):
            (gw_dir / empty).write_text("")
        cfg = gw_dir / "run.cfg"
        cfg.write_text(process_config(gw_dir / "haproxy.cfg"))
        start_haproxy(cfg, gw_port, procs)
        yield {"work": work, "ca": ca_dir, "gateway": gw_port, "doors": doors, "seen": seen, "variables": variables,
               "engines": engines, "stats": stats_port, "procs": procs,
               "first": first, "gw_cfg": (gw_dir / "haproxy.cfg").read_text(),
               "plan": json.loads((gw_dir / "plan.json").read_text())}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for engine in engines.values():
            engine.shutdown()
            engine.server_close()


def tls_context(cert=None, key=None, ca=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if ca:
        ctx.load_verify_locations(str(ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def request(port, target, ctx, headers=None, method="GET", body=b""):
    """(status, body) of one request, or the exception that ended it (a refused door answers nothing)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return None, exc
    finally:
        conn.close()


def door_ctx(fleet, name, client="gateway"):
    node_dir = fleet["ca"] / name
    return tls_context(node_dir / ("%s.pem" % client), node_dir / ("%s.key" % client), fleet["ca"] / "ca.pem")


def wait_until(predicate, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_gateway_plans_one_client_certificate_per_door_and_no_shared_key(fleet):
    plan = fleet["plan"]
    assert plan["backend_key"] == 0
    assert [(s["name"], s["door"], s["door_client"]) for s in plan["servers"]] == [
        ("node-a", True, "hmk-gateway-to-node-a"), ("node-b", True, "hmk-gateway-to-node-b")]
    for name in NODE_KEYS:
        assert "crt %s/doors/%s.pem" % (fleet["variables"]["gateway_config_dir"], name) in fleet["gw_cfg"]
        assert "verifyhost hmk-door-%s" % name in fleet["gw_cfg"]
        # No node key is written into any configuration file.
        assert NODE_KEYS[name] not in fleet["gw_cfg"]
        assert NODE_KEYS[name] not in (fleet["work"] / name / "haproxy.cfg").read_text()
    assert "set-header Authorization" not in fleet["gw_cfg"]
    # The gateway role's doors.yml: the CA, and per node its client certificate with the key, root only.
    doors = Path(fleet["variables"]["gateway_config_dir"]) / "doors"
    assert (doors / "ca.pem").read_text() == (fleet["ca"] / "ca.pem").read_text()
    for name in NODE_KEYS:
        assert (doors / ("%s.pem" % name)).stat().st_mode & 0o077 == 0
        assert (fleet["ca"] / name / "gateway.key").read_text().strip() in (doors / ("%s.pem" % name)).read_text()


def test_client_requests_reach_each_node_over_tls_with_that_nodes_key(fleet):
    ctx = tls_context()
    # The health checks go through each door with the gateway's certificate for it.
    assert wait_until(lambda: all(any(p == "/health" for p, _unused, _unused in fleet["seen"][n]) for n in NODE_KEYS)), fleet["seen"]
    for _unused in range(12):
        status, body = request(fleet["gateway"], "/v1/models", ctx,
                               {"Authorization": "Bearer " + CLIENT_KEY, "X-Api-Key": CLIENT_KEY})
        assert status == 200, body
        if all(any(p == "/v1/models" for p, _unused, _unused in fleet["seen"][n]) for n in NODE_KEYS):
            break
    for name in NODE_KEYS:
        got = [(a, x) for p, a, x in fleet["seen"][name] if p == "/v1/models"]
        assert got, "%s was never reached through the gateway" % name
        assert set(got) == {("Bearer " + NODE_KEYS[name], None)}


def test_a_client_key_never_reaches_an_engine(fleet):
    request(fleet["doors"]["node-a"], "/v1/chat/completions", door_ctx(fleet, "node-a"),
            {"Authorization": "Bearer " + CLIENT_KEY, "X-Api-Key": CLIENT_KEY}, method="POST")
    seen = [entry for name in NODE_KEYS for entry in fleet["seen"][name]]
    assert seen
    assert not any(CLIENT_KEY in (a or "") or CLIENT_KEY in (x or "") for _unused, a, x in seen)
    assert any(p == "/v1/chat/completions" and a == "Bearer " + NODE_KEYS["node-a"] for p, a, _unused in fleet["seen"]["node-a"])


def test_node_a_certificate_opens_node_a_door_only(fleet):
    ctx = door_ctx(fleet, "node-a")
    status, body = request(fleet["doors"]["node-a"], "/v1/models", ctx)
    assert status == 200, body
    before = len(fleet["seen"]["node-b"])
    status, body = request(fleet["doors"]["node-b"], "/v1/models", ctx)
    assert status is None, (status, body)
    assert len(fleet["seen"]["node-b"]) == before


def test_the_right_name_from_another_ca_is_refused(fleet, tmp_path):
    key, cert = tmp_path / "x.key", tmp_path / "x.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=hmk-gateway-to-node-b", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    before = len(fleet["seen"]["node-b"])
    status, body = request(fleet["doors"]["node-b"], "/v1/models", tls_context(cert, key, fleet["ca"] / "ca.pem"))
    assert status is None, (status, body)
    assert len(fleet["seen"]["node-b"]) == before


def test_plain_http_and_certificate_less_connections_get_no_answer(fleet):
    port = fleet["doors"]["node-a"]
    before = len(fleet["seen"]["node-a"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = s.recv(4096)
        except OSError:
            answer = b""
    assert b"HTTP/1" not in answer
    status, body = request(port, "/v1/models", tls_context(ca=fleet["ca"] / "ca.pem"))
    assert status is None, (status, body)
    assert len(fleet["seen"]["node-a"]) == before


@pytest.mark.parametrize("target", ["/slots", "/%73lots", "//v1/models", "/metrics", "/props", "/v1/models/../../slots"])
def test_paths_outside_the_allow_list_stop_at_the_door(fleet, target):
    before = list(fleet["seen"]["node-a"])
    status, _unused = request(fleet["doors"]["node-a"], target, door_ctx(fleet, "node-a"))
    assert status == 404
    assert fleet["seen"]["node-a"][len(before):] == [] or all(
        p == "/health" for p, _unused, _unused in fleet["seen"]["node-a"][len(before):])


def _serial(path):
    out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", str(path)], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_certificates_are_kept_until_due_and_then_issued_again(fleet):
    cert = fleet["ca"] / "node-a" / "gateway.pem"
    serial = _serial(cert)
    run_play(fleet["work"], fleet["variables"])
    assert _serial(cert) == serial
    # Due: the 365-day certificate expires within a 365-day renewal window (bounds of the role's own checks kept).
    run_play(fleet["work"], dict(fleet["variables"], inference_service_door_cert_days=400,
                                 inference_service_door_renew_days=399))
    assert _serial(cert) != serial
    assert (fleet["ca"] / "ca.key").stat().st_mode & 0o077 == 0
    assert (fleet["ca"] / "node-a" / "gateway.key").stat().st_mode & 0o077 == 0


def test_a_gateway_without_a_nodes_certificate_stops_before_any_change(fleet, tmp_path):
    gw_dir = tmp_path / "gw"
    gw_dir.mkdir(mode=0o700)
    variables = dict(fleet["variables"], hmk_door_ca_dir=str(tmp_path / "empty-ca"), gateway_config_dir=str(gw_dir))
    r = run_play(fleet["work"], variables, "--limit", "gw", ok=False)
    assert "missing under gateway_door_ca_dir" in r.stdout
    assert "run playbooks/serve.yml on node-a, node-b first" in r.stdout
    assert not (gw_dir / "doors").exists() and not (gw_dir / "haproxy.cfg").exists()


def test_prometheus_certificate_reads_metrics_only_and_only_where_the_door_lets_it(fleet):
    ctx = door_ctx(fleet, "node-a", "monitoring")
    status, body = request(fleet["doors"]["node-a"], "/metrics", ctx, {"Authorization": "Bearer " + CLIENT_KEY})
    assert status == 200, body
    assert ("/metrics", "Bearer " + NODE_KEYS["node-a"], None) in fleet["seen"]["node-a"]
    before = len(fleet["seen"]["node-a"])
    for target in ("/v1/models", "/v1/chat/completions", "/slots"):
        assert request(fleet["doors"]["node-a"], target, ctx)[0] == 404
    assert [p for p, _unused, _unused in fleet["seen"]["node-a"][before:] if p != "/health"] == []
    # node-b's door lets the gateway only: its own Prometheus certificate, and node-a's, get no answer.
    before = len(fleet["seen"]["node-b"])
    for name in ("node-b", "node-a"):
        status, body = request(fleet["doors"]["node-b"], "/metrics", door_ctx(fleet, name, "monitoring"))
        assert status is None, (name, status, body)
    assert [p for p, _unused, _unused in fleet["seen"]["node-b"][before:] if p != "/health"] == []


def test_a_node_that_left_the_group_leaves_no_certificate_on_the_gateway(fleet, tmp_path):
    """node-b leaves door_nodes: the gateway's next run removes doors/node-b.pem (its client certificate and key), in
    check mode only says so, keeps node-a's, the CA's and every file not of the kit's naming, and a re-run changes
    nothing."""
    gw_dir = tmp_path / "gw"
    gw_dir.mkdir(mode=0o700)
    variables = dict(fleet["variables"], gateway_config_dir=str(gw_dir), gateway_min_nodes_up=1)
    run_play(fleet["work"], variables, "--limit", "gw")
    doors = gw_dir / "doors"
    assert sorted(p.name for p in doors.iterdir()) == ["ca.pem", "node-a.pem", "node-b.pem"]
    foreign = ["Node-B.pem", "node-b.pem.bak", "node-b.key", "notes.txt", "-b.pem"]
    for name in foreign:
        (doors / name).write_text("not the kit's\n")
    inventory = json.loads((fleet["work"] / "inventory.json").read_text())
    groups = inventory["all"]["children"]
    groups["retired"] = {"hosts": {"node-b": groups["door_nodes"]["hosts"].pop("node-b")}}
    left = tmp_path / "inventory.json"
    left.write_text(json.dumps(inventory))

    checked = run_play(fleet["work"], variables, "--limit", "gw", "--check", inventory=left)
    assert "changed: [gw] => (item=node-b.pem)" in checked.stdout, checked.stdout[-4000:]
    assert (doors / "node-b.pem").exists()

    run_play(fleet["work"], variables, "--limit", "gw", inventory=left)
    assert sorted(p.name for p in doors.iterdir()) == sorted(["ca.pem", "node-a.pem"] + foreign)
    assert "node-b" not in (gw_dir / "haproxy.cfg").read_text()

    again = run_play(fleet["work"], variables, "--limit", "gw", inventory=left)
    assert "(item=node-b.pem)" not in again.stdout
    assert "gw                         : ok=" in again.stdout and " changed=0 " in again.stdout, again.stdout[-3000:]


def gateway_servers(fleet):
    """{server: (status, hanafail)} of the gateway's backend from its statistics page (CSV): hanafail counts the
    failures the gateway saw in real traffic (observe), apart from its health checks."""
    with urllib.request.urlopen("http://127.0.0.1:%d/;csv" % fleet["stats"], timeout=5) as resp:
        rows = list(csv.DictReader(io.StringIO(resp.read().decode().lstrip("# "))))
    return {r["svname"]: (r["status"], int(r["hanafail"] or 0)) for r in rows
            if r["pxname"] == "hmk_nodes" and r["svname"] not in ("FRONTEND", "BACKEND")}


def test_a_crashed_engine_behind_a_door_costs_no_request_and_its_node_leaves_at_once(fleet):
    """node-b's engine becomes a process of its own, then is killed by its PID (an unplanned crash): every request of
    a burst through the gateway, a POST with a body, is served by node-a without waiting, and node-b is DOWN from what
    the traffic met (hanafail), not only after two failed health checks (inter 1 s, fall 2). Before the fix the door
    answered 503 after three one-second retries on its one engine, and the gateway handed that 503 to the client."""
    name, ctx = "node-b", tls_context()
    engine_port = fleet["engines"][name].server_address[1]
    fleet["engines"][name].shutdown()
    fleet["engines"][name].server_close()
    engine = subprocess.Popen([sys.executable, str(REPO / "tests" / "integration" / "door_engine.py"), str(engine_port)],
                              stdout=subprocess.PIPE, text=True)
    fleet["procs"].append(engine)
    try:
        assert engine.stdout.readline().strip() == "listening"
        headers = {"Authorization": "Bearer " + CLIENT_KEY, "Content-Type": "application/json"}
        assert wait_until(lambda: {s for s, _unused in gateway_servers(fleet).values()} == {"UP"}), gateway_servers(fleet)
        # The engine process is what serves node-b now: node-b answers through its door before the crash.
        served = [request(fleet["gateway"], "/v1/models", ctx, headers) for _unused in range(4)]
        assert all(status == 200 for status, _unused in served), served
        before = gateway_servers(fleet)[name][1]
        a_before = len([p for p, _unused, _unused in fleet["seen"]["node-a"] if p == "/v1/chat/completions"])
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(5)
        killed = time.monotonic()
        prompt = json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}).encode()
        answers = [request(fleet["gateway"], "/v1/chat/completions", ctx, headers, method="POST", body=prompt)
                   for _unused in range(20)]
        burst = time.monotonic() - killed
        state = gateway_servers(fleet)
        assert [status for status, _unused in answers] == [200] * 20, answers
        assert len([p for p, _unused, _unused in fleet["seen"]["node-a"] if p == "/v1/chat/completions"]) == a_before + 20
        assert state[name][0].startswith("DOWN"), (state, burst)
        assert state[name][1] > before, (state, burst)
        assert state["node-a"][0] == "UP", state
        # No answer waited on the dead engine (before the fix the first one took three seconds at the door).
        assert burst < 5, burst
    finally:
        engine.kill()
        engine.wait(5)
        # node-b's recording engine again on its port, for any test after this one and the fixture's teardown.
        fleet["engines"][name] = http.server.ThreadingHTTPServer(("127.0.0.1", engine_port), engine_class(fleet["seen"][name]))
        threading.Thread(target=fleet["engines"][name].serve_forever, daemon=True).start()
