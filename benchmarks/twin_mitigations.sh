#!/usr/bin/env bash
# Prints what the VM twin's kernel command line costs under software emulation, measured in this run on one VM twin:
# ten Ansible `command` tasks, 100 000 stat() calls and 100 fork+exec, once booted with the CPU vulnerability
# mitigations on (the kernel's default: on the twin's Nehalem model that is page-table isolation, so every system call
# switches page tables and QEMU's software TLB is flushed) and once with `mitigations=off` (the twin image's GRUB
# default, scripts/build-image.sh). The twin is rebooted between the two. Numbers, not gates.
# Usage: benchmarks/twin_mitigations.sh [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib/task_loop.sh
source benchmarks/lib/task_loop.sh
port=${1:-2398}
name=bench-mitig-vm
task_loop_twins "$name" "vm:$name:$port"
# The guest's own clock, so the host's load while SSH connects is not counted.
cat > "$work/guest.sh" <<'GUEST'
TIMEFORMAT=%R
{ time python3 -c 'import os
for _ in range(100000): os.stat("/")'; } 2>&1
{ time for _ in $(seq 100); do /bin/true; done; } 2>&1
GUEST
measure() {  # label: per-task seconds, stat() and fork+exec seconds
  local task guest
  task=$(task_loop_seconds "$work" "$name")
  mapfile -t guest < <(scripts/twin ssh "$name" bash -s < "$work/guest.sh")
  printf '%s %s %s\n' "$task" "${guest[0]}" "${guest[1]}"
}
reboot_with() {  # flip mitigations=off in GRUB's command line, reboot, wait for SSH
  scripts/twin ssh "$name" "$1 && update-grub >/dev/null 2>&1 && systemctl reboot" || true
  sleep 20
  for _ in $(seq 60); do scripts/twin ssh "$name" true >/dev/null 2>&1 && return 0; sleep 5; done
  echo "the twin did not come back after its reboot" >&2; return 1
}
flag() { scripts/twin ssh "$name" "grep -qw mitigations=off /proc/cmdline" && echo off || echo on; }
declare -A result
first=$(flag)
result[$first]=$(measure)
if [ "$first" = off ]; then
  reboot_with "sed -i 's/mitigations=off *//' /etc/default/grub"
else
  reboot_with "sed -i 's/^GRUB_CMDLINE_LINUX=\"/&mitigations=off /' /etc/default/grub"
fi
second=$(flag)
[ "$second" != "$first" ] || { echo "the reboot did not change the command line" >&2; exit 1; }
result[$second]=$(measure)
read -r on_task on_stat on_fork <<< "${result[on]}"
read -r off_task off_stat off_fork <<< "${result[off]}"
printf '%-28s %10s %10s %8s\n' measure 'mitig. on' 'off' ratio
printf '%-28s %10.2f %10.2f %7.2fx\n' 'ansible task (s)' "$on_task" "$off_task" "$(echo "$on_task / $off_task" | bc -l)" \
  '100000 stat() (s)' "$on_stat" "$off_stat" "$(echo "$on_stat / $off_stat" | bc -l)" \
  '100 fork+exec (s)' "$on_fork" "$off_fork" "$(echo "$on_fork / $off_fork" | bc -l)"
printf 'booted first with mitigations %s; load average after: %s\n' "$first" "$(cut -d' ' -f1-3 /proc/loadavg)"
