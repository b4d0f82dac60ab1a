"""The gateway role's filters: backend servers from the nodes' inventory, the shared node key, the client maps."""
import hashlib
from pathlib import Path

import pytest

from ansible_collections.hmk.moe_kit.plugins.filter import gateway as g


def test_servers_follow_each_nodes_service():
    nodes = [
        {"inference_service_host": "10.0.0.11", "inference_service_port": 8080, "inference_service_parallel": 4},
        {"inference_service_host": "0.0.0.0", "ansible_host": "10.0.0.12"},
        {"gateway_node_address": "node-c.internal", "gateway_node_port": "9000", "gateway_node_slots": 2},
        {},
    ]
    # node-d is the gateway host itself: its loopback is the gateway's.
    got = g.gateway_servers(nodes, ["node-a", "node-b", "node-c", "node-d"], "node-d")
    assert got == [
        {"name": "node-a", "address": "10.0.0.11", "port": 8080, "slots": 4},
        # A wildcard bind is not an address to connect to: the inventory's address is.
        {"name": "node-b", "address": "10.0.0.12", "port": 8080, "slots": 1},
        {"name": "node-c", "address": "node-c.internal", "port": 9000, "slots": 2},
        # The service's defaults: loopback (the gateway's own host), 8080, the engine's one slot.
        {"name": "node-d", "address": "127.0.0.1", "port": 8080, "slots": 1},
    ]


@pytest.mark.parametrize("nodes,names,message", [
    ([], [], "no hosts"),
    ([{}], ["bad name"], "cannot name an HAProxy server"),
    ([{"inference_service_port": 0}], ["a"], "out of range"),
    ([{"inference_service_port": "http"}], ["a"], "not a number"),
    ([{"gateway_node_slots": 0}], ["a"], "at least 1"),
    ([{"inference_service_host": "10.0.0.1", "inference_service_port": 18593},
      {"inference_service_host": "10.0.0.1", "inference_service_port": 18593}], ["a", "b"], "already serves"),
])
def test_servers_refuse_bad_input(nodes, names, message):
    with pytest.raises(g.AnsibleFilterError, match=message):
        g.gateway_servers(nodes, names, "gw", True)


@pytest.mark.parametrize("node,source", [
    ({}, "inference_service_host"),
    ({"inference_service_host": "127.0.0.1"}, "inference_service_host"),
    ({"inference_service_host": "127.0.0.3"}, "inference_service_host"),
    ({"inference_service_host": "::1"}, "inference_service_host"),
    ({"inference_service_host": "0.0.0.0", "ansible_host": "127.0.0.1"}, "inference_service_host"),
    ({"gateway_node_address": "localhost"}, "gateway_node_address"),
    ({"inference_service_engine": "ktransformers", "inference_service_host": "127.0.0.1"}, "inference_service_host"),
])
def test_a_loopback_node_behind_another_host_is_refused_with_what_to_set(node, source):
    with pytest.raises(g.AnsibleFilterError) as err:
        g.gateway_servers([{"inference_service_host": "10.0.0.11"}, node], ["node-a", "node-b"], "gateway-1")
    message = str(err.value)
    assert message.startswith("node-b serves on ") and "(%s), a loopback address" % source in message
    assert "Set inference_service_host on node-b" in message and "inference_service_allowed_networks" in message
    assert "gateway_nodes_share_loopback" in message and "already serves" not in message


def test_loopback_nodes_pass_on_their_own_addresses_when_they_share_the_gateways_loopback():
    nodes = [{"inference_service_host": "127.0.0.2", "inference_service_port": 18593},
             {"inference_service_host": "127.0.0.3", "inference_service_port": 18593}]
    got = g.gateway_servers(nodes, ["a", "b"], "gw", True)
    assert [(s["address"], s["port"]) for s in got] == [("127.0.0.2", 18593), ("127.0.0.3", 18593)]


