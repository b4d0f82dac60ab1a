#!/usr/bin/env bash
# Prints what one Ansible task costs on a twin with and without the image's module code cache (scripts/twin-pyc.py),
# measured in this run: ten `command` tasks on a VM twin (software emulation) and on a container twin, first with the
# cache's .pth line moved aside (every task compiles ansible.module_utils), then with it back (the first task fills the
# cache, not timed). Numbers, not gates. Usage: benchmarks/twin_pyc.sh [PORT] (uses PORT and PORT+1).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib/task_loop.sh
source benchmarks/lib/task_loop.sh
port=${1:-2396}
task_loop_twins pyc "vm:bench-pyc-vm:$port" "container:bench-pyc-ct:$((port + 1))"
pth=/usr/local/lib/python3.11/dist-packages/hmk-twin-pyc.pth
printf '%-34s %s\n' measure 'seconds per task'
for host in bench-pyc-vm bench-pyc-ct; do
  scripts/twin ssh "$host" "mv $pth /root/hmk-twin-pyc.pth.off"
  without=$(task_loop_seconds "$work" "$host")
  scripts/twin ssh "$host" "mv /root/hmk-twin-pyc.pth.off $pth && rm -rf /var/cache/hmk-twin-pyc"
  ANSIBLE_PIPELINING=True ansible -i "$work/hosts.yml" "$host" -m ansible.builtin.command -a true >/dev/null
  with=$(task_loop_seconds "$work" "$host")
  printf '%-34s %.2f\n' "${host#bench-pyc-}_task_without_cache" "$without" "${host#bench-pyc-}_task_with_cache" "$with"
  printf '%-34s %.2f\n' "${host#bench-pyc-} ratio without/with" "$(echo "$without / $with" | bc -l)"
done
printf 'load average after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
