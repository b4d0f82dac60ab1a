"""Node doors in the gateway's plan (issue 27): which nodes are reached over TLS with their own client certificate,
which names both sides pin, and why no shared key goes to a group with doors."""
import pytest

from ansible_collections.hmk.moe_kit.plugins.filter import gateway as g
from ansible_collections.hmk.moe_kit.plugins.filter import inference_service as svc
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_door import door_names, door_stale_client_files

KEY_A = "key-of-node-a-0123456789abcdef"
KEY_B = "key-of-node-b-0123456789abcdef"


def door(host, port=8080, **extra):
    return dict({"inference_service_door": True, "inference_service_host": host, "inference_service_port": port}, **extra)


def test_a_door_node_gets_its_own_certificate_names_and_a_plain_node_none():
    got = g.gateway_servers([door("10.0.0.11"), {"inference_service_host": "10.0.0.12"}], ["Node_A.lab", "node-b"], "gw")
    assert got[0] == {"name": "Node_A.lab", "address": "10.0.0.11", "port": 8080, "slots": 1, "door": True,
                      "door_server": "hmk-door-node-a-lab", "door_client": "hmk-gateway-to-node-a-lab",
                      "door_slug": "node-a-lab"}
    # Without a door the server line is exactly what it was before doors existed.
    assert got[1] == {"name": "node-b", "address": "10.0.0.12", "port": 8080, "slots": 1}


def test_node_and_gateway_agree_on_the_names():
    assert svc.FilterModule().filters()["inference_service_door_names"]("epyc-01") == door_names("epyc-01") == {
        "slug": "epyc-01", "server": "hmk-door-epyc-01", "client": "hmk-gateway-to-epyc-01",
        "monitor": "hmk-monitoring-to-epyc-01"}


@pytest.mark.parametrize("value,is_door", [(True, True), ("true", True), ("yes", True), (False, False), ("false", False),
                                           ("no", False), (None, False)])
def test_the_door_flag_reads_inventory_spellings(value, is_door):
    got = g.gateway_servers([{"inference_service_door": value, "inference_service_host": "10.0.0.11"}], ["n"], "gw")
    assert got[0].get("door", False) is is_door


@pytest.mark.parametrize("nodes,names,message", [
    ([door("10.0.0.11", inference_service_engine="ktransformers")], ["kt"], "set inference_service_door: false on kt"),
    ([door("10.0.0.11"), door("10.0.0.12")], ["node.a", "node_a"], "fold to the same door certificate name"),
    ([door("10.0.0.11")], ["---"], "gives no certificate name"),
    ([door("10.0.0.11")], ["n" * 49], "too long"),
    # "CA" folds to ca: its client certificate would be doors/ca.pem, over the door CA's file on the gateway.
    ([door("10.0.0.11")], ["CA"], "the door CA's own file name"),
])
def test_bad_doors_are_refused_at_plan_time(nodes, names, message):
    with pytest.raises(g.AnsibleFilterError, match=message):
        g.gateway_servers(nodes, names, "gw")


def test_doors_with_their_own_keys_get_no_shared_key():
    nodes = [door("10.0.0.11", inference_service_api_key=KEY_A), door("10.0.0.12", inference_service_api_key=KEY_B)]
    assert g.gateway_backend_key(nodes, ["a", "b"]) == ""


def test_doors_beside_keyless_nodes_are_fine():
    nodes = [door("10.0.0.11", inference_service_api_key=KEY_A), {"inference_service_host": "127.0.0.1"}]
    assert g.gateway_backend_key(nodes, ["a", "local"]) == ""


def test_a_keyed_node_without_door_beside_doors_is_refused_without_showing_a_key():
    nodes = [door("10.0.0.11", inference_service_api_key=KEY_A), {"inference_service_api_key": KEY_B}]
    with pytest.raises(g.AnsibleFilterError, match="Set inference_service_door: true on them too") as err:
        g.gateway_backend_key(nodes, ["a", "b"])
    assert KEY_A not in str(err.value) and KEY_B not in str(err.value)
    assert "b, which require" in str(err.value)