def test_the_example_inventory_plans_a_gateway(tmp_path):
    """inventories/production as shipped: the gateway's plan passes (it once failed with a misleading duplicate)."""
    import json
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(root / ".collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    # Not the repository's ansible.cfg (make exports ANSIBLE_CONFIG): its timing callbacks print to stdout too.
    env.pop("ANSIBLE_CONFIG", None)
    expr = ("{{ groups['inference_nodes'] | map('extract', hostvars) | hmk.moe_kit.gateway_servers("
            "groups['inference_nodes'], 'gateway-1', hostvars['gateway-1']['gateway_nodes_share_loopback'] "
            "| default(false)) | to_json }}")
    out = subprocess.run([str(Path(sys.executable).with_name("ansible")), "-i", str(root / "inventories/production"),
                          "gateway-1", "-c", "local", "-m", "ansible.builtin.debug", "-a", "msg=" + expr],
                         env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path), check=False)
    result = json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["gateway-1"]
    assert not result.get("failed"), result.get("msg")
    got = json.loads(result["msg"]) if isinstance(result["msg"], str) else result["msg"]
    assert [(s["name"], s["address"]) for s in got] == [
        ("epyc-node", "192.0.2.10"), ("epyc-genoa-5090", "192.0.2.11"), ("epyc-milan-01", "192.0.2.20")]


def test_backend_key_is_shared_or_refused_without_showing_it():
    assert g.gateway_backend_key([{"inference_service_api_key": "k" * 20}] * 2, ["a", "b"]) == "k" * 20
    assert g.gateway_backend_key([{}, {"inference_service_api_key": ""}], ["a", "b"]) == ""
    with pytest.raises(g.AnsibleFilterError) as err:
        g.gateway_backend_key([{"inference_service_api_key": "secret-one-123456"},
                               {"inference_service_api_key": "secret-two-123456"}, {}], ["a", "b", "c"])
    assert "a; b; c" in str(err.value) and "secret" not in str(err.value)
    with pytest.raises(g.AnsibleFilterError, match="quotes"):
        g.gateway_backend_key([{"inference_service_api_key": 'ab"cd'}], ["a"])


def test_client_map_holds_hashes_and_names_only():
    key = "alice-key-0123456789"
    digest = hashlib.sha256(b"bob-key-0123456789ab").hexdigest()
    clients = [{"name": "alice", "key": key}, {"name": "bob", "key_sha256": digest.upper(), "requests_per_minute": 5}]
    text = g.gateway_client_map(clients, 60)
    assert text == "%s alice\n%s bob\n" % (hashlib.sha256(key.encode()).hexdigest(), digest)
    assert key not in text
    assert g.gateway_limit_map(clients, 60) == "alice 60\nbob 5\n"
    clients[0]["concurrent_requests"] = 3
    assert g.gateway_concurrency_map(clients, 60, 16) == "alice 3\nbob 16\n"


@pytest.mark.parametrize("clients,message", [
    ([], "empty"),
    ([{"name": "a b", "key": "x" * 20}], "letters, digits"),
    ([{"name": "a", "key": "short"}], "shorter than 16"),
    ([{"name": "a", "key": "x" * 10 + " " + "y" * 10}], "whitespace"),
    ([{"name": "a"}], "exactly one of"),
    ([{"name": "a", "key": "x" * 20, "key_sha256": "0" * 64}], "exactly one of"),
    ([{"name": "a", "key_sha256": "xyz"}], "64 hexadecimal"),
    ([{"name": "a", "key": "x" * 20}, {"name": "a", "key": "y" * 20}], "listed twice"),
    ([{"name": "a", "key": "x" * 20}, {"name": "b", "key": "x" * 20}], "same key"),
    ([{"name": "a", "key": "x" * 20, "requests_per_minute": 0}], "at least 1"),
    ([{"name": "a", "key": "x" * 20, "requests_per_minute": True}], "not a number"),
    ([{"name": "a", "key": "x" * 20, "concurrent_requests": 0}], "concurrent_requests must be at least 1"),
    ([{"name": "a", "key": "x" * 20, "concurrent_requests": "many"}], "concurrent_requests 'many' is not a number"),
])
def test_clients_refuse_bad_input(clients, message):
    with pytest.raises(g.AnsibleFilterError, match=message):
        g.gateway_clients_checked(clients, 60)
