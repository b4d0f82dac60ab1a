"""sushy-tools' Redfish emulator, unchanged, plus a log of every request that changes something.

Run by bed.py: python emulator.py REQUESTS_LOG -- <sushy-emulator arguments>. The only addition is a Flask
before_request hook on sushy-tools' own application: each PATCH, POST and DELETE is appended to REQUESTS_LOG as one
JSON line (UTC time, method, path, JSON body; never a header, so no credentials). sushy-tools' libvirt driver applies a BIOS
PATCH to the domain's metadata at once, where a real BMC keeps it pending until the next boot; this log is how the
verify proves the kit still restarted the node once, and that the second run sent no PATCH and no reset.
"""
import json
import sys
from datetime import datetime, timezone

from flask import request
from sushy_tools.emulator import main as emulator

REQUESTS_LOG = sys.argv[1]


def _log_request():
    if request.method in ("PATCH", "POST", "DELETE"):
        with open(REQUESTS_LOG, "a") as log:
            log.write(json.dumps({"time": datetime.now(timezone.utc).isoformat(), "method": request.method,
                                  "path": request.path,
                                  "body": request.get_json(silent=True)}, sort_keys=True) + "\n")


emulator.app.before_request(_log_request)

if __name__ == "__main__":
    sys.argv = [sys.argv[0]] + sys.argv[3:]
    sys.exit(emulator.main())
