#!/usr/bin/env bash
# Prints what pytest-xdist saves in make test's static groups, measured in this run: the groups that hold
# make unit and make integration (lint+unit+syntax, sanity+integration), run as make test runs them
# (scripts/test-run), once with PYTEST_WORKERS=0 (one pytest process) and once with PYTEST_WORKERS=2.
# Numbers, not gates: nothing here fails on a slow machine. About 12 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
groups=(lint+unit+syntax sanity+integration)
out=reports/bench-static
mkdir -p "$out"
for workers in 0 2; do
  PYTEST_WORKERS=$workers python3 scripts/test-run "${groups[@]}" >"$out/workers-$workers.log" 2>&1
  cp reports/timing.json "$out/workers-$workers.json"
done
python3 - "$out" "${groups[@]}" <<'PY'
import json, sys
out, groups = sys.argv[1], sys.argv[2:]
runs = {w: {p["name"]: p["seconds"] for p in json.load(open(f"{out}/workers-{w}.json"))["parts"]} for w in (0, 2)}
print(f"{'group / part':28} {'1 process':>10} {'2 workers':>10} {'ratio':>6}")
total = {0: 0, 2: 0}
for group in groups:
    members = group.split("+")
    for part in members:
        a, b = runs[0][part], runs[2][part]
        print(f"  {part:26} {a:>9}s {b:>9}s {b / a if a else 0:>6.2f}")
    wall = {w: max(runs[w][m] for m in members) for w in (0, 2)}
    for w in wall:
        total[w] += wall[w]
    print(f"{group:28} {wall[0]:>9}s {wall[2]:>9}s {wall[2] / wall[0]:>6.2f}")
print(f"{'both groups':28} {total[0]:>9}s {total[2]:>9}s {total[2] / total[0]:>6.2f}")
PY
