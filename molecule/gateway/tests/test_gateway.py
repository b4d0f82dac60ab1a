"""The gateway in front of two serving twins, checked from a client on the host's loopback and from the twins.

side_effect left the outcomes of its two events in the scenario's directory: load-health.jsonl and
health-event.json (gw-node-a's service stopped under load), load-upgrade.jsonl and upgrade-run.json (the rolling
upgrade under load); each load line is one client request (start, end, status, ok, error).
"""
import http.client
import json
import os
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import testinfra

SCRATCH = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
URL = "https://127.0.0.1:18591"
# Each node on an address of its own, on the same port (molecule.yml): the gateway tells them apart by address.
NODES = {"gw-node-a": ("127.0.0.2", 18593), "gw-node-b": ("127.0.0.3", 18593)}
# gw-node-a serves plainly without a key; gw-node-b is behind its node door (TLS, only the gateway's certificate for
# gw-node-b, its own key added by the door) and its engine listens on 127.0.0.1:18594, where its counters are read.
NODE_B_KEY = "hmk-test-node-b-own-key-2d94c7e1a8"
GROUP_KEY = "hmk-test-node-key-5c1f0e9a7b3d"  # the group's key in molecule.yml, overridden on both nodes: used by none
ENGINES = {"gw-node-a": ("127.0.0.2", 18593, None), "gw-node-b": ("127.0.0.1", 18594, NODE_B_KEY)}
DOOR_NAME = "hmk-door-gw-node-b"
ALICE = "hmk-test-alice-key-4f8e21d0"
BOB = "hmk-test-bob-key-9a3c67e2b1"
LOAD = "hmk-test-load-key-e07d2c55a9"
GOOD = "c963af7bfa0d11f5ae5095696301d996f324deec"
# The role's defaults: a check every 2 s, out after 2 failures; a check that gets no answer fails after 5 s.
CHECK_INTERVAL, CHECK_FALL, CHECK_TIMEOUT = 2, 2, 5


@pytest.fixture(scope="module")
def hosts():
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    return {name: testinfra.get_host("ansible://" + name, ansible_inventory=inventory)
            for name in ["gw-gateway"] + list(NODES)}


@pytest.fixture(scope="module")
def tls():
    return ssl.create_default_context(cafile=str(SCRATCH / "reports" / "gw-gateway" / "gateway-cert.pem"))


def request(tls, path, key=None, body=None, headers=None, url=URL):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=120, context=tls if url.startswith("https") else None) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        # The headers as an HTTPMessage: names match whatever their case (HAProxy sends them in lower case).
        return e.code, e.headers, e.read().decode()


