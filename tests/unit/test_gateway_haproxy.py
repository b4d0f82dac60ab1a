"""The gateway's rendered haproxy.cfg run by the real HAProxy (Debian 12: 2.6) on 127.0.0.1, in front of a tiny
Python node on 127.0.0.1 that records every request reaching it.

Only the process lines a test cannot keep (chroot, user, group, daemon, syslog) are dropped; the frontend and the
backend are the template's, with the role's defaults. What is checked: only the allow-list goes on, in its one
normal spelling and byte for byte as judged; whatever spelling a client uses for a node's internals (escapes,
doubled slashes, dot segments, case) it never reaches the node; the node key is added only to what goes on.
"""
import http.client
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import jinja2
import pytest
import yaml

from ansible_collections.hmk.moe_kit.plugins.filter import gateway as gateway_filter
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_haproxy

ROLE = Path(__file__).resolve().parents[2] / "roles" / "gateway"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CLIENT_KEY = "unit-test-client-key-0123456789"
NODE_KEY = "unit-test-node-key-abcdefghijklmnop"
BUSY_KEY = "unit-test-busy-client-key-987654"

# The running HAProxy's admin socket (the gateway fixture fills it in).
ADMIN = {}

pytestmark = pytest.mark.skipif(not os.access(HAPROXY, os.X_OK),
                                reason="haproxy is not installed (Makefile DEB_PACKAGES: make deps)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node(http.server.BaseHTTPRequestHandler):
    """A node: /health answers 200, every other request is recorded (raw path, Authorization) and answered 200."""
    seen = []

    def _answer(self):
        if self.headers.get("X-Unit-Slow"):
            time.sleep(1.5)
        if self.path == "/health":
            body = b'{"status":"ok"}'
        else:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            Node.seen.append((self.path, self.headers.get("Authorization"), self.headers.get("X-Api-Key")))
            body = json.dumps({"node_saw": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args):
        pass


def render(tmp, port, node_port, stats_port):
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["comment"] = lambda text: "#\n# %s\n#" % text
    context = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for name, value in yaml.safe_load((ROLE / "vars" / "main.yml").read_text()).items():
        if isinstance(value, str) and "{{" not in value:
            context[name] = value
    context.update({
        "ansible_managed": "Ansible managed",
        "gateway_bind_address": "127.0.0.1", "gateway_port": port, "gateway_stats_bind": "127.0.0.1:%d" % stats_port,
        "gateway_admin_socket": str(tmp / "admin.sock"), "__gateway_state_file": str(tmp / "state"),
        "__gateway_tls_cert": str(tmp / "gateway.pem"), "__gateway_clients_map": str(tmp / "clients.map"),
        "__gateway_limits_map": str(tmp / "limits.map"), "__gateway_backend_key_map": str(tmp / "key.map"),
        "__gateway_concurrency_map": str(tmp / "concurrency.map"),
        "__gateway_backend_key": NODE_KEY,
        "__gateway_servers": [{"name": "node-a", "address": "127.0.0.1", "port": node_port, "slots": 4}],
    })
    text = env.from_string((ROLE / "templates" / "haproxy.cfg.j2").read_text()).render(**context)
    process_only = ("chroot ", "user ", "group ", "daemon", "log /dev/log")
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(process_only)) + "\n"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gw")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(tmp / "gateway.pem.key"), "-out", str(tmp / "gateway.pem")],
                   check=True, capture_output=True)
    import hashlib
    (tmp / "clients.map").write_text("%s unit\n" % hashlib.sha256(CLIENT_KEY.encode()).hexdigest())
    (tmp / "limits.map").write_text("unit 100000\nbusy 100000\n")
    # busy may have 2 requests in progress; unit takes the role's default.
    (tmp / "concurrency.map").write_text("busy 2\n")
    with open(tmp / "clients.map", "a") as f:
        f.write("%s busy\n" % hashlib.sha256(BUSY_KEY.encode()).hexdigest())
    (tmp / "key.map").write_text("hmk_nodes %s\n" % NODE_KEY)
    node = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Node)
    threading.Thread(target=node.serve_forever, daemon=True).start()
    port, stats_port = free_port(), free_port()
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(render(tmp, port, node.server_address[1], stats_port))
    check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "haproxy did not listen"
            time.sleep(0.1)
    ADMIN["socket"] = str(tmp / "admin.sock")
    yield port
    proc.terminate()
    proc.wait(10)
    node.shutdown()


