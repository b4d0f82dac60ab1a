#!/usr/bin/env bash
# site.yml over a fleet of container twins, measured in one run (a benchmark, not part of CI):
#   0. a warm-up rebuild of one twin (fills the host's compiler cache if another job emptied it; not compared);
#   1. one node alone: the rebuild of a fresh twin with site.yml, then a no-op re-run;
#   2. N fresh twins in one inventory group (N=6 by default, HMK_FLEET_N, at most 10), site.yml across all of them
#      at once with the operator's guide's settings (forks >= N, no serial: each node's rebuild is independent), then a
#      no-op re-run; each twin's memory (its cgroup) while it serves;
#   3. a node that fails: one twin is reset and stopped mid-run (docker stop while it compiles the engine); every
#      other node must still answer /health; the twin is started again and the fleet re-run, reporting which
#      nodes changed or failed (docs/docsite/rst/operator_guide.rst: what this showed).
# Prints the times, the speed-up from parallelism (N x one node's rebuild / the fleet's rebuild) and the memory.
# The engine builds use the host's ccache like make lab does (a warm rebuild). Twins fleet-01..fleet-NN, SSH
# 127.0.0.1:2401.., services 18601.. (molecule/README.md). Costs ~30 min on this 2-core machine.
#   benchmarks/fleet.sh [--keep]      (--keep leaves the twins up for a look)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/ansible-playbook ] && export PATH="$PWD/.venv/bin:$PATH"
export HMK_CACHE=${HMK_CACHE:-/var/cache/hybrid-moe-kit}
export HMK_STATE=${HMK_STATE:-/var/tmp/hybrid-moe-kit}
export DOCKER_HOST=unix://$HMK_STATE/dockerd/docker.sock
export ANSIBLE_CONFIG=$PWD/ansible.cfg
keep=${1:-}
n=${HMK_FLEET_N:-6}
if ! { [ "$n" -ge 2 ] && [ "$n" -le 10 ]; }; then echo "fleet.sh: HMK_FLEET_N must be 2-10 (ports 2401-2410)" >&2; exit 2; fi
names=(); for i in $(seq 1 "$n"); do names+=("$(printf 'fleet-%02d' "$i")"); done
failing=${names[$((n / 2))]}
now() { date +%s.%N; }
secs() { printf '%.1f' "$(echo "$2 - $1" | bc)"; }
recap() { grep -E "^$1 +:" "$2" | tail -1 | grep -oE 'changed=[0-9]+ +unreachable=[0-9]+ +failed=[0-9]+' | tr -s ' '; }

if [ "$(scripts/twin dockerd status)" != running ]; then
  echo "fleet.sh: the private dockerd is not running (scripts/twin dockerd start)" >&2; exit 1