def chat(tls, key=ALICE, stream=False):
    return request(tls, "/v1/chat/completions", key,
                   {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": stream})


def haproxy_log(gateway, until=None, timeout=30):
    """The gateway's journal lines from HAProxy with their time (seconds since the epoch).

    HAProxy writes a request's line once the answer has gone to the client, and the line then passes through
    syslog and journald, so a read right after the last answer can run ahead of it. With `until`, the journal is
    read again (every half second, for at most `timeout` seconds) until until(lines) holds; the caller still
    asserts on what was read.
    """
    deadline = time.time() + timeout
    while True:
        out = gateway.check_output("journalctl -t haproxy -o json --no-pager")
        lines = [(int(e["__REALTIME_TIMESTAMP"]) / 1e6, e["MESSAGE"]) for e in map(json.loads, out.splitlines())
                 if isinstance(e.get("MESSAGE"), str)]
        if until is None or until(lines) or time.time() > deadline:
            return lines
        time.sleep(0.5)


def load(name):
    return [json.loads(line) for line in (SCRATCH / name).read_text().splitlines() if line]


def metric(node, name):
    address, port, key = ENGINES[node]
    _unused, _unused, text = request(None, "/metrics", key, url="http://%s:%d" % (address, port))
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert values, "no %s in the node's /metrics" % name
    return values[0]


# ---------------------------------------------------------------------------------------------- the collection

def test_gateway_was_converged_from_the_installed_tarball():
    tarballs = list((SCRATCH / "collection").glob("hmk-moe_kit-*.tar.gz"))
    assert len(tarballs) == 1
    installed = SCRATCH / "installed" / "ansible_collections" / "hmk" / "moe_kit"
    for path in ("playbooks/gateway.yml", "playbooks/upgrade.yml", "roles/gateway/tasks/main.yml",
                 "plugins/modules/hmk_haproxy_server.py", "plugins/filter/gateway.py", "MANIFEST.json"):
        assert (installed / path).is_file(), path
    # build_ignore kept the repository's test bed and local state out of the release.
    for path in ("molecule", "tests", ".collections", ".venv", "Makefile", "inventories/lab"):
        assert not (installed / path).exists(), path
    first = (SCRATCH / "gateway-run-first.log").read_text()
    second = (SCRATCH / "gateway-run-second.log").read_text()
    assert re.search(r"gw-gateway\s+: ok=\d+\s+changed=[1-9]", first)
    assert re.search(r"gw-gateway\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", second)
    # The role's tasks came from the installed copy.
    assert "TASK [hmk.moe_kit.gateway : HAProxy's configuration fronts the serving nodes" in first


# --------------------------------------------------------------------------------------------------- clients

def test_requests_through_the_gateway_reach_both_nodes(hosts, tls):
    before = {n: metric(n, "llamacpp:tokens_predicted_total") for n in NODES}
    since = time.time()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _unused: chat(tls), range(8)))
    assert [s for s, _unused, _unused in results] == [200] * 8
    assert all(json.loads(b)["choices"][0]["message"]["content"] is not None for _unused, _unused, b in results)
    # Each node generated tokens for some of them (the nodes' own counters)...
    after = {n: metric(n, "llamacpp:tokens_predicted_total") for n in NODES}
    assert all(after[n] > before[n] for n in NODES), (before, after)
    # ...and the gateway's log names both as servers of alice's requests (all 8 lines written).

    def alices(lines):
        return [m for t, m in lines if t >= since - 1 and "client=alice POST" in m]
    served = {m.split()[3].split("/")[1] for m in alices(haproxy_log(hosts["gw-gateway"],
                                                                     until=lambda lines: len(alices(lines)) >= 8))}
    assert served == set(NODES), served


def test_a_client_without_a_valid_key_gets_401_from_the_gateway(hosts, tls):
    since = time.time()
    for key in (None, "not-a-client-key-at-all", NODE_B_KEY):
        status, headers, body = chat(tls, key=key)
        assert status == 401, (key, status, body)
        assert json.loads(body)["error"]["type"] == "authentication_error"
        assert headers.get("WWW-Authenticate") == "Bearer"
    # No node saw them: the gateway answered (no server in the log line).

    def refusals(lines):
        return [m for t, m in lines if t >= since - 1 and " 401 " in m]
    lines = refusals(haproxy_log(hosts["gw-gateway"], until=lambda lines: len(refusals(lines)) >= 3))
    assert len(lines) == 3 and all("<NOSRV>" in m for m in lines), lines


def test_a_client_keys_rate_limit_answers_429(tls):
    # bob may send 5 requests a minute (molecule.yml); models is the cheapest path that reaches a node.
    statuses = [request(tls, "/v1/models", BOB)[0] for _unused in range(7)]
    assert statuses[:5] == [200] * 5 and statuses[5:] == [429, 429], statuses
    status, headers, body = request(tls, "/v1/models", BOB)
    assert status == 429 and headers.get("Retry-After") == "60"
    assert json.loads(body)["error"]["type"] == "rate_limit_error"
    # alice's own budget is untouched by bob's.
    assert request(tls, "/v1/models", ALICE)[0] == 200


