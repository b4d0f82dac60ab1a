"""sushy-tools' Redfish emulator with the request log of ../../bmc_libvirt/files/emulator.py, plus a one-time boot
that lasts one boot (labelled stand-in behaviour; everything else is sushy-tools' own application, unchanged).

Run by bed.py: python emulator.py REQUESTS_LOG -- <sushy-emulator arguments>.

Why: sushy-tools' libvirt driver ignores BootSourceOverrideEnabled and keeps every override for good (its own
comment: "In libvirt we always set the boot device frequency to continuous"). A real BMC's `Once` is used by the
next start and dropped: the installer's final reboot then boots the installed disk. Without it the installer would
start again on that reboot, install again, and the node would never answer SSH. What is added:
- A PATCH of the system with BootSourceOverrideEnabled=Once records the boot device the domain had before it.
- A Reset action that starts the domain (On, ForceOn, ForceRestart) while such a record is pending uses it: the
  domain has started from the override, and its persistent configuration gets the earlier device back.
- A reset from inside the guest (libvirt's REBOOT event) is, on a physical server, a new start of the firmware,
  which reads the BMC's settings again: the domain is stopped and started from its persistent configuration. A
  reset in the first FIRMWARE_GRACE seconds after a start is left alone: the firmware's own resets while it
  initialises are not a boot of the operating system.
Each of these steps is appended to REQUESTS_LOG as a JSON line with "event", so the verify can show them.
"""
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bmc_libvirt", "files"))
import emulator as logged  # noqa: E402  (the bmc_libvirt scenario's: sushy-tools' app with the request log)
import libvirt  # noqa: E402
from flask import request  # noqa: E402

app = logged.emulator.app
REQUESTS_LOG = logged.REQUESTS_LOG
FIRMWARE_GRACE = 120
_lock = threading.Lock()
_pending_once = {}   # identity -> boot device to restore after the next start
_started = {}        # domain UUID -> time the domain was last started by a Reset or by this module
_uri = []            # the libvirt URI of bed.py's emulator.conf


def _record(event, **fields):
    with open(REQUESTS_LOG, "a") as log:
        log.write(json.dumps(dict(fields, event=event, time=datetime.now(timezone.utc).isoformat()),
                             sort_keys=True) + "\n")


def _identity():
    parts = request.path.rstrip("/").split("/")
    return parts[4] if len(parts) > 4 and parts[3] == "Systems" else None


def _before():
    identity = _identity()
    body = request.get_json(silent=True) or {}
    if request.method == "PATCH" and identity and request.path.rstrip("/").count("/") == 4:
        boot = body.get("Boot") or {}
        if boot.get("BootSourceOverrideEnabled") == "Once" and boot.get("BootSourceOverrideTarget"):
            with _lock:
                _pending_once.setdefault(identity, app.systems.get_boot_device(identity))
            _record("once-recorded", identity=identity, restore=_pending_once[identity],
                    target=boot["BootSourceOverrideTarget"])


def _after(response):
    identity = _identity()
    if (request.method == "POST" and identity and request.path.endswith("/Actions/ComputerSystem.Reset")
            and response.status_code < 300):
        kind = (request.get_json(silent=True) or {}).get("ResetType")
        if kind in ("On", "ForceOn", "ForceRestart"):
            uuid = app.systems.uuid(identity)
            with _lock:
                _started[uuid] = time.time()
                restore = _pending_once.pop(identity, None)
            if restore:
                app.systems.set_boot_device(identity, restore)
                _record("once-used", identity=identity, restored=restore)
    return response


def _on_reboot(_conn, domain, _opaque):
    uuid = domain.UUIDString()
    with _lock:
        started = _started.get(uuid)
    if started is None or time.time() - started < FIRMWARE_GRACE:
        return
    threading.Thread(target=_restart, args=(uuid,), daemon=True).start()


def _restart(uuid):
    with _lock:
        _started[uuid] = time.time()
    conn = libvirt.open(_uri[0])
    try:
        domain = conn.lookupByUUIDString(uuid)
        domain.destroy()
        domain.create()
    finally:
        conn.close()
    _record("guest-reset-restarted", uuid=uuid)


def _watch_reboots(uri):
    conn = libvirt.open(uri)
    conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_REBOOT, _on_reboot, None)
    while True:
        libvirt.virEventRunDefaultImpl()


app.before_request(_before)
app.after_request(_after)

if __name__ == "__main__":
    config = {}
    args = sys.argv[3:]
    exec(open(args[args.index("--config") + 1]).read(), config)  # bed.py's emulator.conf: plain assignments
    _uri.append(config["SUSHY_EMULATOR_LIBVIRT_URI"])
    libvirt.virEventRegisterDefaultImpl()
    threading.Thread(target=_watch_reboots, args=(_uri[0],), daemon=True).start()
    sys.argv = [sys.argv[0]] + args
    sys.exit(logged.emulator.main())
