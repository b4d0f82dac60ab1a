"""The gateway role's filters: backend servers from the nodes' inventory, the shared node key, the client maps."""
import hashlib

import pytest

from ansible_collections.hmk.moe_kit.plugins.filter import gateway as g


def test_servers_follow_each_nodes_service():
    nodes = [
        {"inference_service_host": "10.0.0.11", "inference_service_port": 8080, "inference_service_parallel": 4},
        {"inference_service_host": "0.0.0.0", "ansible_host": "10.0.0.12"},
        {"gateway_node_address": "node-c.internal", "gateway_node_port": "9000", "gateway_node_slots": 2},
        {},
    ]
    got = g.gateway_servers(nodes, ["node-a", "node-b", "node-c", "node-d"])
    assert got == [
        {"name": "node-a", "address": "10.0.0.11", "port": 8080, "slots": 4},
        # A wildcard bind is not an address to connect to: the inventory's address is.
        {"name": "node-b", "address": "10.0.0.12", "port": 8080, "slots": 1},
        {"name": "node-c", "address": "node-c.internal", "port": 9000, "slots": 2},
        # The service's defaults: loopback, 8080, the engine's one slot.
        {"name": "node-d", "address": "127.0.0.1", "port": 8080, "slots": 1},
    ]


@pytest.mark.parametrize("nodes,names,message", [
    ([], [], "no hosts"),
    ([{}], ["bad name"], "cannot name an HAProxy server"),
    ([{"inference_service_port": 0}], ["a"], "out of range"),
    ([{"inference_service_port": "http"}], ["a"], "not a number"),
    ([{"gateway_node_slots": 0}], ["a"], "at least 1"),
    ([{"inference_service_port": 18593}, {"inference_service_port": 18593}], ["a", "b"], "already serves"),
])
def test_servers_refuse_bad_input(nodes, names, message):
    with pytest.raises(g.AnsibleFilterError, match=message):
        g.gateway_servers(nodes, names)


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
])
def test_clients_refuse_bad_input(clients, message):
    with pytest.raises(g.AnsibleFilterError, match=message):
        g.gateway_clients_checked(clients, 60)