def test_streaming_passes_through_as_server_sent_events(tls):
    req = urllib.request.Request(URL + "/v1/chat/completions", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + ALICE},
        data=json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16,
                         "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=120, context=tls) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines = [raw.decode().strip() for raw in r]
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in data[:-1]]
    assert len(chunks) > 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_openai_paths_pass_through_and_node_internals_do_not(tls):
    status, _unused, body = request(tls, "/v1/models", ALICE)
    assert status == 200 and json.loads(body)["data"][0]["id"]
    status, _unused, body = request(tls, "/v1/completions", ALICE, {"prompt": "The capital of France is", "max_tokens": 4})
    assert status == 200 and json.loads(body)["choices"]
    for path in ("/metrics", "/slots", "/slots/list"):
        assert request(tls, path, ALICE)[0] == 404, path
    # The gateway's own readiness needs no key, like the engine's.
    status, _unused, body = request(tls, "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


# Spellings of the nodes' internals a decoding or merging server would take for /slots, /metrics or /props.
SPELLINGS = ["/%73lots", "//slots", "/%6detrics", "/v1/../slots", "/v1/%2e%2e/slots", "/./metrics", "/%2fslots",
             "/v1/models/../../props", "/V1/models", "/v1/Models", "/v1/models%2F..%2F..%2Fslots", "/%25%37%33lots",
             "/slots;x", "/metrics/"]


def raw_request(tls, method, target, key):
    """One request with its target sent as written (urllib would not re-encode it, http.client sends it as is)."""
    conn = http.client.HTTPSConnection("127.0.0.1", 18591, context=tls, timeout=60)
    conn.putrequest(method, target, skip_accept_encoding=True)
    conn.putheader("Authorization", "Bearer " + key)
    conn.putheader("Content-Length", "0")
    conn.endheaders()
    resp = conn.getresponse()
    status = resp.status
    resp.read()
    conn.close()
    return status


def test_non_normalised_internal_paths_are_refused_at_the_gateway_and_reach_no_node(hosts, tls):
    since = time.time()
    for target in SPELLINGS:
        assert raw_request(tls, "GET", target, LOAD) == 404, target
    # The gateway answered each itself: its log line names no server (<NOSRV>), and shows the path as sent.

    def refused(lines):
        return [m for t, m in lines if t >= since - 1 and "client=load GET" in m]
    lines = refused(haproxy_log(hosts["gw-gateway"], until=lambda lines: len(refused(lines)) >= len(SPELLINGS)))
    assert len(lines) == len(SPELLINGS), lines
    assert all(" 404 " in m and "<NOSRV>" in m for m in lines), lines
    assert sorted(m.rsplit(" ", 1)[-1] for m in lines) == sorted(SPELLINGS), lines
    # The same client reaches a node through the one normal spelling, so the refusals are the paths', not the key's.
    assert raw_request(tls, "GET", "/v1/models", LOAD) == 200


def test_a_loopback_node_behind_the_gateway_is_refused_at_plan_time(hosts):
    run = json.loads((SCRATCH / "plan-loopback.json").read_text())
    # Without colour codes (ansible-playbook colours its recap when it thinks it may).
    out = re.sub(r"\x1b\[[0-9;]*m", "", run["stdout"] + run["stderr"])
    assert run["rc"] != 0, out[-3000:]
    assert ("gw-plan-loopback serves on 127.0.0.1 (inference_service_host), a loopback address: the gateway "
            "gw-gateway would reach its own loopback") in out, out[-3000:]
    assert "Set inference_service_host on gw-plan-loopback" in out and "gateway_nodes_share_loopback" in out
    # It stopped while planning: nothing changed on the gateway, which still balances the two real nodes.
    assert re.search(r"gw-gateway\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=1", out), out[-3000:]
    config = hosts["gw-gateway"].file("/etc/haproxy/haproxy.cfg").content_string
    assert "gw-plan-loopback" not in config and "server gw-node-a 127.0.0.2:18593" in config


def test_keys_stay_off_the_gateways_config_and_log(hosts):
    gw = hosts["gw-gateway"]
    config = gw.file("/etc/haproxy/haproxy.cfg").content_string
    journal = gw.check_output("journalctl --no-pager -o cat")
    for secret in (NODE_B_KEY, GROUP_KEY, ALICE, BOB, LOAD):
        assert secret not in config and secret not in journal
    # The client keys are stored as sha256 only; the node key in a root-only map.
    for path in ("/etc/haproxy/hmk/clients.map", "/etc/haproxy/hmk/backend-key.map", "/etc/haproxy/hmk/tls/gateway.pem.key",
                 "/etc/haproxy/hmk/concurrency.map"):
        f = gw.file(path)
        assert (f.user, f.group, f.mode) == ("root", "root", 0o600), path
    clients = gw.file("/etc/haproxy/hmk/clients.map").content_string
    assert ALICE not in clients and re.fullmatch(r"([0-9a-f]{64} \w+\n)+", clients)
    # With a door in the group the gateway holds no node key at all: each door adds its own node's.
    assert gw.file("/etc/haproxy/hmk/backend-key.map").content_string == ""
    assert "set-header Authorization" not in config
    # The log names the client, never its key.
    assert "client=alice" in journal


def test_haproxy_is_debians_and_balances_by_least_connections_one_per_slot(hosts):
    gw = hosts["gw-gateway"]
    assert gw.package("haproxy").is_installed and gw.package("haproxy").version.startswith("2.6")
    config = gw.file("/etc/haproxy/haproxy.cfg").content_string
    assert "balance leastconn" in config
    for name, (address, port) in NODES.items():
        # ik_llama.cpp's default of one slot (no -np in the lab): one request at a time per node, the rest queued.
        assert "server %s %s:%d maxconn 1" % (name, address, port) in config
    # gw-node-b over TLS with its own client certificate, the door's name checked; gw-node-a in plain HTTP.
    line_b = next(line for line in config.splitlines() if line.strip().startswith("server gw-node-b "))
    line_a = next(line for line in config.splitlines() if line.strip().startswith("server gw-node-a "))
    assert "ssl verify required" in line_b and "crt /etc/haproxy/hmk/doors/" in line_b and DOOR_NAME in line_b
    assert "ssl" not in line_a.split()
    assert gw.service("haproxy").is_running and gw.service("haproxy").is_enabled


# ------------------------------------------------------------------------------------------- the node door

DOOR_CA = SCRATCH / "door-ca"


class _DoorConnection(http.client.HTTPSConnection):
    """HTTPS to gw-node-b's door on 127.0.0.3:18593, naming the door (SNI, the certificate's name, Host)."""

    def connect(self):
        sock = socket.create_connection(("127.0.0.3", 18593), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=DOOR_NAME)


def door_request(path, cert=None, key=None):
    """(status, body) of a GET to gw-node-b's door over TLS, presenting `cert` (a client certificate of the door
    CA's directory) or none; an exception when the door refuses the handshake or closes the connection."""
    ctx = ssl.create_default_context(cafile=str(DOOR_CA / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(DOOR_CA / cert), str(DOOR_CA / key))
    conn = _DoorConnection(DOOR_NAME, 18593, context=ctx, timeout=20)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def test_the_door_serves_only_the_gateways_certificate_for_its_node(hosts):
    node_b = hosts["gw-node-b"]
    assert node_b.service("hmk-door").is_running and node_b.service("hmk-door").is_enabled
    # The door holds the node's address; the engine listens on loopback only.
    assert node_b.socket("tcp://127.0.0.3:18593").is_listening
    assert node_b.socket("tcp://127.0.0.1:18594").is_listening
    assert not node_b.socket("tcp://0.0.0.0:18594").is_listening
    # The gateway's certificate for gw-node-b gets an OpenAI path, and nothing else.
    status, body = door_request("/v1/models", "gw-node-b/gateway.pem", "gw-node-b/gateway.key")
    assert status == 200 and "data" in json.loads(body), (status, body)
    for path in ("/slots", "/%73lots", "//v1/models", "/metrics", "/props"):
        status, _unused = door_request(path, "gw-node-b/gateway.pem", "gw-node-b/gateway.key")
        assert status == 404, (path, status)
    # No certificate, or Prometheus' certificate for gw-node-b (no door_monitoring here): no request reaches the
    # engine. (A certificate for another node is refused the same way: tests/integration/test_door_haproxy.py.)
    for cert, key in ((None, None), ("gw-node-b/monitoring.pem", "gw-node-b/monitoring.key")):
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
            door_request("/v1/models", cert, key)
    # Plain HTTP to the door's port gets no answer from the engine.
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError, urllib.error.URLError)):
        status, _unused, _unused = request(None, "/v1/models", url="http://127.0.0.3:18593")
        assert status != 200


