# -*- coding: utf-8 -*-
"""HAProxy's runtime API over its local admin socket: the server states, the commands that change them.

One reader of `show servers state` and `show stat` for the kit: the hmk_haproxy_server module (the gateway's
drain, maintenance and ready steps) and the gateway's self-heal script (roles/gateway/files/hmk-gateway-heal, which
gets this file next to it on the gateway) both import it. Standard library only.
"""
import csv
import socket
import time

# srv_admin_state bits (HAProxy's SRV_ADMF_*): maintenance forced by the CLI, inherited from a tracked server,
# set by the configuration ("disabled"), by DNS resolution; drain forced by the CLI or inherited.
ADMF_FMAINT = 0x01
ADMF_IMAINT = 0x02
ADMF_CMAINT = 0x04
ADMF_FDRAIN = 0x08
ADMF_IDRAIN = 0x10
ADMF_RMAINT = 0x20
ADMF_MAINT = ADMF_FMAINT | ADMF_IMAINT | ADMF_CMAINT | ADMF_RMAINT
ADMF_DRAIN = ADMF_FDRAIN | ADMF_IDRAIN
OP_STATES = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}


class RuntimeApiError(Exception):
    pass


def parse_servers_state(text, backend):
    """`show servers state <backend>` (format 1) as {server: {admin_state, op_state}}.

    The first line is the format version, the second the field names after '# '."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].strip() != "1":
        raise RuntimeApiError("unexpected answer to 'show servers state %s': %s" % (backend, text.strip()[:300]))
    header, servers = None, {}
    for line in lines[1:]:
        if line.startswith("#"):
            header = line.lstrip("# ").split()
            continue
        fields = line.split()
        if header is None or len(fields) < len(header):
            continue
        row = dict(zip(header, fields))
        if row.get("be_name") == backend:
            op = int(row["srv_op_state"])
            servers[row["srv_name"]] = {"admin_state": int(row["srv_admin_state"]), "op_state": OP_STATES.get(op, op)}
    return servers


def parse_stat(text, backend):
    """The backend's server rows of `show stat` (CSV, header line starting with '# ') as {server: {...}}."""
    servers = {}
    for row in csv.DictReader(text.lstrip("# ").splitlines()):
        if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND"):
            servers[row["svname"]] = {"status": row["status"], "scur": int(row["scur"] or 0),
                                      "qcur": int(row["qcur"] or 0), "check_status": row.get("check_status", ""),
                                      "check_desc": row.get("check_desc", "")}
    return servers


def is_up(stat):
    """UP after a passing check; 'no check' when the server has no health check at all."""
    return stat["status"] in ("UP", "no check")


def wanted_change(state, admin_state):
    """Whether the admin state must change to reach `state` (ready / drain / maint)."""
    if state == "ready":
        return bool(admin_state & (ADMF_FMAINT | ADMF_FDRAIN))
    if state == "drain":
        return not admin_state & ADMF_FDRAIN or bool(admin_state & ADMF_FMAINT)
    return not admin_state & ADMF_FMAINT


def restore_command(backend, server, admin_state):
    """The CLI command that puts a server back to the admin state it had (the forced bits only)."""
    if admin_state & ADMF_FMAINT:
        return "set server %s/%s state maint" % (backend, server)
    if admin_state & ADMF_FDRAIN:
        return "set server %s/%s state drain" % (backend, server)
    return "set server %s/%s state ready" % (backend, server)


class RuntimeApi(object):
    def __init__(self, path, timeout=10.0):
        self.path = path
        self.timeout = timeout

    def command(self, cmd):
        """One command per connection (the socket closes after answering in non-interactive mode)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
            sock.sendall((cmd + "\n").encode())
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (OSError, socket.timeout) as exc:
            raise RuntimeApiError("HAProxy's admin socket %s: %s (command: %s)" % (self.path, exc, cmd))
        finally:
            sock.close()
        return b"".join(chunks).decode("utf-8", "replace")

    def set_state(self, backend, server, state):
        answer = self.command("set server %s/%s state %s" % (backend, server, state)).strip()
        # Success is an empty answer; errors are one line ("No such server.", "Permission denied"...).
        if answer:
            raise RuntimeApiError("set server %s/%s state %s: %s" % (backend, server, state, answer))

    def servers(self, backend):
        """Every server of the backend: admin and operational state, status, requests in progress and queued."""
        admin = parse_servers_state(self.command("show servers state %s" % backend), backend)
        stat = parse_stat(self.command("show stat"), backend)
        return {name: dict(admin[name], **stat[name]) for name in admin if name in stat}

    def server(self, backend, server):
        return self.servers(backend).get(server)


def wait_for(api, backend, server, done, timeout, interval):
    """Polls until done(server) holds; returns (ok, last server, seconds waited)."""
    start = time.monotonic()
    current = api.server(backend, server)
    while not done(current):
        if time.monotonic() - start >= timeout:
            return False, current, time.monotonic() - start
        time.sleep(interval)
        current = api.server(backend, server)
    return True, current, time.monotonic() - start


def in_rotation(srv):
    return is_up(srv) and not srv["admin_state"] & (ADMF_MAINT | ADMF_DRAIN)


def idle(srv):
    return srv["scur"] == 0 and srv["qcur"] == 0
