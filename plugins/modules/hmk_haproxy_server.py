#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_haproxy_server
short_description: Take one server of an HAProxy backend out of rotation after its requests end, or put it back
description:
  - Talks to HAProxy's runtime API over its local admin socket (C(stats socket ... level admin)) on the gateway.
  - C(state=maint) first sets the server to drain (no new requests; the ones it serves go on), waits until it
    serves and queues nothing (C(scur) and C(qcur) of C(show stat) are 0), then sets maintenance. When the
    requests have not ended within C(timeout), the server goes back to the admin state it had and the module fails.
  - C(state=drain) stops new requests and waits the same way, without maintenance.
  - C(state=ready) clears drain and maintenance and waits until a fresh health check has passed (status C(UP),
    not C(UP 1/2)) - HAProxy counts a server leaving maintenance as up before it has checked it.
  - A server whose health check fails can still be drained and put in maintenance (its status stays C(DOWN),
    which C(community.general.haproxy) waits on forever as if it were never drained).
  - Without O(state) it changes nothing and returns the backend's servers.
  - Supports check mode (reports what it would change; waits for nothing).
options:
  socket:
    description: Path of the admin socket on the gateway.
    type: path
    default: /run/haproxy/admin.sock
  backend:
    description: Backend (proxy) name.
    type: str
    required: true
  server:
    description: Server name in the backend; required with O(state).
    type: str
  state:
    description: Admin state wanted. Without it the module only reads and returns RV(servers).
    type: str
    choices: [ready, drain, maint]
  wait:
    description: Wait for the requests to end (drain, maint) or for a passing health check (ready).
    type: bool
    default: true
  timeout:
    description: Seconds to wait.
    type: int
    default: 900
  interval:
    description: Seconds between two looks at the server.
    type: float
    default: 1.0
  min_others_up:
    description: For drain and maint, the other servers of the backend that must be in rotation (UP, neither drained
      nor in maintenance) for the change to go ahead; otherwise the module fails before changing anything.
    type: int
    default: 0
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: Node-a serves nothing more through the gateway
  hmk.moe_kit.hmk_haproxy_server:
    backend: hmk_nodes
    server: node-a
    state: maint
    timeout: 900
  delegate_to: gateway-1
"""

RETURN = r"""
before:
  description: The server before the change (admin_state bits, op_state, status, scur, qcur, check_status).
  returned: with state
  type: dict
after:
  description: The server at the end.
  returned: with state
  type: dict
waited:
  description: Seconds spent waiting.
  returned: with state
  type: float
servers:
  description: Without state, every server of the backend (or the one named) with its admin_state, op_state, status,
    scur, qcur, check_status and check_desc.
  returned: without state
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_haproxy import (
    RuntimeApi, RuntimeApiError, idle, in_rotation, is_up, restore_command, wait_for, wanted_change)


def run(module, api):
    p = module.params
    backend, server, state = p["backend"], p["server"], p["state"]
    if state is None:
        servers = api.servers(backend)
        if server is not None:
            servers = {k: v for k, v in servers.items() if k == server}
        module.exit_json(changed=False, servers=servers)
    if server is None:
        module.fail_json(msg="server is required with state")
    before = api.server(backend, server)
    if before is None:
        module.fail_json(msg="HAProxy (%s) has no server %s in backend %s" % (p["socket"], server, backend))
    changed = wanted_change(state, before["admin_state"])
    if state in ("drain", "maint") and changed and p["min_others_up"] > 0:
        others = {k: v for k, v in api.servers(backend).items() if k != server}
        up = sorted(k for k, v in others.items() if in_rotation(v))
        if len(up) < p["min_others_up"]:
            module.fail_json(msg="Taking %s out of %s would leave %d other server(s) in rotation (%s), fewer than %d; "
                                 "nothing was changed. The others: %s" % (
                                     server, backend, len(up), ", ".join(up) or "none", p["min_others_up"],
                                     ", ".join("%s %s" % (k, v["status"]) for k, v in sorted(others.items())) or "none"),
                             before=before)
    result = {"changed": changed, "before": before, "after": before, "waited": 0.0}
    if module.check_mode:
        module.exit_json(**result)

    waited = 0.0
    if state in ("drain", "maint") and changed:
        api.set_state(backend, server, "drain")
        if p["wait"]:
            ok, current, waited = wait_for(api, backend, server, idle, p["timeout"], p["interval"])
            if not ok:
                api.command(restore_command(backend, server, before["admin_state"]))
                module.fail_json(msg="%s/%s still had %d request(s) in progress and %d queued after %ds; it was "
                                     "put back in its previous state" % (backend, server, current["scur"],
                                                                         current["qcur"], p["timeout"]),
                                 before=before, after=api.server(backend, server), waited=waited)
        if state == "maint":
            api.set_state(backend, server, "maint")
    elif state == "ready":
        if changed:
            api.set_state(backend, server, "ready")
        if p["wait"]:
            ok, current, waited = wait_for(api, backend, server, is_up, p["timeout"], p["interval"])
            if not ok:
                module.fail_json(msg="%s/%s is not UP after %ds: status %s, last check %s %s" % (
                    backend, server, p["timeout"], current["status"], current["check_status"],
                    current["check_desc"]), before=before, after=current, waited=waited)
    result.update(after=api.server(backend, server), waited=round(waited, 1))
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
            backend=dict(type="str", required=True),
            server=dict(type="str"),
            state=dict(type="str", choices=["ready", "drain", "maint"]),
            wait=dict(type="bool", default=True),
            timeout=dict(type="int", default=900),
            interval=dict(type="float", default=1.0),
            min_others_up=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    try:
        run(module, RuntimeApi(module.params["socket"]))
    except RuntimeApiError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