def test_the_engine_behind_the_door_takes_only_its_own_nodes_key(hosts):
    # gw-node-b's engine, asked on its loopback port for a path behind its key (llama-server answers /health and
    # /v1/models without one): its own key opens it; the group's key and no key do not.
    assert request(None, "/metrics", NODE_B_KEY, url="http://127.0.0.1:18594")[0] == 200
    assert request(None, "/metrics", GROUP_KEY, url="http://127.0.0.1:18594")[0] == 401
    assert request(None, "/metrics", url="http://127.0.0.1:18594")[0] == 401
    node_b = hosts["gw-node-b"]
    key_map = node_b.file("/etc/hmk-door/engine-key.map")
    assert (key_map.user, key_map.group, key_map.mode) == ("root", "root", 0o600)
    assert NODE_B_KEY not in node_b.file("/etc/hmk-door/haproxy.cfg").content_string
    # Nothing on the node logs it: the door, the engine, and every run of upgrade, tune and validate that went through
    # this node (the modules' own "Invoked with" lines included). A line that holds it is named by who wrote it.
    leaks = []
    for line in node_b.check_output("journalctl --no-pager -o json").splitlines():
        if NODE_B_KEY in line:
            entry = json.loads(line)
            leaks.append({k: str(entry.get(k, "")).replace(NODE_B_KEY, "<key>")[:300]
                          for k in ("SYSLOG_IDENTIFIER", "_COMM", "_SYSTEMD_UNIT", "MESSAGE")})
    assert leaks == [], leaks
    # The gateway's per-node certificate is root-only on the gateway.
    cert = hosts["gw-gateway"].file("/etc/haproxy/hmk/doors/gw-node-b.pem")
    assert (cert.user, cert.group, cert.mode) == ("root", "root", 0o600)