fi
scratch=$(mktemp -d /var/tmp/hmk-bench-fleet.XXXXXX)
logs=$HMK_STATE/bench-fleet
rm -rf "$logs" && mkdir -p "$logs"
cleanup() {
  [ "$keep" = --keep ] || scripts/twin down "${names[@]}" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT

# One inventory group (the lab's group_vars: the same build flags, model and service values), its own ports.
mkdir -p "$scratch/inventory/host_vars"
ln -s "$PWD/inventories/lab/group_vars" "$scratch/inventory/group_vars"
{
  echo "all:"; echo "  children:"; echo "    inference_nodes:"; echo "      children:"; echo "        twins:"
  echo "          hosts:"
  for i in $(seq 1 "$n"); do
    echo "            ${names[$((i - 1))]}: {ansible_port: $((2400 + i))}"
    printf 'inference_service_port: %d\nhmk_report_dir: %s/reports\n' $((18600 + i)) "$scratch" \
      > "$scratch/inventory/host_vars/${names[$((i - 1))]}.yml"
  done
  echo "  vars:"
  echo "    ansible_host: 127.0.0.1"
  echo "    ansible_user: root"
  echo "    ansible_ssh_private_key_file: $HMK_CACHE/keys/id_ed25519"
  echo "    ansible_python_interpreter: /usr/bin/python3"
} > "$scratch/inventory/hosts.yml"
export ANSIBLE_CACHE_PLUGIN_CONNECTION=$scratch/facts
inv=(-i "$scratch/inventory/hosts.yml")
# The operator's guide's recommendation for a rebuild: every node at once (forks >= nodes), no serial.
fleet_opts=(--forks "$n")

mapfile -t volumes < <(scripts/lab-fixtures --models tiny-deepseek2 --volume-args | tr ' ' '\n')
up() {  # fresh twins, started one after the other (each takes about a second)
  for name in "$@"; do
    local i=$((10#${name#fleet-}))
    scripts/twin down "$name" >/dev/null 2>&1 || true
    scripts/twin up --kind container --name "$name" --port $((2400 + i)) "${volumes[@]}" >/dev/null
  done
}
run() {  # run LOG [ansible-playbook args...]: prints the wall time, keeps the output
  local log=$1; shift
  local t0 t1 rc=0
  t0=$(now); ansible-playbook "${inv[@]}" "$@" > "$logs/$log.log" 2>&1 || rc=$?; t1=$(now)
  echo "$(secs "$t0" "$t1") $rc"
}
serving() {  # the nodes among the arguments whose service answers /health 200
  for name in "$@"; do
    local i=$((10#${name#fleet-}))
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((18600 + i))/health")" = 200 ] && echo "$name"
  done
}
free_mib() { awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo; }

echo "fleet.sh: $n twins, logs in $logs"
mem_before=$(free_mib)

# 0. Not timed: one rebuild that fills the host's compiler cache, in case another job emptied it, so that every
#    timed rebuild below is a warm one.
up "${names[0]}"
read -r warmup rc < <(run warm-up site.yml -l "${names[0]}")
[ "$rc" = 0 ] || { echo "the warm-up rebuild failed:"; tail -40 "$logs/warm-up.log"; exit 1; }

# 1. One node alone, fresh.
rm -rf "$scratch/facts"
up "${names[0]}"
read -r one_rebuild rc < <(run one-rebuild site.yml -l "${names[0]}")
[ "$rc" = 0 ] || { echo "one node's rebuild failed:"; tail -40 "$logs/one-rebuild.log"; exit 1; }
read -r one_noop rc < <(run one-noop site.yml -l "${names[0]}")
one_noop_recap=$(recap "${names[0]}" "$logs/one-noop.log")

# 2. The fleet, all fresh (and no facts cached from the twin of step 1).
rm -rf "$scratch/facts"
up "${names[@]}"
read -r fleet_rebuild rc < <(run fleet-rebuild site.yml "${fleet_opts[@]}")
[ "$rc" = 0 ] || { echo "the fleet's rebuild failed:"; grep -E '^fleet-[0-9]+ +:' "$logs/fleet-rebuild.log"; exit 1; }
read -r fleet_noop rc < <(run fleet-noop site.yml "${fleet_opts[@]}")
noop_changed=$(grep -E '^fleet-[0-9]+ +:' "$logs/fleet-noop.log" | grep -cv 'changed=0' || true)
declare -A mem
total_mem=0
for name in "${names[@]}"; do
  # The proportional set size of the twin's processes (shared pages, such as the mapped model, split among
  # the processes that map them): docker's own memory figure is empty under this host's cgroup v1 setup.
  mem[$name]=$(for pid in $(docker top "hmk-$name" -eo pid | tail -n +2); do
                 awk '/^Pss:/ {s += $2} END {print s + 0}' "/proc/$pid/smaps_rollup" 2>/dev/null || true
               done | awk '{s += $1} END {printf "%d", s / 1024}')
  total_mem=$((total_mem + mem[$name]))
done
mem_serving=$(free_mib)
serving_after_rebuild=$(serving "${names[@]}" | wc -l)

# 3. A node that fails mid-run: reset it, start the fleet's run, stop the twin while its rebuild runs.
rm -rf "$scratch/facts"
up "$failing"
t0=$(now)
ansible-playbook "${inv[@]}" site.yml "${fleet_opts[@]}" > "$logs/fail-run.log" 2>&1 &
pid=$!
# Stopped while it compiles the engine, well inside its rebuild. (Stopped inside an apt-get install instead, the
# node's dpkg is left interrupted and the re-run's first apt task fails until `dpkg --configure -a` is run.)
until grep -q "TASK \[hmk.moe_kit.llama_build : Checked at each poll, the compiler has produced" "$logs/fail-run.log" 2>/dev/null \
      || ! kill -0 "$pid" 2>/dev/null; do sleep 1; done
sleep 3
docker stop "hmk-$failing" >/dev/null
stopped_at=$(secs "$t0" "$(now)")
# A vanished node holds the linear strategy at llama_build's async task while Ansible polls it (up to
# llama_build_timeout): the run is given 5 minutes after the stop, then ended and reported as held.
held=no
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
if kill -0 "$pid" 2>/dev/null; then held=yes; kill "$pid"; fi
fail_rc=0; wait "$pid" || fail_rc=$?
fail_run=$(secs "$t0" "$(now)")
others=(); for name in "${names[@]}"; do [ "$name" = "$failing" ] || others+=("$name"); done
others_serving=$(serving "${others[@]}" | wc -l)
fail_recaps=$(grep -E '^fleet-[0-9]+ +:' "$logs/fail-run.log" || true)
docker start "hmk-$failing" >/dev/null
ansible "${inv[@]}" "$failing" -m ansible.builtin.wait_for_connection -a timeout=120 >/dev/null
read -r rerun rc < <(run fail-rerun site.yml "${fleet_opts[@]}")
rerun_changed=$(grep -E '^fleet-[0-9]+ +:' "$logs/fail-rerun.log" | grep -v 'changed=0 ' | awk '{print $1}' | tr '\n' ' ' || true)
rerun_failed=$(grep -E '^fleet-[0-9]+ +:' "$logs/fail-rerun.log" | grep -Ev 'unreachable=0 +failed=0 ' | awk '{print $1}' | tr '\n' ' ' || true)

printf '\n%-46s %8s\n' "measure" seconds
printf '%-46s %8s   (not timed below: fills the compiler cache)\n' "warm-up rebuild of one node" "$warmup"
printf '%-46s %8s\n' "one node: rebuild (site.yml, fresh twin)" "$one_rebuild"
printf '%-46s %8s   (%s)\n' "one node: no-op re-run" "$one_noop" "$one_noop_recap"
printf '%-46s %8s   (--forks %d, no serial)\n' "$n nodes: rebuild (site.yml, fresh twins)" "$fleet_rebuild" "$n"
printf '%-46s %8s   (%d node(s) with changes)\n' "$n nodes: no-op re-run" "$fleet_noop" "$noop_changed"
printf '%-46s %8s\n' "speed-up of the rebuild ($n x one / fleet)" "$(echo "scale=2; $n * $one_rebuild / $fleet_rebuild" | bc)"
printf '%-46s %8s\n' "speed-up of the no-op ($n x one / fleet)" "$(echo "scale=2; $n * $one_noop / $fleet_noop" | bc)"
printf '%-46s %8s\n' "fleet rebuild / one node's rebuild" "$(echo "scale=2; $fleet_rebuild / $one_rebuild" | bc)"
printf '%-46s %8s\n' "fleet no-op / one node's no-op" "$(echo "scale=2; $fleet_noop / $one_noop" | bc)"
echo
echo "memory while serving (each twin's processes, PSS, MiB): $(for name in "${names[@]}"; do printf '%s=%s ' "$name" "${mem[$name]}"; done)"
echo "  total $total_mem MiB for $n twins ($((total_mem / n)) MiB each); host MemAvailable $mem_before -> $mem_serving MiB"
echo "  nodes answering /health after the fleet rebuild: $serving_after_rebuild of $n"
echo
echo "failed node: $failing stopped ${stopped_at}s into the run (during its engine build); the run ended after ${fail_run}s, rc=$fail_rc, held at the stopped node and ended by the script: $held"
while IFS= read -r line; do echo "  $line"; done <<< "$fail_recaps"
echo "  other nodes answering /health after that run: $others_serving of $((n - 1))"
echo "  re-run after restarting $failing: ${rerun}s, rc=$rc, nodes with changes: ${rerun_changed:-none}, failed: ${rerun_failed:-none}"
echo "ansible output of each run: $logs/"
