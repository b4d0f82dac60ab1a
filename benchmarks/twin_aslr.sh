#!/usr/bin/env bash
# Prints what address-space randomisation (ASLR) in a VM twin's guest costs under software emulation, measured in this
# run on one VM twin: ten Ansible `command` tasks and 100 fork+exec of python3, with the guest's
# kernel.randomize_va_space at 2 (the kernel's default) and at 0 (what the image's `norandmaps` sets at boot,
# scripts/build-image.sh), twice each, alternating, each after ten untimed tasks with the new setting; and how often QEMU flushed its whole translation cache meanwhile
# (`info jit` over QMP). QEMU's TCG keys translated code by the guest's virtual addresses: with ASLR every new process
# maps python3 and its libraries elsewhere, so each Ansible task translates them again and fills the cache.
# Numbers, not gates. Usage: benchmarks/twin_aslr.sh [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib/task_loop.sh
source benchmarks/lib/task_loop.sh
port=${1:-2397}
name=bench-aslr-vm
task_loop_twins "$name" "vm:$name:$port"
flushes() {  # QEMU's count of whole translation-cache flushes since it started (scripts/twin's own QMP reader)
  python3 - "$name" <<'PY'
import importlib.machinery, importlib.util, sys
loader = importlib.machinery.SourceFileLoader("twin", "scripts/twin")
twin = importlib.util.module_from_spec(importlib.util.spec_from_loader("twin", loader))
loader.exec_module(twin)
info = twin.qmp(twin.twin_dir(sys.argv[1]) / "qmp.sock",
                {"execute": "human-monitor-command", "arguments": {"command-line": "info jit"}})
print(twin.jit_counts(info[0]).get("tb_flushes", "nan"))
PY
}
# The guest's own clock, so the host's load while SSH connects is not counted.
# shellcheck disable=SC2016  # expanded by the guest's shell
exec_loop='TIMEFORMAT=%R; { time for _ in $(seq 100); do python3 -c pass; done; } 2>&1'
measure() {  # randomize_va_space value: per-task seconds, TB flushes over the ten tasks, seconds for 100 python3 starts
  local before task after exec
  scripts/twin ssh "$name" "sysctl -q -w kernel.randomize_va_space=$1"
  task_loop_seconds "$work" "$name" >/dev/null  # not timed: the cache settles for this setting first
  before=$(flushes)
  task=$(task_loop_seconds "$work" "$name")
  after=$(flushes)
  exec=$(scripts/twin ssh "$name" "bash -c '$exec_loop'")
  printf '%s %s %s\n' "$task" "$((after - before))" "$exec"
}
declare -A task flush exec
for round in 1 2; do
  for aslr in 2 0; do
    read -r t f e < <(measure "$aslr")
    task[$aslr]="${task[$aslr]:-} $t"; flush[$aslr]="${flush[$aslr]:-} $f"; exec[$aslr]="${exec[$aslr]:-} $e"
    echo "round $round, randomize_va_space=$aslr: $t s per task, $f cache flushes, $e s for 100 python3" >&2
  done
done
mean() { echo "$*" | awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.2f", s / NF}'; }
printf '%-30s %10s %10s %8s\n' measure 'ASLR on' 'off' ratio
for row in task exec; do
  declare -n col=$row
  on=$(mean "${col[2]}"); off=$(mean "${col[0]}")
  label=$([ "$row" = task ] && echo 'ansible task (s)' || echo '100 python3 starts (s)')
  printf '%-30s %10s %10s %7.2fx\n' "$label" "$on" "$off" "$(echo "$on / $off" | bc -l)"
done
printf '%-30s %10s %10s\n' 'TCG cache flushes per 10 tasks' "$(mean "${flush[2]}")" "$(mean "${flush[0]}")"
printf 'load average after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