# ------------------------------------------------------------------------------------ events under load

def test_a_stopped_node_leaves_rotation_within_the_health_check_and_no_request_fails_after(hosts):
    event = json.loads((SCRATCH / "health-event.json").read_text())
    # When systemd began stopping the service (its journal), not when the controller asked: under load the task
    # that stops it takes seconds of its own.
    # The time systemd wrote the line (_SOURCE_REALTIME_TIMESTAMP), not when the node's journald received it: HAProxy
    # can see the refused connection and its journald stamp the DOWN line before the node's journald stamps the
    # Stopping line (measured: 150 us before), while systemd wrote it 3 ms earlier.
    journal = hosts["gw-node-a"].check_output("journalctl -u hmk-inference.service -o json --no-pager")
    entries = [(int(e.get("_SOURCE_REALTIME_TIMESTAMP") or e["__REALTIME_TIMESTAMP"]) / 1e6, str(e.get("MESSAGE", "")))
               for e in map(json.loads, journal.splitlines())]
    stops = [t for t, message in entries if message.startswith("Stopping") and t >= event["stopped_at"] - 1]
    assert stops, "no Stopping line for hmk-inference on gw-node-a after the side effect stopped it"
    stopped = stops[0]
    down = [t for t, m in haproxy_log(hosts["gw-gateway"])
            if t >= stopped and re.match(r"Server hmk_nodes/gw-node-a is DOWN", m)]
    assert down, "HAProxy never logged gw-node-a DOWN"
    detected = down[0] - stopped
    # Out within fall checks, the first one at most one interval away (or at once, on a refused request); a check
    # sent while the engine was still shutting down may wait out its timeout before it counts as failed.
    assert detected <= (CHECK_FALL + 1) * CHECK_INTERVAL + CHECK_TIMEOUT, detected
    requests = load("load-health.jsonl")
    after = [r for r in requests if r["start"] >= down[0]]
    assert len(after) >= 5, "too little load after the node left to judge"
    assert [r for r in after if not r["ok"]] == []
    # While gw-node-a was down, the gateway sent everything to gw-node-b.
    restored = [t for t, m in haproxy_log(hosts["gw-gateway"]) if t > down[0] and "gw-node-a is UP" in m]
    window = [m for t, m in haproxy_log(hosts["gw-gateway"])
              if down[0] < t < (restored[0] if restored else time.time()) and "client=load POST" in m]
    assert window and all("hmk_nodes/gw-node-b " in m for m in window)
    # Reported for the record: requests in flight on gw-node-a when it stopped may have failed before detection.
    print("health event: detected after %.2f s; %d requests, %d failed before detection, 0 after" % (
        detected, len(requests), sum(1 for r in requests if not r["ok"])))


