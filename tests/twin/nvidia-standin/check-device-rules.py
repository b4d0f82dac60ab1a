#!/usr/bin/python3
"""Runs as root in the gpu_devices VM twin. For each driver naming the kit supports, loads the STAND-IN modules,
lets the nvidia_driver role's boot-time unit make the device nodes with Debian's real nvidia-modprobe, starts the
inference unit the role renders (its ExecStart replaced by device-probe) and records what the sandboxed engine
could open; the same probe outside the sandbox shows the nodes themselves are open to anyone. Then the device
rules the kit had before (char-nvidia-frontend ...) on the newer naming. Prints one JSON document."""
import json
import os
import stat
import subprocess
import time

UNIT = "hmk-inference.service"
NODES_UNIT = "hmk-nvidia-device-nodes.service"
PROBE = "/usr/local/libexec/hmk-device-probe"
PATHS = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps/nvidia-cap1",
         "/dev/hmk-standin-decoy", "/dev/null"]
OLD_RULES = "/etc/systemd/system/%s.d/zz-rules-before-the-fix.conf" % UNIT
# The DeviceAllow set of inference.service.j2 before this change (roles/inference_service/vars/main.yml).
OLD_ALLOW = ["char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps", "char-nvidia-caps-imex-channels"]


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True).stdout


def major(name):
    for line in open("/proc/devices").read().split("Block devices:")[0].splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == name:
            return int(fields[0])
    raise SystemExit("no %s in /proc/devices" % name)


def load(naming):
    sh("modprobe", "-r", "nvidia-uvm", "nvidia", check=False)
    sh("sh", "-c", "rm -rf /dev/nvidia* /dev/hmk-standin-decoy")
    sh("modprobe", "nvidia", "naming=" + naming)
    sh("modprobe", "nvidia-uvm")
    sh("systemctl", "restart", NODES_UNIT)
    # The test's own nodes, world-writable, so that only the unit's device policy can refuse them.
    os.makedirs("/dev/nvidia-caps", exist_ok=True)
    os.mknod("/dev/nvidia-caps/nvidia-cap1", 0o666 | stat.S_IFCHR, os.makedev(major("nvidia-caps"), 1))
    os.mknod("/dev/hmk-standin-decoy", 0o666 | stat.S_IFCHR, os.makedev(major("hmk-standin-decoy"), 0))
    os.chmod("/dev/nvidia-caps/nvidia-cap1", 0o666)
    os.chmod("/dev/hmk-standin-decoy", 0o666)


def nodes():
    out = {}
    for path in PATHS[:4]:
        try:
            st = os.stat(path)
            out[path] = "%s %d:%d %o" % ("c" if stat.S_ISCHR(st.st_mode) else "?", os.major(st.st_rdev),
                                         os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))
        except OSError as exc:
            out[path] = str(exc)
    return out


def probe_line(text):
    lines = [line[len("HMK-PROBE "):] for line in text.splitlines() if line.startswith("HMK-PROBE ")]
    return json.loads(lines[-1]) if lines else None


def sandboxed():
    # Read by journal cursor: the unit (Type=exec, the probe exits at once) may be inactive again before
    # `systemctl show` could give its invocation ID.
    cursor = sh("journalctl", "-n", "0", "--show-cursor", "--quiet").strip().split("cursor: ", 1)[-1]
    sh("systemctl", "start", UNIT)
    for _unused in range(100):
        found = probe_line(sh("journalctl", "--no-pager", "-o", "cat", "-u", UNIT, "--after-cursor", cursor))
        if found is not None:
            return found
        time.sleep(0.2)
    return {"error": sh("systemctl", "status", "--no-pager", UNIT, check=False)}


def unsandboxed():
    return probe_line(sh("runuser", "-u", "moe", "--", PROBE, *PATHS))


def run(naming):
    load(naming)
    return {"proc_devices": open("/proc/devices").read(),
            "nodes_unit": sh("systemctl", "is-active", NODES_UNIT, check=False).strip(),
            "nodes": nodes(), "sandboxed": sandboxed(), "unsandboxed": unsandboxed(),
            "device_allow": sh("systemctl", "show", "-p", "DeviceAllow", "--value", UNIT).strip()}


def with_old_rules(naming):
    with open(OLD_RULES, "w") as handle:
        handle.write("[Service]\nDeviceAllow=\n" + "".join("DeviceAllow=%s rw\n" % d for d in OLD_ALLOW))
    sh("systemctl", "daemon-reload")
    try:
        load(naming)
        return {"sandboxed": sandboxed(),
                "device_allow": sh("systemctl", "show", "-p", "DeviceAllow", "--value", UNIT).strip()}
    finally:
        os.remove(OLD_RULES)
        sh("systemctl", "daemon-reload")


report = {"r580": run("r580"), "r535": run("r535"), "old_rules_on_r580": with_old_rules("r580"),
          "old_rules_on_r535": with_old_rules("r535")}
load("r580")
print(json.dumps(report, indent=1, sort_keys=True))
