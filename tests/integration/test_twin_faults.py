"""Faults of the test bed end in a clear error that names what to look at, and leave nothing
half-done. These run the real tools (qemu, debootstrap, dockerd) against real failures."""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TWIN = REPO / "scripts" / "twin"
sys.path.insert(0, str(REPO / "tests"))
from twin_loader import load_twin  # noqa: E402

CACHE = Path(os.environ.get("HMK_CACHE", "/var/cache/hybrid-moe-kit"))


def twin(*args, env=None, timeout=300):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(TWIN), *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, check=False)


@pytest.fixture
def state(tmp_path):
    """A private state dir so these tests never touch twins that are really running."""
    return {"HMK_STATE": str(tmp_path / "state")}


def test_port_in_use_is_refused_before_anything_starts(state, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = twin("up", "--kind", "vm", "--name", "fault-port", "--port", str(port), env=state)
    assert r.returncode == 2
    assert f"port 127.0.0.1:{port} is in use" in r.stderr
    assert not (tmp_path / "state" / "twins" / "fault-port").exists()


def test_too_little_disk_for_the_image(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    try:
        r = twin("image", env={"HMK_CACHE": str(small)})
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert r.returncode == 2
    assert "too little disk for the image" in r.stderr
    assert "MiB free, 4096 MiB needed" in r.stderr


def test_failed_debootstrap_names_its_log(tmp_path):
    cache = tmp_path / "cache"
    # Port 9 (discard) on loopback: nothing answers, debootstrap fails at once.
    r = twin("image", env={"HMK_CACHE": str(cache), "HMK_MIRROR": "http://127.0.0.1:9/debian"})
    assert r.returncode == 2
    assert "image build failed; log:" in r.stderr
    log = Path(r.stderr.split("image build failed; log:")[1].split()[0])
    assert log.exists()
    assert "debootstrap failed" in r.stdout + r.stderr
    assert not list(cache.glob("images/*/base.qcow2"))


def test_vm_that_never_answers_ssh_names_its_serial_log(state, tmp_path):
    # 3 s is far too short for any boot: the wait must give up, say where the boot log is,
    # keep that log, and take the VM down (no qemu left behind). A plain boot (--no-resume): a saved state of the
    # same machine, which another run of the bed may have left in the cache, answers within 3 s.
    r = twin("up", "--kind", "vm", "--name", "fault-ssh", "--port", "2390", "--wait", "3", "--no-resume", env=state)
    assert r.returncode == 2
    assert "did not answer SSH on 127.0.0.1:2390 within 3 s" in r.stderr
    assert "software emulation" in r.stderr or "accelerator: KVM" in r.stderr
    log = tmp_path / "state" / "failed" / "fault-ssh.log"
    assert f"boot log: {log}" in r.stderr
    assert log.exists()
    assert not (tmp_path / "state" / "twins" / "fault-ssh").exists()
    ps = subprocess.run(["pgrep", "-f", "qemu-system-x86_64 -name fault-ssh"], capture_output=True, check=False)
    assert ps.returncode == 1


def test_dockerd_that_will_not_start_shows_its_log(state, tmp_path):
    env = dict(state, HMK_CACHE=str(tmp_path / "cache"), HMK_DOCKERD_ARGS="--no-such-flag")
    r = twin("dockerd", "start", env=env, timeout=120)
    assert r.returncode == 2
    # It exited at once: said with its status, without waiting out the start deadline.
    assert re.search(r"dockerd did not start \(it exited with status \d+\); log:", r.stderr), r.stderr
    assert "unknown flag: --no-such-flag" in r.stderr


def test_no_kvm_falls_back_to_tcg_with_a_warning(monkeypatch):
    twin_mod = load_twin()
    monkeypatch.setattr(twin_mod, "Path", _FakeCpuinfoPath)
    assert twin_mod.kvm_usable() is False


class _FakeCpuinfoPath(type(Path())):
    """A /proc/cpuinfo without vmx/svm, as on these nested hosts."""

    def read_text(self, *args, **kwargs):
        if str(self) == "/proc/cpuinfo":
            return "processor\t: 0\nflags\t\t: fpu sse sse2 avx2 hypervisor\n"
        return super().read_text(*args, **kwargs)


def test_a_saved_vm_state_that_does_not_load_falls_back_to_a_plain_boot(state, tmp_path):
    # A private cache that shares the image and key, holding a saved state for this machine whose memory image is
    # garbage (as after a QEMU upgrade that reads it differently): the twin must boot plainly, say so, and drop it.
    real = Path(os.environ.get("HMK_CACHE", "/var/cache/hybrid-moe-kit"))
    cache = tmp_path / "cache"
    cache.mkdir()
    for part in ("images", "keys"):
        (cache / part).symlink_to(real / part)
    twin_mod = load_twin()
    twin_mod.CACHE, twin_mod.KEY = cache, cache / "keys" / "id_ed25519"
    base = twin_mod.build_image() / "base.qcow2"
    hw = ["--cpus", "2", "--memory", "1024"]
    args = argparse.Namespace(
        name="fault-state", port=2298, cpus=2, memory=1024, numa_nodes=1, memory_only_nodes=0,
        memory_only_node_mb=512, threads_per_core=1, dimms="12/12", dimm_size_gb=32, dimm_speed=4800,
        dimm_type="DDR5", nvme_size="")
    accel, cpu, _unused = twin_mod.accelerator(2, twin_mod.kvm_usable(), len(os.sched_getaffinity(0)))
    d = tmp_path / "probe"
    qemu = twin_mod.shutil.which("qemu-system-x86_64")
    key = twin_mod.vm_state_key(twin_mod.vm_machine(args, d, accel, cpu), d, args.port,
                                twin_mod.qemu_version(qemu), "")
    saved = cache / "vmstate" / key
    saved.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base),
                    str(saved / "disk.qcow2")], check=True)
    (saved / "memory.state").write_bytes(b"not a migration stream\n" * 64)
    (saved / "boot.log").write_text("(saved boot)\n")
    (saved / "info.json").write_text('{"image": "%s"}\n' % twin_mod.image_key())
    env = dict(state, HMK_CACHE=str(cache))
    r = twin("up", "--kind", "vm", "--name", "fault-state", "--port", "2298", *hw, env=env, timeout=600)
    try:
        assert r.returncode == 0, r.stderr
        assert f"WARNING: saved state {key} did not resume (qemu exited" in r.stderr
        assert "booting plainly" in r.stderr
        meta = json.loads(r.stdout)
        assert meta["resumed"] is False and meta["vmstate"] == key
        assert not saved.exists()
        ssh = twin("ssh", "fault-state", "systemctl", "is-system-running", env=env)
        assert ssh.stdout.strip() in ("running", "degraded")
    finally:
        twin("down", "fault-state", env=env)