def test_the_rolling_upgrade_drains_and_restores_each_node_with_no_failed_request(hosts):
    run = json.loads((SCRATCH / "upgrade-run.json").read_text())
    assert run["rc"] == 0, (run["stdout"] + run["stderr"])[-4000:]
    requests = load("load-upgrade.jsonl")
    failed = [r for r in requests if not r["ok"]]
    assert failed == [], failed[:5]
    assert len(requests) >= 10
    log = haproxy_log(hosts["gw-gateway"])
    start, end = min(r["start"] for r in requests), max(r["end"] for r in requests)
    # The upgrade's window only: the tune and the interrupted runs after it drain the nodes again.
    events = [(t, m) for t, m in log if start <= t <= end and re.match(
        r"Server hmk_nodes/gw-node-[ab] (enters drain state|is going DOWN for maintenance|is UP/READY)", m)]
    order = [re.match(r"Server hmk_nodes/(gw-node-[ab]) (enters drain|is going DOWN|is UP/READY)", m).groups()
             for _unused, m in events]
    # One node at a time: a drained, in maintenance, back; only then b.
    assert order == [("gw-node-a", "enters drain"), ("gw-node-a", "is going DOWN"), ("gw-node-a", "is UP/READY"),
                     ("gw-node-b", "enters drain"), ("gw-node-b", "is going DOWN"), ("gw-node-b", "is UP/READY")], order
    # While a node was out, every request went to the other one.
    for node, other in (("gw-node-a", "gw-node-b"), ("gw-node-b", "gw-node-a")):
        out_t = [t for t, m in events if m.startswith("Server hmk_nodes/%s is going DOWN" % node)][0]
        back_t = [t for t, m in events if m.startswith("Server hmk_nodes/%s is UP/READY" % node)][0]
        served = {m.split()[3] for t, m in log if out_t < t < back_t and "client=load POST" in m}
        assert served and served <= {"hmk_nodes/" + other}, (node, served)
    print("upgrade: %d requests through the gateway, 0 failed" % len(requests))


def test_both_nodes_serve_the_new_build_after_the_upgrade(hosts):
    for name in NODES:
        current = hosts[name].file("/opt/hmk/engines/ik_llama.cpp/current").linked_to
        assert os.path.basename(current).startswith(GOOD[:12] + "-"), (name, current)
        assert hosts[name].service("hmk-inference").is_running
    status = hosts["gw-gateway"].check_output(
        "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock'); "
        "s.sendall(b'show stat\\n'); print(s.makefile().read())\"")
    rows = {line.split(",")[1]: line.split(",")[17] for line in status.splitlines() if line.startswith("hmk_nodes,gw-")}
    assert rows == {"gw-node-a": "UP", "gw-node-b": "UP"}, rows


# ------------------------------------------------------------------------------------------ fleet-safe day 2

# side_effect's bounds for the interrupted runs (heal-vars.yml): the node heals 45 s after the run armed it, the
# gateway takes the node out of maintenance 30 s after the drain armed it (the minimum; its health check keeps the
# node out of rotation until the node serves again, so the gateway's bound need not wait for the node's). The node's
# restart and the gateway's health check (rise 2 at 2 s) come on top; the slack covers them on 2 emulated cores.
NODE_HEAL_AFTER, GATEWAY_HEAL_AFTER, SLACK = 45, 30, 60


def test_tune_on_the_group_keeps_a_node_serving_throughout(hosts):
    run = json.loads((SCRATCH / "tune-run.json").read_text())
    assert run["rc"] == 0, (run["stdout"] + run["stderr"])[-4000:]
    requests = load("load-tune.jsonl")
    failed = [r for r in requests if not r["ok"]]
    assert failed == [], failed[:5]
    assert len(requests) >= 10
    log = haproxy_log(hosts["gw-gateway"])
    start, end = min(r["start"] for r in requests), max(r["end"] for r in requests)
    order = [re.match(r"Server hmk_nodes/(gw-node-[ab]) (enters drain|is going DOWN|is UP/READY)", m).groups()
             for t, m in log if start <= t <= end and re.match(
                 r"Server hmk_nodes/gw-node-[ab] (enters drain state|is going DOWN for maintenance|is UP/READY)", m)]
    # One node at a time (serial 1): a out and back before b goes out.
    assert order[:3] == [("gw-node-a", "enters drain"), ("gw-node-a", "is going DOWN"), ("gw-node-a", "is UP/READY")], order
    assert order[3:6] == [("gw-node-b", "enters drain"), ("gw-node-b", "is going DOWN"), ("gw-node-b", "is UP/READY")], order
    for name in NODES:
        assert (SCRATCH / "tuned" / (name + ".yml")).is_file(), "no tuned file for " + name
    print("tune: %d requests through the gateway while both nodes were searched, 0 failed" % len(requests))


