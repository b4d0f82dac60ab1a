# -*- coding: utf-8 -*-
"""The gateway role's inputs turned into what HAProxy reads, as plain functions with unit tests.

- gateway_servers: one backend server per serving node of the group, from the node's own inventory (the address
  and port its service listens on, its parallel slots), checked before anything is written;
- gateway_backend_key: the one API key the nodes share, which the gateway adds to every request it forwards (none
  when a node has a door: each door adds its own node's key);
- gateway_client_map / gateway_limit_map / gateway_concurrency_map: the client keys, stored only as sha256, each
  client's request rate and how many of its requests may be in progress at once.

tests/unit/test_gateway.py imports this file directly.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import ipaddress
import re

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_door import door_names, door_stale_client_files
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_haproxy import ADMF_FDRAIN, ADMF_FMAINT

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError

# HAProxy's identifiers (proxy and server names) take letters, digits, '-', '_', '.' and ':'.
NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
CLIENT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
WILDCARD = ("0.0.0.0", "::", "")
# The engine's default parallel slots at the pinned ik_llama.cpp (common.h: n_parallel = 1).
ENGINE_DEFAULT_SLOTS = 1
MIN_KEY_LENGTH = 16


def _fail(msg):
    raise AnsibleFilterError(msg)


def _get(node, key, default=None):
    value = node.get(key) if hasattr(node, "get") else None
    return default if value is None else value


def _loopback(address):
    """Whether an address is loopback (127.0.0.0/8, ::1, or the name localhost)."""
    if address.lower().rstrip(".") in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def gateway_servers(nodes, names, gateway=None, shared_loopback=False):
    """Backend servers for HAProxy, one per node, in inventory order.

    nodes: each node's variables (hostvars[name]), names: the inventory names in the same order.
    gateway: the inventory name of the gateway host; shared_loopback: the nodes share the gateway's loopback (one
    network namespace: a lab's twins on loopback addresses). A node whose address is loopback is refused unless it is
    the gateway host itself or shared_loopback is set: on another machine, the gateway would balance to its own
    loopback and hand prompts and the node key to whatever listens there.
    address: gateway_node_address, else the address the service binds (inference_service_host) unless it is a
    wildcard, else ansible_host, else the name. port: gateway_node_port, else inference_service_port, else 8080.
    slots (HAProxy maxconn per server): gateway_node_slots, else inference_service_parallel when set, else the
    engine's default (1): HAProxy queues what the node cannot start at once, so the next free slot of any node
    takes it.
    door: the node serves through its door (inference_service_door: TLS with a client certificate, the node's own key
    added there); door_server is the name its certificate carries, door_client the CN of the client certificate the
    gateway presents to it, door_slug names the files of that certificate.
    """
    nodes, names = list(nodes or []), list(names or [])
    if len(nodes) != len(names):
        _fail("gateway_servers: %d node variable sets for %d names" % (len(nodes), len(names)))
    if not names:
        _fail("The gateway's backend group has no hosts: nothing to balance over")
    servers, seen, slugs = [], set(), {}
    for name, node in zip(names, nodes):
        if not NAME_RE.match(name):
            _fail("Inventory name %r cannot name an HAProxy server (letters, digits, - _ . : only)" % name)
        bind = str(_get(node, "inference_service_host", "127.0.0.1"))
        address = _get(node, "gateway_node_address")
        if address is None:
            address = bind if bind not in WILDCARD else _get(node, "ansible_host", name)
        address = str(address)
        if not address or any(c in address for c in " \t\n#"):
            _fail("%s: gateway_node_address %r is not an address" % (name, address))
        if _loopback(address) and name != gateway and not shared_loopback:
            source = "gateway_node_address" if _get(node, "gateway_node_address") is not None else \
                "inference_service_host"
            _fail("%s serves on %s (%s), a loopback address: the gateway %s would reach its own loopback, not %s. "
                  "Set inference_service_host on %s to the node's own address that the gateway reaches, with "
                  "inference_service_allowed_networks: [<the gateway's address>/32] so that only the gateway may "
                  "reach it (KTransformers too: it then carries no key and relies on that allow-list); or, when the "
                  "nodes share the gateway's loopback (one machine or network namespace), set "
                  "gateway_nodes_share_loopback: true" % (name, address, source, gateway or "(another host)", name,
                                                          name))
        port = _get(node, "gateway_node_port", _get(node, "inference_service_port", 8080))
        try:
            port = int(port)
        except (TypeError, ValueError):
            _fail("%s: port %r is not a number" % (name, port))
        if not 0 < port < 65536:
            _fail("%s: port %d is out of range" % (name, port))
        slots = _get(node, "gateway_node_slots")
        if slots is None:
            parallel = int(_get(node, "inference_service_parallel", 0) or 0)
            slots = parallel if parallel > 0 else ENGINE_DEFAULT_SLOTS
        slots = int(slots)
        if slots < 1:
            _fail("%s: gateway_node_slots must be at least 1, got %d" % (name, slots))
        if (address, port) in seen:
            _fail("%s: another node of the group already serves on %s:%d" % (name, address, port))
        seen.add((address, port))
        server = {"name": name, "address": address, "port": port, "slots": slots}
        if _door(node):
            if str(_get(node, "inference_service_engine", "ik_llama.cpp")) == "ktransformers":
                _fail("%s: inference_service_door is for the llama.cpp engines (ik_llama.cpp, llama.cpp); a "
                      "KTransformers node stays on 127.0.0.1 or on its own address with inference_service_allowed_networks "
                      "naming the gateway: set inference_service_door: false on %s" % (name, name))
            try:
                names_of = door_names(name)
            except ValueError as exc:
                _fail("%s: %s" % (name, exc))
            if names_of["slug"] in slugs:
                _fail("%s and %s fold to the same door certificate name %s: rename one in the inventory"
                      % (slugs[names_of["slug"]], name, names_of["server"]))
            slugs[names_of["slug"]] = name
            server.update({"door": True, "door_server": names_of["server"], "door_client": names_of["client"],
                           "door_slug": names_of["slug"]})
        servers.append(server)
    return servers


def _door(node):
    value = _get(node, "inference_service_door", False)
    if isinstance(value, str):
        value = value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def gateway_backend_key(nodes, names):
    """The API key every node of the group requires (inference_service_api_key), '' when none does.

    The gateway adds one key to every forwarded request, so the nodes must share it. A node with a door
    (inference_service_door) adds its own key itself: the gateway then sends no key at all (HAProxy sets a header
    before it picks the server, so one backend cannot send a key to some nodes only), and a node without a door
    that requires a key is refused beside it. The message names the nodes, never a key."""
    keys, doors = {}, []
    for name, node in zip(list(names or []), list(nodes or [])):
        if _door(node):
            doors.append(name)
            continue
        keys.setdefault(str(_get(node, "inference_service_api_key", "") or ""), []).append(name)
    if doors:
        keyed = sorted(n for key, group in keys.items() if key for n in group)
        if keyed:
            _fail("%s serve through a door, which adds each node's own key: the gateway sends no shared key, so "
                  "%s, which require an inference_service_api_key without a door, would refuse every request. Set "
                  "inference_service_door: true on them too (each keeps its own key)"
                  % (", ".join(sorted(doors)), ", ".join(keyed)))
        return ""
    if len(keys) > 1:
        groups = sorted(sorted(v) for v in keys.values())
        _fail("The nodes behind one gateway must share one inference_service_api_key; these groups of nodes "
              "have different keys: %s" % "; ".join(", ".join(g) for g in groups))
    key = next(iter(keys), "")
    if any(c in key for c in " \t\r\n\"'\\"):
        _fail("inference_service_api_key may not contain spaces, quotes or backslashes (it goes into a header)")
    return key


def _client_hash(client):
    name = client.get("name", "?")
    key, digest = client.get("key"), client.get("key_sha256")
    if (key is None) == (digest is None):
        _fail("gateway client %s: give exactly one of key (kept in a vault) or key_sha256" % name)
    if key is not None:
        key = str(key)
        if len(key) < MIN_KEY_LENGTH:
            _fail("gateway client %s: the key is shorter than %d characters" % (name, MIN_KEY_LENGTH))
        if any(c.isspace() for c in key):
            _fail("gateway client %s: the key contains whitespace" % name)
        return hashlib.sha256(key.encode("utf-8")).hexdigest()
    digest = str(digest).lower()
    if not SHA256_RE.match(digest):
        _fail("gateway client %s: key_sha256 must be 64 hexadecimal digits" % name)
    return digest


def _positive(name, field, value):
    if isinstance(value, bool):
        _fail("gateway client %s: %s %r is not a number" % (name, field, value))
    try:
        value = int(value)
    except (TypeError, ValueError):
        _fail("gateway client %s: %s %r is not a number" % (name, field, value))
    if value < 1:
        _fail("gateway client %s: %s must be at least 1" % (name, field))
    return value


def gateway_clients_checked(clients, default_rate, default_concurrency=16):
    """Checks the client list; returns [{name, sha256, requests_per_minute, concurrent_requests}] in order."""
    if not clients:
        _fail("gateway_clients is empty: no client could use the gateway")
    out, names, hashes = [], set(), set()
    for client in clients:
        if not hasattr(client, "get"):
            _fail("gateway_clients entries are mappings with name and key or key_sha256")
        name = str(client.get("name", ""))
        if not CLIENT_RE.match(name):
            _fail("gateway client name %r: 1-64 letters, digits, '-', '_' or '.'" % name)
        if name in names:
            _fail("gateway client %s is listed twice" % name)
        digest = _client_hash(client)
        if digest in hashes:
            _fail("gateway client %s has the same key as another client" % name)
        rate = _positive(name, "requests_per_minute", client.get("requests_per_minute", default_rate))
        concurrency = _positive(name, "concurrent_requests", client.get("concurrent_requests", default_concurrency))
        names.add(name)
        hashes.add(digest)
        out.append({"name": name, "sha256": digest, "requests_per_minute": rate, "concurrent_requests": concurrency})
    return out


def gateway_client_map(clients, default_rate):
    """HAProxy map: sha256 of the key (lower-case hex) -> client name."""
    return "".join("%s %s\n" % (c["sha256"], c["name"]) for c in gateway_clients_checked(clients, default_rate))


def gateway_limit_map(clients, default_rate):
    """HAProxy map: client name -> requests per minute."""
    return "".join("%s %d\n" % (c["name"], c["requests_per_minute"])
                   for c in gateway_clients_checked(clients, default_rate))


def gateway_concurrency_map(clients, default_rate, default_concurrency):
    """HAProxy map: client name -> requests in progress at once."""
    return "".join("%s %d\n" % (c["name"], c["concurrent_requests"])
                   for c in gateway_clients_checked(clients, default_rate, default_concurrency))


def gateway_held_servers(servers):
    """Names of the servers held out of rotation by the runtime API (forced maintenance or drain), from
    hmk_haproxy_server's `servers` answer; maintenance from the configuration or DNS is not a hold."""
    if not isinstance(servers, dict):
        _fail("gateway_held_servers: expected the servers mapping of hmk_haproxy_server, got %s" % type(servers).__name__)
    return sorted(name for name, srv in servers.items()
                  if isinstance(srv, dict) and int(srv.get("admin_state", 0)) & (ADMF_FMAINT | ADMF_FDRAIN))


def gateway_door_stale_files(files, servers):
    """Names of the door client certificates in a gateway's doors directory (`files`, the paths ansible.builtin.find
    gives) that belong to no door node of `servers` (gateway_servers' plan): <slug>.pem files of nodes that left the
    group or lost their door. The CA's certificate and files of any other name are never chosen."""
    if not isinstance(servers, list):
        _fail("gateway_door_stale_files: expected the servers list of gateway_servers, got %s" % type(servers).__name__)
    paths = [f.get("path", "") if isinstance(f, dict) else f for f in files or []]
    return door_stale_client_files(paths, [s["door_slug"] for s in servers if isinstance(s, dict) and s.get("door")])


class FilterModule(object):
    """Filters of the gateway role."""

    def filters(self):
        return {
            "gateway_held_servers": gateway_held_servers,
            "gateway_door_stale_files": gateway_door_stale_files,
            "gateway_servers": gateway_servers,
            "gateway_backend_key": gateway_backend_key,
            "gateway_clients_checked": gateway_clients_checked,
            "gateway_client_map": gateway_client_map,
            "gateway_limit_map": gateway_limit_map,
            "gateway_concurrency_map": gateway_concurrency_map,
        }
