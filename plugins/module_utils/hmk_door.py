# -*- coding: utf-8 -*-
"""The names of a node door's certificates, shared by the node's role (inference_service: the door's own
certificate and the one client it lets in) and the gateway (the server name it verifies, the client certificate it
presents). One function, so both sides always agree on what a node's door pins."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# A certificate name is a DNS label: the inventory name folded to lower-case letters, digits and '-'.
_FOLD_RE = re.compile(r"[^a-z0-9-]+")


def door_names(name):
    """{slug, server, client, monitor} for the node `name`: the door's certificate names hmk-door-<slug> (the gateway
    checks it with verifyhost), and the door lets in only a client certificate whose CN is hmk-gateway-to-<slug> (the
    gateway's connection) or, for /metrics only, hmk-monitoring-to-<slug> (Prometheus'): a certificate issued for
    another node's connection opens no other door."""
    name = str(name or "")
    slug = _FOLD_RE.sub("-", name.lower()).strip("-")
    if not slug:
        raise ValueError("inventory name %r gives no certificate name (letters or digits needed)" % name)
    # A DNS label is at most 63 characters; the longest prefix is 14.
    if len(slug) > 48:
        raise ValueError("inventory name %r is too long for a door certificate name (48 characters at most)" % name)
    return {"slug": slug, "server": "hmk-door-" + slug, "client": "hmk-gateway-to-" + slug,
            "monitor": "hmk-monitoring-to-" + slug}
