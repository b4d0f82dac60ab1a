# -*- coding: utf-8 -*-
"""The bmc role's judging on the controller: the Redfish reads (community.general.redfish_info) in, the report and
the PATCH body out. The map and the logic live in plugins/module_utils/hmk_bmc_vendors.py (unit-tested)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_bmc_grub as grub
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_bmc_vendors as vendors

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported without Ansible (unit tests in a bare interpreter)
    AnsibleFilterError = ValueError


def _single(facts, key):
    """The one system's entry of a redfish_info result (entries: [[{system_uri}, data], ...])."""
    block = (facts or {}).get(key) or {}
    if block.get("ret") is False:
        raise AnsibleFilterError("the BMC did not give %s: %s" % (key, block.get("msg")))
    entries = block.get("entries") or []
    if len(entries) != 1:
        raise AnsibleFilterError("the BMC lists %d systems under %s; the bmc role handles a BMC with one system"
                                 % (len(entries), key))
    entry = entries[0]
    return entry[1] if isinstance(entry, (list, tuple)) else entry


def hmk_bmc_judge(redfish_facts, profile=None, want=None, vendor="auto"):
    """The BMC's BIOS report: {system, vendor, vendor_name, checks, summary, changes, diff, unwritable, table}."""
    system = _single(redfish_facts, "system")
    attributes = _single(redfish_facts, "bios_attribute")
    key = vendors.vendor_of(system.get("Manufacturer"), vendor)
    result = vendors.judge(key, attributes, vendors.wanted(profile, want))
    result.update({
        "system": dict((k, system.get(k)) for k in ("Manufacturer", "Model", "PowerState", "BiosVersion", "Id")),
        "vendor": key or vendors.UNKNOWN,
        "vendor_name": vendors.VENDORS[key]["name"] if key else "not in the map (%s)" % system.get("Manufacturer"),
        "diff": vendors.diff(attributes, result["changes"]),
        "table": vendors.table(result["checks"]),
    })
    return result


def hmk_bmc_applied(redfish_facts, changes):
    """True when the re-read shows the node on and every written attribute as written."""
    try:
        system = _single(redfish_facts, "system")
        attributes = _single(redfish_facts, "bios_attribute")
    except AnsibleFilterError:
        return False
    return vendors.applied(system.get("PowerState"), attributes, changes)


def hmk_bmc_cause(message):
    """The operator's reading of a failed Redfish call (wrong credentials, unreachable, untrusted certificate)."""
    return vendors.cause(message)


def hmk_bmc_want_refusals(want):
    """Refusals for bmc_bios_want (unknown check ids, values outside the canonical set)."""
    return vendors.refusals(want)


def hmk_bmc_grub_seed(menu, params, timeout=5):
    """The installer's GRUB menu with the seed's boot parameters on the entry it boots by itself
    (plugins/module_utils/hmk_bmc_grub.py says what changes and why)."""
    try:
        return grub.seed_menu(menu, params, int(timeout))
    except grub.MenuError as error:
        raise AnsibleFilterError("the installer ISO's /boot/grub/grub.cfg cannot be made unattended: %s" % error)


def hmk_bmc_md5sum_update(listing, menu, path="boot/grub/grub.cfg"):
    """The ISO's md5sum.txt with the MD5 of the rebuilt menu on the menu's line."""
    return grub.md5sums(listing, path, menu)


class FilterModule(object):
    def filters(self):
        return {"hmk_bmc_judge": hmk_bmc_judge, "hmk_bmc_applied": hmk_bmc_applied, "hmk_bmc_cause": hmk_bmc_cause,
                "hmk_bmc_want_refusals": hmk_bmc_want_refusals, "hmk_bmc_grub_seed": hmk_bmc_grub_seed,
                "hmk_bmc_md5sum_update": hmk_bmc_md5sum_update}