def test_the_fleet_guard_refuses_a_batch_that_would_leave_nobody_serving(hosts):
    run = json.loads((SCRATCH / "guard-run.json").read_text())
    out = run["stdout"] + run["stderr"]
    assert run["rc"] != 0, out[-3000:]
    assert "Refused before any change" in out and "fewer than" in out and "inference_service_fleet_min_serving=1" in out, out[-3000:]
    assert "not answering: gw-node-b" in re.sub(r"\s+", " ", out), out[-3000:]
    # Nothing was touched: gw-node-a still runs the build the rolling upgrade left (the guard ran first).
    current = hosts["gw-node-a"].file("/opt/hmk/engines/ik_llama.cpp/current").linked_to
    assert os.path.basename(current).startswith(GOOD[:12] + "-"), current


@pytest.mark.parametrize("name", ["tune", "upgrade"])
def test_an_interrupted_run_leaves_the_node_serving_its_last_good_configuration_by_itself(hosts, name):
    heal = json.loads((SCRATCH / ("heal-%s.json" % name)).read_text())
    # The node went back by itself, in time, and says why in its journal.
    assert heal["healed_at"] - heal["killed_at"] <= NODE_HEAL_AFTER + SLACK, heal
    assert "serves the last good configuration again" in heal["node_journal"], heal["node_journal"]
    # The gateway took the node back by itself (its own timer, no run), in rotation once the node serves again.
    assert heal["in_rotation_at"] - heal["killed_at"] <= max(NODE_HEAL_AFTER, GATEWAY_HEAL_AFTER) + SLACK, heal
    assert "back in rotation" in heal["gateway_journal"], heal["gateway_journal"]
    # The build that serves is the one that served before the run, wherever the run was killed.
    assert heal["after"] == heal["before"], heal
    if name == "upgrade":
        # Killed with the main commit's build already current: the heal put the link back.
        assert os.path.basename(heal["at_kill"]).startswith("462213ef9ec3-"), heal
        assert os.path.basename(heal["after"]).startswith(GOOD[:12] + "-"), heal
    assert not hosts["gw-node-a"].file("/etc/hmk/hmk-inference.last-good/armed").exists
    assert hosts["gw-node-a"].service("hmk-inference").is_running
    status, _unused, body = request(None, "/health", url="http://%s:%d" % NODES["gw-node-a"])
    assert status == 200, body
    print("%s killed: the node served again after %.1f s, the gateway had it back after %.1f s" % (
        name, heal["healed_at"] - heal["killed_at"], heal["in_rotation_at"] - heal["killed_at"]))


def test_a_node_left_in_maintenance_fails_the_gateways_run_naming_it(hosts):
    run = json.loads((SCRATCH / "held-run.json").read_text())
    out = re.sub(r"\s+", " ", run["stdout"] + run["stderr"])
    assert run["rc"] != 0, out[-3000:]
    assert "gw-node-b held in maintenance or drain on this gateway" in out, out[-3000:]
    assert "gateway_maintenance_allowed" in out


def test_no_node_is_held_and_no_self_heal_is_pending_at_the_end(hosts):
    state = hosts["gw-gateway"].check_output(
        "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock'); "
        "s.sendall(b'show servers state hmk_nodes\\n'); print(s.makefile().read())\"")
    rows = [line.split() for line in state.splitlines()[2:] if line.strip() and not line.startswith("#")]
    # Column 7 (srv_admin_state): no forced maintenance or drain left.
    assert {row[3]: int(row[6]) & 0x09 for row in rows} == {"gw-node-a": 0, "gw-node-b": 0}, rows
    for name in NODES:
        assert not hosts[name].file("/etc/hmk/hmk-inference.last-good/armed").exists, name
