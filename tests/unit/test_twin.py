"""The twin CLI's hardware translation: what QEMU is asked for is what the guest will report."""
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from twin_loader import load_twin  # noqa: E402

twin = load_twin()


def parse_type17(blob: bytes) -> dict:
    """Decode the fields dmidecode prints from one SMBIOS type 17 structure."""
    (t, length, _handle, _array, _err, _tw, _dw, size, _ff, _set, _dl, _bl, mtype, _detail,
     speed, _m, _s, _a, _p, _rank, ext, conf_speed, *_volts) = struct.unpack_from(
        "<BBHHHHHHBBBBBHHBBBBBIHHHH", blob)
    strings = blob[length:].split(b"\0")
    return {"type": t, "length": length, "size_mb": ext if size == 0x7FFF else size,
            "mem_type": mtype, "speed": speed, "configured_speed": conf_speed,
            "locator": strings[0].decode(), "manufacturer": strings[2].decode()}


def test_smbios_eight_of_twelve_ddr5(tmp_path):
    args = twin.smbios_tables(tmp_path, populated=8, slots=12, size_gb=32, speed=5600, ddr="DDR5")
    files = [a.split("=", 1)[1] for a in args if a.startswith("file=")]
    assert len(files) == 13  # one type 16 + twelve type 17
    t16 = Path(files[0]).read_bytes()
    assert t16[0] == 16 and t16[1] == 23
    assert struct.unpack_from("<H", t16, 13)[0] == 12  # number of memory devices
    devices = [parse_type17(Path(f).read_bytes()) for f in files[1:]]
    populated = [d for d in devices if d["size_mb"]]
    assert len(populated) == 8
    assert {d["size_mb"] for d in populated} == {32768}
    assert {d["speed"] for d in populated} == {5600}
    assert {d["configured_speed"] for d in populated} == {5600}
    assert {d["mem_type"] for d in populated} == {0x22}
    empty = devices[8:]
    assert all(d["size_mb"] == 0 and d["manufacturer"] == "NO DIMM" for d in empty)
    assert len({d["locator"] for d in devices}) == 12  # one channel per slot


def test_smbios_large_dimm_uses_extended_size(tmp_path):
    args = twin.smbios_tables(tmp_path, populated=1, slots=1, size_gb=64, speed=3200, ddr="DDR4")
    dev = parse_type17(Path(args[-1].split("=", 1)[1]).read_bytes())
    assert dev["size_mb"] == 65536
    assert dev["mem_type"] == 0x1A


@pytest.mark.parametrize("spec,expected", [("12/12", (12, 12)), ("8/12", (8, 12)), ("0/8", (0, 8))])
def test_parse_dimms(spec, expected):
    assert twin.parse_dimms(spec) == expected


@pytest.mark.parametrize("spec", ["12", "13/12", "a/b", "8/0", "8/100"])
def test_parse_dimms_rejects(spec):
    with pytest.raises(twin.TwinError, match="--dimms"):
        twin.parse_dimms(spec)


def test_topology_smt_and_numa():
    args = twin.cpu_topology(cpus=4, threads=2, numa=2, memory_mb=2048)
    assert args[:4] == ["-smp", "4,sockets=1,cores=2,threads=2", "-m", "2048"]
    joined = " ".join(args)
    assert "node,nodeid=0,cpus=0-1,memdev=m0" in joined
    assert "node,nodeid=1,cpus=2-3,memdev=m1" in joined
    assert "memory-backend-ram,id=m1,size=1024M" in joined
    assert "dist,src=0,dst=1,val=12" in joined


def test_topology_memory_only_nodes_have_memory_and_no_cpus():
    args = twin.cpu_topology(cpus=2, threads=1, numa=1, memory_mb=1536, memory_only=1, memory_only_mb=512)
    assert args[:4] == ["-smp", "2,sockets=1,cores=2,threads=1", "-m", "2048"]  # the expander's memory on top
    numa = [args[i + 1] for i, a in enumerate(args) if a == "-numa"]
    assert numa[:2] == ["node,nodeid=0,cpus=0-1,memdev=m0", "node,nodeid=1,memdev=m1"]
    assert "memory-backend-ram,id=m1,size=512M" in args and "memory-backend-ram,id=m0,size=1536M" in args
    assert numa[2:] == ["dist,src=0,dst=1,val=20", "dist,src=1,dst=0,val=20"]


