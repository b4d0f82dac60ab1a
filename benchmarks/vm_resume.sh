#!/usr/bin/env bash
# Prints what a VM twin's start costs on this machine, measured in this run: time to SSH for a plain boot and for a
# start from the machine's saved booted state (made first if missing, not timed), and their ratio. Numbers, not
# gates. Usage: benchmarks/vm_resume.sh [PORT] [twin up hardware args...] (default: kernel_tuning_reboot's machine).
# HMK_BENCH_NAME names the twin (default bench-resume).
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-2395}
shift || true
hw=("$@")
[ ${#hw[@]} -gt 0 ] || hw=(--cpus 2 --numa-nodes 2 --memory 2048)
name=${HMK_BENCH_NAME:-bench-resume}
now() { date +%s.%N; }
trap 'scripts/twin down "$name" >/dev/null 2>&1 || true' EXIT

# The saved state for this machine, made now if missing (the first use of a key pays boot + save).
scripts/twin up --kind vm --name "$name" --port "$port" "${hw[@]}" >/dev/null
scripts/twin down "$name" >/dev/null 2>&1

t0=$(now); HMK_TWIN_NO_RESUME=1 scripts/twin up --kind vm --name "$name" --port "$port" "${hw[@]}" >/dev/null; t1=$(now)
boot=$(echo "$t1 - $t0" | bc)
scripts/twin down "$name" >/dev/null 2>&1
t0=$(now); meta=$(scripts/twin up --kind vm --name "$name" --port "$port" "${hw[@]}"); t1=$(now)
resume=$(echo "$t1 - $t0" | bc)
grep -q '"resumed": true' <<<"$meta" || { echo "the second start did not resume: $meta" >&2; exit 1; }

printf '%-28s %s\n' measure seconds
printf '%-28s %.1f\n' vm_plain_boot_to_ssh "$boot" vm_resumed_to_ssh "$resume"
printf '%-28s %.1f\n' 'ratio boot/resume' "$(echo "$boot / $resume" | bc -l)"
printf 'machine: %s; load average before: %s\n' "${hw[*]}" "$(cut -d' ' -f1-3 /proc/loadavg)"
