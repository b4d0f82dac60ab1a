#!/usr/bin/env python3
"""model_sync throughput against plain curl, and the bytes re-fetched after an interruption.

Serves several GB of generated files from the test store (molecule/model_sync_transfer/files/
ranged_http_server.py) on 127.0.0.1, then in the same run:
  1. plain curl of every file (as many curl processes at once as the sync's parallelism), to disk, and the
     same plus an fsync of each file (the sync makes every file durable before publishing it);
  2. the role's fetch logic (hmk_model_sync.Syncer): curl writing the partial, sha256 following it as it grows,
     verification and atomic publication included; 1 and 2 alternate for --rounds rounds, medians printed;
  3. a sync whose transfer is cut at 40% of one file (no retry), then the re-run: bytes re-fetched.
Prints the numbers; does not gate (the machine is shared and noisy).

  benchmarks/model_sync.py [--mb 8192] [--rounds 3] [--files 2] [--parallel 2] [--workdir /var/tmp/hmk-bench-model-sync]
"""
import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SERVER = os.path.join(ROOT, "molecule", "model_sync_transfer", "files", "ranged_http_server.py")


def load_hmk():
    spec = importlib.util.spec_from_file_location(
        "hmk_model_sync", os.path.join(ROOT, "roles", "model_sync", "module_utils", "hmk_model_sync.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def served(stats_path):
    try:
        with open(stats_path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=8192,
                    help="total size of the generated files (default 8192: more than the page cache absorbs as dirty "
                         "pages on a 24 GiB machine, as every real model is; a small size measures the page cache)")
    ap.add_argument("--rounds", type=int, default=3, help="curl / model_sync pairs, interleaved; medians are printed")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--workdir", default="/var/tmp/hmk-bench-model-sync")
    args = ap.parse_args()
    hmk = load_hmk()

    shutil.rmtree(args.workdir, ignore_errors=True)
    store = os.path.join(args.workdir, "store", "bench")
    os.makedirs(store)
    files, per_file = [], args.mb * (1 << 20) // args.files
    for index in range(args.files):
        name = "bench-%05d-of-%05d.bin" % (index + 1, args.files)
        data = os.urandom(per_file)
        with open(os.path.join(store, name), "wb") as handle:
            handle.write(data)
        files.append({"name": name, "size": per_file, "sha256": hashlib.sha256(data).hexdigest()})
    total = per_file * args.files

    port, stats = free_port(), os.path.join(args.workdir, "stats.json")
    control = os.path.join(args.workdir, "control.json")
    server = subprocess.Popen([sys.executable, SERVER, "--root", os.path.join(args.workdir, "store"), "--port", str(port),
                               "--stats", stats, "--control", control, "--lifetime", "900"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        base = "http://127.0.0.1:%d/bench" % port

        # 1 and 2, interleaved over --rounds so that a noisy neighbour hits both sides alike.
        rounds = []
        for number in range(args.rounds):
            plain = os.path.join(args.workdir, "plain")
            shutil.rmtree(plain, ignore_errors=True)
            os.makedirs(plain)
            start = time.monotonic()
            for batch in range(0, len(files), args.parallel):
                procs = [subprocess.Popen(["curl", "--fail", "--silent", "--show-error", "-o",
                                           os.path.join(plain, f["name"]), base + "/" + f["name"]])
                         for f in files[batch:batch + args.parallel]]
                if any(p.wait() for p in procs):
                    raise SystemExit("plain curl failed")
            curl_s = time.monotonic() - start
            for f in files:  # the sync fsyncs before publishing; give curl the same durability for a second ratio
                fd = os.open(os.path.join(plain, f["name"]), os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            curl_fsync_s = time.monotonic() - start
            shutil.rmtree(plain, ignore_errors=True)

            # the role's fetch logic: curl into the partial, sha256 as it grows, verification, atomic publish
            dest = os.path.join(args.workdir, "synced")
            shutil.rmtree(dest, ignore_errors=True)
            source = hmk.Source("http", base, retries=0)
            syncer = hmk.Syncer("bench", os.path.join(dest, "bench"), os.path.join(dest, ".hmk-sync"),
                                os.path.join(dest, ".quarantine"), files, source, parallel=args.parallel,
                                log=hmk.ProgressLog(os.path.join(args.workdir, "sync.log"), "bench", 2))
            start = time.monotonic()
            result = syncer.run()
            sync_s = time.monotonic() - start
            if result["errors"]:
                raise SystemExit("sync failed: %s" % result["errors"])
            rounds.append((curl_s, curl_fsync_s, sync_s))
            print("round %d: curl %.2f s, curl+fsync %.2f s, model_sync %.2f s -> ratio %.2f"
                  % (number + 1, curl_s, curl_fsync_s, sync_s, curl_s / sync_s), flush=True)
        start = time.monotonic()
        rerun = syncer.run()
        rerun_s = time.monotonic() - start

        # 3. interruption at 40% of the first file, no retry, then the re-run
        cut = os.path.join(args.workdir, "cut")
        cut_path = "/bench/" + files[0]["name"]
        with open(control, "w") as handle:
            json.dump({"die_after": {cut_path: int(per_file * 0.4)}}, handle)
        before = served(stats).get(cut_path, {}).get("bytes", 0)
        cut_syncer = hmk.Syncer("bench", os.path.join(cut, "bench"), os.path.join(cut, ".hmk-sync"),
                                os.path.join(cut, ".quarantine"), files[:1], source, parallel=1)
        first = cut_syncer.run()
        second = cut_syncer.run()
        sent = served(stats)[cut_path]["bytes"] - before
    finally:
        server.terminate()
        server.wait(timeout=10)

    mb = total / 1e6
    curl_s, curl_fsync_s, sync_s = (statistics.median(r[i] for r in rounds) for i in range(3))
    print("files: %d x %.1f MB on 127.0.0.1, parallel %d, median of %d rounds"
          % (args.files, per_file / 1e6, args.parallel, len(rounds)))
    print("plain curl to disk:                 %6.2f s  %7.1f MB/s" % (curl_s, mb / curl_s))
    print("model_sync (sha256 + publish):      %6.2f s  %7.1f MB/s" % (sync_s, mb / sync_s))
    print("plain curl to disk, then fsync:     %6.2f s  %7.1f MB/s" % (curl_fsync_s, mb / curl_fsync_s))
    print("throughput ratio sync/curl:         %6.2f   (goal >= 0.90; per round: %s)"
          % (statistics.median(r[0] / r[2] for r in rounds), " ".join("%.2f" % (r[0] / r[2]) for r in rounds)))
    print("throughput ratio sync/(curl+fsync): %6.2f" % statistics.median(r[1] / r[2] for r in rounds))
    print("re-run with everything present:     %6.2f s  %d bytes fetched, changed=%s"
          % (rerun_s, rerun["bytes_received"], rerun["changed"]))
    print("cut at 40%% of %s: first run errors=%d, re-run errors=%d" % (files[0]["name"], len(first["errors"]),
                                                                        len(second["errors"])))
    print("bytes served for that file over both runs: %d for a %d-byte file -> %d bytes re-fetched"
          % (sent, per_file, sent - per_file))
    shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
