"""Runs sushy-tools' Redfish emulator (sushy-emulator) with its fake systems driver, plus BIOS attributes.

Run with the interpreter that has sushy-tools (not the kit's venv): python bmc_emulator.py STATE.json -- <emulator
arguments>. The Redfish side is sushy-tools' own Flask application, unchanged: its /Systems/<id>/BIOS and
/BIOS/Settings routes, its basic auth (bcrypt htpasswd) and its TLS. Only the fake driver's storage is extended,
because sushy-tools 2.2.0's FakeDriver does not implement get_bios/set_bios (the base driver raises
NotSupportedError; only the libvirt driver keeps BIOS attributes). The libvirt driver, in front of a real QEMU
machine, is tested in molecule/bmc_libvirt; it applies a PATCH at once and checks no value, so the pending settings
and the refusals below stay on this fake driver.

The extension behaves like a real BMC's pending settings:
- a PATCH to BIOS/Settings is checked against the registry excerpt in STATE.json (an unknown attribute or a value
  outside its allowed values is refused with a 400 and a message, as iLO and iDRAC do) and kept as pending;
- the pending attributes become current at the next power-on or restart the fake driver completes (the driver
  itself delays each power transition by 1-11 s, as hardware does);
- every applied settings job is counted in STATE.json's directory (applied.log), so a test can prove a second run
  rebooted nothing;
- every PATCH/POST/DELETE the emulator receives is appended to requests.log (method, path, JSON body), so a test can
  prove what the kit asked for (one-time boot, restart) and that a refused run sent nothing.
"""
import json
import sys
from pathlib import Path

from sushy_tools import error
from sushy_tools.emulator import main as emulator
from sushy_tools.emulator.resources.systems import fakedriver

STATE = Path(sys.argv[1])
SPEC = json.loads(STATE.read_text())


class BiosFakeDriver(fakedriver.FakeDriver):
    """sushy-tools' FakeDriver with BIOS attributes that apply at the next boot."""

    def _bios(self, system):
        if "bios" not in system:
            system["bios"] = dict(SPEC["attributes"])
            system["bios_pending"] = {}
        return system

    def _update_if_needed(self, system):
        before = system.get("power_state")
        system = super()._update_if_needed(system)
        self._bios(system)
        if system.get("power_state") == "On" and before != "On" and system["bios_pending"]:
            system["bios"].update(system["bios_pending"])
            with open(STATE.parent / "applied.log", "a") as log:
                log.write(json.dumps(system["bios_pending"], sort_keys=True) + "\n")
            system["bios_pending"] = {}
            self._systems[system["uuid"]] = system
        return system

    def get_bios(self, identity):
        return dict(self._get(identity)["bios"])

    def set_bios(self, identity, attributes):
        system = self._get(identity)
        allowed = SPEC.get("allowed", {})
        for name, value in (attributes or {}).items():
            if name not in system["bios"]:
                raise error.BadRequest("The attribute %s is not in the BIOS attribute registry." % name)
            if name in allowed and value not in allowed[name]:
                raise error.BadRequest("The value %s for the attribute %s is not one of %s."
                                       % (value, name, ", ".join(allowed[name])))
        system["bios_pending"].update(attributes)
        self._systems[system["uuid"]] = system

    def reset_bios(self, identity):
        system = self._get(identity)
        system["bios_pending"] = dict(SPEC["attributes"])
        self._systems[system["uuid"]] = system


def _log_request():
    """Every request that changes something, as the BMC received it (the emulator's Boot PATCH ignores
    BootSourceOverrideEnabled and always shows Continuous, so a test reads what the kit asked for here)."""
    from flask import request
    if request.method in ("PATCH", "POST", "DELETE"):
        with open(STATE.parent / "requests.log", "a") as log:
            log.write(json.dumps({"method": request.method, "path": request.path,
                                  "body": request.get_json(silent=True)}, sort_keys=True) + "\n")


emulator.app.before_request(_log_request)
fakedriver.FakeDriver = BiosFakeDriver
emulator.fakedriver.FakeDriver = BiosFakeDriver

if __name__ == "__main__":
    sys.argv = [sys.argv[0]] + sys.argv[3:]
    sys.exit(emulator.main())
