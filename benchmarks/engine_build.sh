#!/usr/bin/env bash
# What the llama_build role costs, measured in this run on the engine_build Molecule twin:
#   - a converge with nothing to do vs one `llama-server --version` (the no-change path must stay
#     "seconds", dominated by Ansible's per-task overhead, not by a build);
#   - build wall time with a warm compiler cache vs cold, from the build records of this twin
#     (every build's record keeps its wall time and ccache hits/misses). BENCH_COLD=1 also measures
#     a cold build now (ccache disabled, ~15-25 min on 2 busy cores).
# Numbers, not gates. The twin is left running for inspection unless BENCH_DESTROY=1.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/molecule ] && export PATH="$PWD/.venv/bin:$PATH"
export HMK_CACHE=${HMK_CACHE:-/var/cache/hybrid-moe-kit}
export DOCKER_HOST=unix://${HMK_STATE:-/var/tmp/hybrid-moe-kit}/dockerd/docker.sock
now() { date +%s.%N; }
secs() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }
ROOT=/opt/hmk/engines/ik_llama.cpp
in_twin() { docker exec -i engine-build "$@"; }

scripts/twin dockerd start >/dev/null && scripts/twin dockerd image >/dev/null
molecule create -s engine_build >/dev/null 2>&1     # create + prepare; skipped when they are done
t0=$(now); molecule converge -s engine_build >/dev/null 2>&1; t1=$(now)
first_converge=$(secs "$t0" "$t1")
t0=$(now); molecule converge -s engine_build >/dev/null 2>&1; t1=$(now)
noop_converge=$(secs "$t0" "$t1")
t0=$(now); in_twin "$ROOT/current/bin/llama-server" --version >/dev/null 2>&1; t1=$(now)
version_call=$(secs "$t0" "$t1")

if [ "${BENCH_COLD:-0}" = 1 ]; then
  t0=$(now)
  molecule converge -s engine_build -- -e '{"llama_build_extra_cmake_args": ["-DGGML_CCACHE=OFF"]}' >/dev/null 2>&1
  t1=$(now)
  echo "cold converge (GGML_CCACHE=OFF, new build key): $(secs "$t0" "$t1") s"
fi

echo "== no-change converge vs llama-server --version"
echo "first converge of this run:   ${first_converge} s"
echo "no-change converge:           ${noop_converge} s"
echo "llama-server --version:       ${version_call} s (docker exec)"
python3 -c "import sys; print('ratio no-change/--version:    %.0fx' % (float(sys.argv[1]) / max(float(sys.argv[2]), 0.001)))" \
  "$noop_converge" "$version_call"

echo "== builds on the twin (from build-record.json; misses ~ objects compiled, hits ~ served by ccache)"
in_twin python3 - "$ROOT" <<'PY'
import glob, json, os, sys
rows = []
for path in glob.glob(os.path.join(sys.argv[1], "builds", "*", "build-record.json")):
    r = json.load(open(path))
    kind = "warm" if r["ccache_hits"] > 10 * max(r["ccache_misses"], 1) else "cold"
    rows.append((r["built_at"], r["key"], kind, r["wall_seconds"], r["build_seconds"], r["ccache_hits"], r["ccache_misses"]))
print("%-26s %-22s %-5s %6s %6s %6s %6s" % ("built_at", "key", "cache", "wall", "build", "hits", "misses"))
for row in sorted(rows):
    print("%-26s %-22s %-5s %6d %6d %6d %6d" % row)
PY
echo "(a cold build's record is only present when the twin's first build ran with an empty cache;"
echo " BENCH_COLD=1 measures one now; the probe measured ~735 s on one free core: /work/shared/TESTBED.md)"
if [ "${BENCH_DESTROY:-0}" = 1 ]; then molecule destroy -s engine_build >/dev/null 2>&1; fi
