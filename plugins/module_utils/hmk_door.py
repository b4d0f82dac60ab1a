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
    # The gateway keeps each door's client certificate as <slug>.pem beside the door CA's ca.pem (as does Prometheus'
    # host): a node named "ca" would overwrite the CA file that every door connection is verified with.
    if slug + ".pem" == DOOR_CA_FILE:
        raise ValueError("inventory name %r gives the certificate name %r, the door CA's own file name on the gateway: "
                         "give the node another inventory name" % (name, slug))
    # A DNS label is at most 63 characters; the longest prefix is 14.
    if len(slug) > 48:
        raise ValueError("inventory name %r is too long for a door certificate name (48 characters at most)" % name)
    return {"slug": slug, "server": "hmk-door-" + slug, "client": "hmk-gateway-to-" + slug,
            "monitor": "hmk-monitoring-to-" + slug}


# The files kept per door node beside the door CA's ca.pem: <slug>.pem on the gateway (the client certificate with its
# key), <slug>.pem and <slug>.key on Prometheus' host. A slug is 1 to 48 of [a-z0-9-], neither first nor last a '-'
# (door_names).
_SLUG_RE = r"[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?"
DOOR_CA_FILE = "ca.pem"


def door_stale_client_files(files, slugs, suffixes=(".pem",)):
    """The names among `files` (what a doors directory holds, names or paths) that are a door client file of the
    kit's naming (<slug><suffix>, for each of `suffixes`) and belong to none of `slugs` (the current door nodes): the
    certificate or key of a node that left the group, or no longer has a door. The CA's certificate and any file of
    another name (the operator's, a backup) are never chosen. Sorted, names only."""
    keep = set(str(s) for s in slugs or [])
    file_re = re.compile("(%s)(%s)" % (_SLUG_RE, "|".join(re.escape(str(x)) for x in suffixes)))
    stale = set()
    for entry in files or []:
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        match = file_re.fullmatch(name)
        if name == DOOR_CA_FILE or not match:
            continue
        if match.group(1) not in keep:
            stale.add(name)
    return sorted(stale)