def send(port, method, target, key=CLIENT_KEY, headers=None):
    """One request with the request target exactly as given (no client-side normalisation)."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10)
    conn.putrequest(method, target, skip_accept_encoding=True)
    if key:
        conn.putheader("Authorization", "Bearer " + key)
    for name, value in (headers or {}).items():
        conn.putheader(name, value)
    body = b"{}" if method == "POST" else b""
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    resp = conn.getresponse()
    out = resp.status, resp.read().decode()
    conn.close()
    return out


@pytest.mark.parametrize("target", [
    "/slots", "/metrics", "/props", "/slots/0?action=save", "/%73lots", "/%6detrics", "//slots", "///metrics",
    "/v1/../slots", "/v1/%2e%2e/slots", "/v1/%2E%2E/metrics", "/./slots", "/v1/models/../../slots", "/V1/models",
    "/v1/Chat/completions", "/v1/models/", "/v1/models;x", "/v1/models%2F..%2F..%2Fslots", "/v1%2fmodels",
    "/%2fslots", "/v1/models%00", "/%25%37%33lots", "/v1/models%", "/v1/models%zz", "/flush_cache",
    "/get_server_info", "/generate", "/update_weights_from_disk", "/completion", "/tokenize",
    "http://127.0.0.1/slots", "/v1/models/../../%73lots",
    # Other spellings of an allowed path are refused too, not decoded: only the judged bytes ever go on.
    "//v1//models", "/v1/%6dodels", "/v1/./models", "/slots/../v1/models", "/v1/chat/completions/",
    "/v1/models/../../props", "/v1/Models", "/slots;x", "/metrics/", "/./metrics",
])
def test_a_node_internal_path_never_reaches_the_node_under_any_spelling(gateway, target):
    before = len(Node.seen)
    status, body = send(gateway, "GET", target)
    assert status == 404, (target, status, body)
    assert json.loads(body)["error"]["code"] == status
    assert Node.seen[before:] == [], (target, Node.seen[before:])


@pytest.mark.parametrize("target", [
    "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models?limit=1",
])
def test_the_openai_paths_reach_the_node_as_sent_with_the_node_key_only(gateway, target):
    before = len(Node.seen)
    status, body = send(gateway, "POST", target, headers={"X-Api-Key": "client-sent-this"})
    assert status == 200, (target, status, body)
    assert Node.seen[before:] == [(target, "Bearer " + NODE_KEY, None)]


def test_without_a_client_key_nothing_reaches_the_node(gateway):
    before = len(Node.seen)
    assert send(gateway, "POST", "/v1/chat/completions", key=None)[0] == 401
    assert send(gateway, "POST", "/v1/chat/completions", key=NODE_KEY)[0] == 401
    assert Node.seen[before:] == []


def test_the_gateways_health_is_its_own_and_the_nodes_is_not_forwarded(gateway):
    before = len(Node.seen)
    status, body = send(gateway, "GET", "/health", key=None)
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    for target in ("//health", "/%68ealth", "/health/"):
        assert send(gateway, "GET", target, key=None)[0] == 401, target
        assert send(gateway, "GET", target)[0] == 404, target
    assert Node.seen[before:] == []


def test_a_keys_requests_in_progress_are_capped_and_the_cap_frees_as_they_end(gateway):
    from concurrent.futures import ThreadPoolExecutor
    slow = {"X-Unit-Slow": "1"}
    with ThreadPoolExecutor(5) as pool:
        busy = list(pool.map(lambda _: send(gateway, "POST", "/v1/completions", key=BUSY_KEY, headers=slow), range(5)))
    # Two in progress at once for busy; the others are refused at once, not queued.
    assert sorted(status for status, _unused in busy) == [200, 200, 429, 429, 429], busy
    assert all(json.loads(body)["error"]["type"] == "rate_limit_error" for status, body in busy if status == 429)
    # Finished requests free the cap (sequential requests are never counted together)...
    assert [send(gateway, "POST", "/v1/models", key=BUSY_KEY)[0] for _unused in range(4)] == [200] * 4
    # ...and another key's default (16) is its own.
    with ThreadPoolExecutor(5) as pool:
        others = list(pool.map(lambda _: send(gateway, "POST", "/v1/completions", headers=slow), range(5)))
    assert [status for status, _unused in others] == [200] * 5


def heal(*args):
    """roles/gateway/files/hmk-gateway-heal as the gateway's timer runs it, importing the kit's module_utils."""
    return subprocess.run([sys.executable, str(ROLE / "files" / "hmk-gateway-heal")] + list(args), capture_output=True,
                          text=True, check=False, env=dict(os.environ, PYTHONPATH=str(ROLE.parents[1] / "plugins" / "module_utils")))


def test_the_self_heal_takes_back_a_node_left_in_maintenance_and_leaves_others_alone(gateway):
    api = hmk_haproxy.RuntimeApi(ADMIN["socket"])
    # Not held: nothing to do, nothing changed.
    r = heal(ADMIN["socket"], "hmk_nodes", "node-a")
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr
    assert api.server("hmk_nodes", "node-a")["admin_state"] == 0
    # Held in forced maintenance (what an interrupted drain leaves): back to ready, the health check decides the rest.
    api.set_state("hmk_nodes", "node-a", "maint")
    assert api.server("hmk_nodes", "node-a")["admin_state"] & hmk_haproxy.ADMF_FMAINT
    r = heal(ADMIN["socket"], "hmk_nodes", "node-a")
    assert r.returncode == 0 and "back in rotation" in r.stdout, r.stdout + r.stderr
    assert api.server("hmk_nodes", "node-a")["admin_state"] & (hmk_haproxy.ADMF_FMAINT | hmk_haproxy.ADMF_FDRAIN) == 0
    # Left in drain: the same.
    api.set_state("hmk_nodes", "node-a", "drain")
    assert heal(ADMIN["socket"], "hmk_nodes", "node-a").returncode == 0
    assert api.server("hmk_nodes", "node-a")["admin_state"] == 0
    # A server this gateway does not have, and a gateway that does not answer.
    r = heal(ADMIN["socket"], "hmk_nodes", "node-z")
    assert r.returncode == 0 and "not a server of this gateway" in r.stdout
    r = heal(ADMIN["socket"] + ".absent", "hmk_nodes", "node-a")
    assert r.returncode == 1 and "admin socket" in r.stderr
    assert heal("only-two", "args").returncode == 2


def test_verify_names_the_held_servers_only():
    servers = {"a": {"admin_state": 0}, "b": {"admin_state": 1}, "c": {"admin_state": 8}, "d": {"admin_state": 4},
               "e": {"admin_state": 9}}
    # Forced maintenance or drain (the runtime API's holds); maintenance from the configuration (4) is not a hold.
    assert gateway_filter.gateway_held_servers(servers) == ["b", "c", "e"]
    assert gateway_filter.gateway_held_servers({}) == []
    with pytest.raises(Exception, match="gateway_held_servers"):
        gateway_filter.gateway_held_servers(["a"])