def test_without_doors_the_shared_key_rule_is_unchanged():
    nodes = [{"inference_service_api_key": KEY_A}, {"inference_service_api_key": KEY_A}]
    assert g.gateway_backend_key(nodes, ["a", "b"]) == KEY_A
    with pytest.raises(g.AnsibleFilterError, match="must share one"):
        g.gateway_backend_key([{"inference_service_api_key": KEY_A}, {"inference_service_api_key": KEY_B}], ["a", "b"])


def test_prometheus_scrapes_a_door_over_tls_with_its_own_certificate_and_no_key_file():
    from ansible_collections.hmk.moe_kit.plugins.filter import monitoring as mon
    configs = mon.scrape_configs([
        {"name": "Door_A", "address": "10.0.0.5", "node_exporter_port": 9100, "engine_port": 8080, "engine_key": True,
         "door": True, "door_monitoring": True},
        {"name": "plain", "address": "10.0.0.6", "node_exporter_port": 9100, "engine_port": 8080, "engine_key": True}],
        "5s", "/etc/prometheus/hmk")
    by_job = {c["job_name"]: c for c in configs}
    door_job = by_job["hmk_engine_Door_A"]
    assert door_job["scheme"] == "https" and "authorization" not in door_job
    assert door_job["tls_config"] == {"ca_file": "/etc/prometheus/hmk/doors/ca.pem",
                                      "cert_file": "/etc/prometheus/hmk/doors/door-a.pem",
                                      "key_file": "/etc/prometheus/hmk/doors/door-a.key",
                                      "server_name": "hmk-door-door-a", "insecure_skip_verify": False}
    # A node without a door is scraped as before.
    assert "scheme" not in by_job["hmk_engine_plain"] and "tls_config" not in by_job["hmk_engine_plain"]
    assert by_job["hmk_engine_plain"]["authorization"]["credentials_file"] == "/etc/prometheus/hmk/plain.api-key"


def test_a_door_that_does_not_let_prometheus_in_is_refused_with_what_to_set():
    from ansible_collections.hmk.moe_kit.plugins.filter import monitoring as mon
    with pytest.raises(Exception, match="set inference_service_door_monitoring: true on a"):
        mon.scrape_configs([{"name": "a", "address": "10.0.0.5", "node_exporter_port": 9100, "engine_port": 8080,
                             "door": True}])


def test_only_the_kit_s_certificates_of_nodes_that_left_are_chosen_for_removal():
    servers = g.gateway_servers([door("10.0.0.11"), {"inference_service_host": "10.0.0.12"}], ["Node_A.lab", "plain"], "gw")
    found = [{"path": "/etc/haproxy/hmk/doors/" + name} for name in (
        "ca.pem", "node-a-lab.pem",                      # the CA and the current door node: kept
        "node-b.pem", "plain.pem", "x--y.pem", "9.pem",  # a node that left, one that lost its door, odd but kit names
        "Node-B.pem", "-b.pem", "b-.pem", "a_b.pem",     # not a slug (case, edges, '_'): not the kit's
        "node-b.pem.bak", "node-b.key", "notes.txt", "n" * 49 + ".pem")]
    assert g.gateway_door_stale_files(found, servers) == ["9.pem", "node-b.pem", "plain.pem", "x--y.pem"]
    # Nothing stale, or nothing there: nothing to remove (the task loops over nothing, a re-run changes nothing).
    assert g.gateway_door_stale_files(found[:2], servers) == []
    assert g.gateway_door_stale_files([], servers) == []


def test_with_no_door_node_left_every_client_certificate_goes_and_the_ca_stays():
    plain = g.gateway_servers([{"inference_service_host": "10.0.0.12"}], ["node-a"], "gw")
    assert g.gateway_door_stale_files(["/d/ca.pem", "/d/node-a.pem", "/d/node-b.pem"], plain) == ["node-a.pem", "node-b.pem"]
    assert door_stale_client_files(["node-a.pem", "ca.pem"], ["node-a"]) == []
    with pytest.raises(g.AnsibleFilterError, match="gateway_door_stale_files"):
        g.gateway_door_stale_files([], {"node-a": {}})
