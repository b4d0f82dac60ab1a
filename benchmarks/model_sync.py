#!/usr/bin/env python3
"""model_sync throughput against plain curl on the same bytes, per path, and the bytes re-fetched after a cut.

Generates --mb of random files once, then for each path in --paths, in the same run:
  store  a plain HTTP store (molecule/model_sync_transfer/files/ranged_http_server.py, sendfile)
  hub    the Hub path: the STAND-IN Hub (molecule/model_sync_hub/files/hub_standin.py; the real Hub cannot be reached
         here) with the files in a repository: resolve/ answers 302 to its storage host; plain curl follows it
         (curl -L), model_sync fetches through hmk_hub.HubSource (a HEAD per file first, then the redirect)
  peer   a peer node's server (roles/model_sync/files/hmk-model-peer, bearer token), as a second node fills from
         the first
For each path, plain curl (as many processes at once as the sync's parallelism, to disk; then the same plus an
fsync of each file, since the sync makes every file durable before publishing it) and the role's fetch logic
(hmk_model_sync.Syncer: the body received in the module, sha256 of each piece as it arrives, direct-I/O appends, verification,
atomic publication)
alternate for --rounds rounds; medians are printed. For the store it then cuts a transfer at 40% of one file (no
retry), re-runs, and prints the bytes fetched twice. Prints the numbers; does not gate (the machine is shared).

  benchmarks/model_sync.py [--mb 8192] [--rounds 3] [--files 2] [--parallel 2] [--paths store,hub,peer]
                           [--workdir /var/tmp/hmk-bench-model-sync]
"""
import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STORE = os.path.join(ROOT, "molecule", "model_sync_transfer", "files", "ranged_http_server.py")
STANDIN = os.path.join(ROOT, "molecule", "model_sync_hub", "files", "hub_standin.py")
PEER = os.path.join(ROOT, "roles", "model_sync", "files", "hmk-model-peer")
REPO = "hmk-bench/bench-GGUF"
PEER_TOKEN = "bench-peer-token-0123456789"

sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_hub  # noqa: E402
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_sync as hmk  # noqa: E402


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port, proc=None, seconds=10.0):
    """Until the port answers; the stand-in Hub hashes its repository first (as the Hub knows each LFS oid), which
    takes minutes at tens of GB, so its caller gives it longer and stops waiting if the server exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise SystemExit("the server for port %d exited with %s" % (port, proc.returncode))
            time.sleep(0.05)
    raise SystemExit("nothing listens on port %d" % port)


def served(stats_path):
    try:
        with open(stats_path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def plain_curl(files, urls, out, parallel, extra):
    """(seconds to disk, seconds to disk + fsync) for plain curl of every file."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    start = time.monotonic()
    for batch in range(0, len(files), parallel):
        procs = [subprocess.Popen(["curl", "--fail", "--silent", "--show-error"] + extra
                                  + ["-o", os.path.join(out, f["name"]), urls[f["name"]]])
                 for f in files[batch:batch + parallel]]
        if any(p.wait() for p in procs):
            raise SystemExit("plain curl failed")
    curl_s = time.monotonic() - start
    for f in files:
        fd = os.open(os.path.join(out, f["name"]), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    fsync_s = time.monotonic() - start
    shutil.rmtree(out, ignore_errors=True)
    return curl_s, fsync_s


def compare(label, args, files, urls, extra, make_source):
    """Plain curl and model_sync alternating over the rounds; prints and returns the medians."""
    rounds = []
    dest = os.path.join(args.workdir, "synced")
    for number in range(args.rounds):
        # One copy on disk at a time besides the source (a size past the page cache fits the disk).
        shutil.rmtree(dest, ignore_errors=True)
        curl_s, fsync_s = plain_curl(files, urls, os.path.join(args.workdir, "plain"), args.parallel, extra)
        source, shaped = make_source()
        syncer = hmk.Syncer("bench", os.path.join(dest, "bench"), os.path.join(dest, ".hmk-sync"),
                            os.path.join(dest, ".quarantine"), shaped, source, parallel=args.parallel,
                            log=hmk.ProgressLog(os.path.join(args.workdir, "sync.log"), "bench", 2))
        start = time.monotonic()
        result = syncer.run()
        sync_s = time.monotonic() - start
        if result["errors"]:
            raise SystemExit("%s: sync failed: %s" % (label, result["errors"]))
        rounds.append((curl_s, fsync_s, sync_s))
        print("%s round %d: curl %.2f s, curl+fsync %.2f s, model_sync %.2f s -> ratio %.2f"
              % (label, number + 1, curl_s, fsync_s, sync_s, curl_s / sync_s), flush=True)
    start = time.monotonic()
    again = syncer.run()
    print("%-5s re-run with everything present: %.2f s, %d bytes fetched, changed=%s"
          % (label, time.monotonic() - start, again["bytes_received"], again["changed"]))
    shutil.rmtree(dest, ignore_errors=True)
    mb = sum(f["size"] for f in files) / 1e6
    curl_s, fsync_s, sync_s = (statistics.median(r[i] for r in rounds) for i in range(3))
    print("%-5s plain curl to disk:             %7.2f s  %7.1f MB/s" % (label, curl_s, mb / curl_s))
    print("%-5s model_sync (sha256 + publish):  %7.2f s  %7.1f MB/s" % (label, sync_s, mb / sync_s))
    print("%-5s plain curl to disk, then fsync: %7.2f s  %7.1f MB/s" % (label, fsync_s, mb / fsync_s))
    print("%-5s ratio sync/curl %.2f (goal >= 0.90; per round: %s), sync/(curl+fsync) %.2f"
          % (label, statistics.median(r[0] / r[2] for r in rounds), " ".join("%.2f" % (r[0] / r[2]) for r in rounds),
             statistics.median(r[1] / r[2] for r in rounds)), flush=True)
    return source


def store_path(args, files, data_dir):
    port, stats, control = free_port(), os.path.join(args.workdir, "stats.json"), os.path.join(args.workdir, "ctl.json")
    server = subprocess.Popen([sys.executable, STORE, "--root", data_dir, "--port", str(port), "--stats", stats,
                               "--control", control, "--lifetime", "3600"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        base = "http://127.0.0.1:%d/bench" % port
        source = compare("store", args, files, dict((f["name"], base + "/" + f["name"]) for f in files), [],
                         lambda: (hmk.Source("http", base, retries=0), files))
        cut_path = "/bench/" + files[0]["name"]
        with open(control, "w") as handle:
            json.dump({"die_after": {cut_path: int(files[0]["size"] * 0.4)}}, handle)
        before = served(stats).get(cut_path, {}).get("bytes", 0)
        cut = os.path.join(args.workdir, "cut")
        cut_syncer = hmk.Syncer("bench", os.path.join(cut, "bench"), os.path.join(cut, ".s"), os.path.join(cut, ".q"),
                                files[:1], source, parallel=1)
        first, second = cut_syncer.run(), cut_syncer.run()
        sent = served(stats)[cut_path]["bytes"] - before
        print("store cut at 40%% of %s: first run errors=%d, re-run errors=%d; %d bytes served for a %d-byte file -> "
              "%d bytes re-fetched" % (files[0]["name"], len(first["errors"]), len(second["errors"]), sent,
                                       files[0]["size"], sent - files[0]["size"]))
    finally:
        server.terminate()
        server.wait(timeout=10)


def hub_path(args, files, data_dir):
    repos = os.path.join(args.workdir, "repos")
    commit = hashlib.sha1(json.dumps(files, sort_keys=True).encode()).hexdigest()
    tree = os.path.join(repos, REPO, commit)
    os.makedirs(os.path.join(tree, "BENCH"))
    for f in files:  # hard links: the same bytes (and page cache) as the other paths, no second copy on disk
        os.link(os.path.join(data_dir, "bench", f["name"]), os.path.join(tree, "BENCH", f["name"]))
    with open(os.path.join(repos, REPO, "refs.json"), "w") as handle:
        json.dump({"main": commit}, handle)
    port, storage = free_port(), free_port()
    server = subprocess.Popen([sys.executable, STANDIN, "--repos", repos, "--port", str(port), "--storage-port",
                               str(storage), "--lifetime", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, server, seconds=60 + sum(f["size"] for f in files) / 100e6)
        wait_port(storage, server)
        endpoint = "http://127.0.0.1:%d" % port
        locked = [dict(f, repo=REPO, commit=commit, path="BENCH/" + f["name"]) for f in files]
        urls = dict((f["name"], "%s/%s" % (endpoint, hmk_hub.resolve_path(REPO, commit, f["path"]))) for f in locked)
        compare("hub", args, files, urls, ["--location"], lambda: hmk_hub.hub_source(endpoint, locked, retries=0))
    finally:
        server.terminate()
        server.wait(timeout=10)


def peer_path(args, files, data_dir):
    token_file, header_file = os.path.join(args.workdir, "peer.token"), os.path.join(args.workdir, "peer.header")
    with open(token_file, "w") as handle:
        handle.write(PEER_TOKEN + "\n")
    with open(header_file, "w") as handle:
        handle.write("Authorization: Bearer %s\n" % PEER_TOKEN)
    port = free_port()
    server = subprocess.Popen([sys.executable, PEER, "--root", data_dir, "--bind", "127.0.0.1", "--port", str(port),
                               "--token-file", token_file], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        base = "http://127.0.0.1:%d/bench" % port
        compare("peer", args, files, dict((f["name"], base + "/" + f["name"]) for f in files),
                ["--header", "@" + header_file], lambda: (hmk.Source("http", base, token=PEER_TOKEN, retries=0), files))
    finally:
        server.terminate()
        server.wait(timeout=10)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=8192,
                    help="total size of the generated files (default 8192: more than the page cache absorbs as dirty "
                         "pages on a 24 GiB machine, as every real model is; a small size measures the page cache)")
    ap.add_argument("--rounds", type=int, default=3, help="curl / model_sync pairs, interleaved; medians are printed")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--paths", default="store,hub,peer")
    ap.add_argument("--workdir", default="/var/tmp/hmk-bench-model-sync")
    args = ap.parse_args()
    paths = args.paths.split(",")
    if not set(paths) <= {"store", "hub", "peer"}:
        raise SystemExit("--paths takes store, hub and peer")

    shutil.rmtree(args.workdir, ignore_errors=True)
    data_dir = os.path.join(args.workdir, "data")
    os.makedirs(os.path.join(data_dir, "bench"))
    files, per_file = [], args.mb * (1 << 20) // args.files
    for index in range(args.files):
        name = "bench-%05d-of-%05d.bin" % (index + 1, args.files)
        digest = hashlib.sha256()
        with open(os.path.join(data_dir, "bench", name), "wb") as handle:
            for _unused in range(per_file // (64 << 20)):
                block = os.urandom(64 << 20)
                digest.update(block)
                handle.write(block)
            rest = os.urandom(per_file % (64 << 20))
            digest.update(rest)
            handle.write(rest)
        files.append({"name": name, "size": per_file, "sha256": digest.hexdigest()})
    print("files: %d x %.1f MB on 127.0.0.1, parallel %d, median of %d rounds per path"
          % (args.files, per_file / 1e6, args.parallel, args.rounds), flush=True)
    try:
        for path in paths:
            {"store": store_path, "hub": hub_path, "peer": peer_path}[path](args, files, data_dir)
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