def test_topology_memory_only_nodes_beside_two_cpu_nodes():
    numa = [a for a in twin.cpu_topology(cpus=4, threads=2, numa=2, memory_mb=2048, memory_only=2)
            if a.startswith(("node,", "dist,"))]
    assert [n for n in numa if n.startswith("node,")] == [
        "node,nodeid=0,cpus=0-1,memdev=m0", "node,nodeid=1,cpus=2-3,memdev=m1",
        "node,nodeid=2,memdev=m2", "node,nodeid=3,memdev=m3"]
    assert "dist,src=0,dst=1,val=12" in numa and "dist,src=1,dst=2,val=20" in numa and "dist,src=3,dst=2,val=20" in numa


def test_topology_rejects_a_too_small_memory_only_node():
    with pytest.raises(twin.TwinError, match="--memory-only-node-mb"):
        twin.cpu_topology(cpus=2, threads=1, numa=1, memory_mb=1024, memory_only=1, memory_only_mb=64)


def test_topology_single_node_has_no_numa_args():
    args = twin.cpu_topology(cpus=2, threads=1, numa=1, memory_mb=1024)
    assert "-numa" not in args


@pytest.mark.parametrize("cpus,threads,numa,mem,match", [
    (3, 2, 1, 2048, "multiple of --threads-per-core"),
    (4, 1, 3, 3072, "must divide"),
    (4, 2, 4, 2048, "must divide"),   # 4 nodes of one thread each would split cores
    (4, 1, 4, 512, "256 MiB"),
])
def test_topology_rejects(cpus, threads, numa, mem, match):
    with pytest.raises(twin.TwinError, match=match):
        twin.cpu_topology(cpus=cpus, threads=threads, numa=numa, memory_mb=mem)


def test_tcg_runs_vcpus_round_robin_on_one_host_thread_whatever_the_host_cores():
    # A thread per vCPU let a guest's stop_machine starve on shared cores (accelerator's docstring).
    for cpus, host_cpus in ((1, 2), (2, 2), (2, 16), (8, 2)):
        accel, cpu, note = twin.accelerator(cpus, False, host_cpus)
        assert accel == ["-accel", "tcg,thread=single,tb-size=512"] and cpu == "Nehalem"
        assert ("round-robin" in note) == (cpus > 1)
    assert "8 vCPUs run round-robin on one host thread (2 host cores)" in twin.accelerator(8, False, 2)[2]
    assert twin.accelerator(8, True, 2)[:2] == (["-accel", "kvm"], "host")


def test_twin_names_are_checked():
    with pytest.raises(twin.TwinError, match="twin name"):
        twin.twin_dir("../etc")


def test_image_key_follows_the_build_script(monkeypatch, tmp_path):
    monkeypatch.setattr(twin, "KEY", tmp_path / "keys" / "id_ed25519")
    first = twin.image_key()
    assert twin.image_key() == first
    monkeypatch.setattr(twin, "SUITE", "trixie")
    assert twin.image_key() != first


def test_volumes_are_checked_before_anything_starts(tmp_path):
    assert twin.parse_volume(f"{tmp_path}:/srv/fixtures:ro") == (str(tmp_path), "/srv/fixtures", "ro")
    assert twin.parse_volume(f"{tmp_path}:/srv/x") == (str(tmp_path), "/srv/x", "rw")
    for bad, match in ((f"{tmp_path}", "expected HOST:GUEST"), (f"{tmp_path}:/x:rx", "ro or rw"),
                       (f"{tmp_path}:relative", "absolute"), (f"{tmp_path}/absent:/x", "does not exist")):
        with pytest.raises(twin.TwinError, match=match):
            twin.parse_volume(bad)


def test_a_vm_twin_refuses_volumes_before_it_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(twin, "STATE", tmp_path)
    monkeypatch.setattr(twin, "port_free", lambda port: True)
    started = []
    monkeypatch.setattr(twin, "vm_up", lambda *a: started.append(a))
    assert twin.main(["up", "--name", "voltest", "--kind", "vm", "--port", "2999",
                      "--volume", f"{tmp_path}:/srv/x"]) == 2
    assert started == []


def test_a_vm_twin_that_goes_down_leaves_its_console_and_qemu_logs_where_hmk_twin_logs_says(tmp_path, monkeypatch):
    monkeypatch.setattr(twin, "STATE", tmp_path / "state")
    d = twin.twin_dir("site-reboot")
    d.mkdir(parents=True)
    (d / "serial.log").write_text("[  912.1] reboot: Restarting system\n")
    (d / "qemu.log").write_text("qemu-system-x86_64: terminating on signal 15\n")
    (d / "meta.json").write_text("{}")
    logs = tmp_path / "reports" / "twins"
    monkeypatch.setenv("HMK_TWIN_LOGS", str(logs))
    twin.down({"name": "site-reboot", "kind": "vm"})  # no pid: nothing to stop
    assert not d.exists()
    assert (logs / "site-reboot.serial.log").read_text() == "[  912.1] reboot: Restarting system\n"
    assert (logs / "site-reboot.qemu.log").read_text().startswith("qemu-system-x86_64: terminating")


def test_without_hmk_twin_logs_a_vm_twin_that_goes_down_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(twin, "STATE", tmp_path / "state")
    d = twin.twin_dir("t")
    d.mkdir(parents=True)
    (d / "serial.log").write_text("x")
    monkeypatch.delenv("HMK_TWIN_LOGS", raising=False)
    twin.down({"name": "t", "kind": "vm"})
    assert not d.exists()
    assert not list(tmp_path.rglob("*.serial.log"))


# `info jit` of QEMU 7.2 (Debian 12) on a VM twin after ten Ansible tasks with ASLR on in the guest.
INFO_JIT = """Translation buffer state:
gen code size       125192547/134135808
TB count            232329
TB avg target size  18 max=1713 bytes
TB avg host size    306 bytes (expansion ratio: 16.8)
cross page TB count 446 (0%)

Statistics:
TB flush count      7
TB invalidate count 0
TLB full flushes    0
[TCG profiler not compiled]
"""


def test_jit_counts_reads_the_translation_cache_fill_and_flushes():
    assert twin.jit_counts(INFO_JIT) == {"gen_code_bytes": 125192547, "cache_bytes": 134135808, "tb_flushes": 7}
    assert twin.jit_counts("") == {}


def test_a_tcg_twin_going_down_is_asked_its_translation_cache_counts_over_qmp(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(d / "qmp.sock"))
    server.listen(1)
    asked = []

    def serve():
        conn = server.accept()[0]
        with conn, conn.makefile("rw") as f:
            f.write(json.dumps({"QMP": {"version": {}, "capabilities": []}}) + "\n")
            f.flush()
            for line in f:
                cmd = json.loads(line)
                asked.append(cmd)
                ret = INFO_JIT if cmd["execute"] == "human-monitor-command" else {}
                f.write(json.dumps({"return": ret}) + "\n")
                f.flush()
                if cmd["execute"] == "human-monitor-command":
                    return

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    line = twin.jit_line(d)
    t.join(5)
    server.close()
    assert asked[-1]["arguments"] == {"command-line": "info jit"}
    assert line.startswith("[twin] at down, TCG translation cache: ") and line.endswith("\n")
    expected = {"cache_bytes": 134135808, "gen_code_bytes": 125192547, "tb_flushes": 7}
    assert json.loads(line.split(": ", 1)[1]) == expected


def test_the_counts_are_written_after_qemu_has_stopped_so_its_last_words_do_not_overwrite_them(
        tmp_path, monkeypatch):
    # QEMU keeps qemu.log open at its own offset: a line appended while it runs is overwritten by its
    # "terminating on signal 15" (seen on the first try). A real process stands in for QEMU here.
    monkeypatch.setattr(twin, "STATE", tmp_path / "state")
    d = twin.twin_dir("t")
    d.mkdir(parents=True)
    log = d / "qemu.log"
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(["python3", "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, lambda *a: (print('qemu: terminating on signal 15',"
                                 " flush=True), sys.exit(0)))\ntime.sleep(60)", "-name", "t"],
                                stdout=out, stderr=out)
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped at once, as QEMU is by its own parent
    time.sleep(0.5)
    monkeypatch.setattr(twin, "jit_line", lambda _d: "[twin] at down, TCG translation cache: {\"tb_flushes\": 0}\n")
    twin.vm_down({"name": "t", "pid": proc.pid, "accel": "tcg"}, d)
    proc.wait(5)
    assert log.read_text().splitlines() == ["qemu: terminating on signal 15",
                                            "[twin] at down, TCG translation cache: {\"tb_flushes\": 0}"]


def test_a_twin_without_a_monitor_socket_gives_no_counts(tmp_path):
    assert twin.jit_line(tmp_path) == ""
