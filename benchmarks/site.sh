#!/usr/bin/env bash
# Prints, measured in this run on a fresh container twin with the lab inventory's values:
#   1. the rebuild from a bare twin, stage by stage (one ansible-playbook run per stage tag, in site.yml's
#      order; each carries Ansible's own start-up, a few seconds, which the sum shows once more per stage),
#   2. two no-op re-runs of the whole site.yml (the first right after the rebuild, the second the steady
#      state), a single `ansible -m setup` round trip to the same twin (median of three), and the ratios
#      (goal: under 10x).
# Numbers, not gates. The engine build uses the host's ccache like make lab does, so "engines" is a warm
# rebuild (a cold one is ~12-18 min of compiling on 2 idle cores; benchmarks/engine_build.sh).
#   benchmarks/site.sh [--keep]      (--keep leaves the twin bench-site up for a look)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/ansible-playbook ] && export PATH="$PWD/.venv/bin:$PATH"
export HMK_CACHE=${HMK_CACHE:-/var/cache/hybrid-moe-kit}
export HMK_STATE=${HMK_STATE:-/var/tmp/hybrid-moe-kit}
export DOCKER_HOST=unix://$HMK_STATE/dockerd/docker.sock
export ANSIBLE_CONFIG=$PWD/ansible.cfg
keep=${1:-}
name=bench-site port=2351 service_port=18521
now() { date +%s.%N; }
secs() { printf '%.1f' "$(echo "$2 - $1" | bc)"; }

started_dockerd=0
if [ "$(scripts/twin dockerd status)" != running ]; then scripts/twin dockerd start >/dev/null; started_dockerd=1; fi
scratch=$(mktemp -d /var/tmp/hmk-bench-site.XXXXXX)
logs=$HMK_STATE/bench-site          # each run's ansible output, kept for a look (profile_tasks timings)
rm -rf "$logs" && mkdir -p "$logs"
cleanup() {
  [ "$keep" = --keep ] || scripts/twin down "$name" >/dev/null 2>&1 || true
  rm -rf "$scratch"
  if [ "$started_dockerd" = 1 ] && [ "$keep" != --keep ]; then scripts/twin dockerd stop >/dev/null; fi
}
trap cleanup EXIT

# An inventory beside the lab's: the same group_vars, this twin's address and its own service port.
mkdir -p "$scratch/inventory/host_vars"
ln -s "$PWD/inventories/lab/group_vars" "$scratch/inventory/group_vars"
cat > "$scratch/inventory/hosts.yml" <<EOF
all:
  children:
    inference_nodes:
      children:
        twins:
          hosts:
            $name:
              ansible_host: 127.0.0.1
              ansible_port: $port
              ansible_user: root
              ansible_ssh_private_key_file: $HMK_CACHE/keys/id_ed25519
              ansible_python_interpreter: /usr/bin/python3
EOF
cat > "$scratch/inventory/host_vars/$name.yml" <<EOF
inference_service_port: $service_port
hmk_report_dir: $scratch/reports
EOF
export ANSIBLE_CACHE_PLUGIN_CONNECTION=$scratch/facts
inv=(-i "$scratch/inventory/hosts.yml" -l "$name")

mapfile -t volumes < <(scripts/lab-fixtures --models tiny-deepseek2 --volume-args | tr ' ' '\n')
scripts/twin down "$name" >/dev/null 2>&1 || true
t0=$(now); scripts/twin up --kind container --name "$name" --port "$port" "${volumes[@]}" >/dev/null; t1=$(now)
declare -A took recap
took[twin]=$(secs "$t0" "$t1")

stages=(preflight gpu kernel reboot engines models serve validate)
for stage in "${stages[@]}"; do
  t0=$(now)
  ansible-playbook "${inv[@]}" site.yml --tags "$stage" > "$logs/$stage.log" 2>&1 \
    || { echo "stage $stage failed:"; tail -40 "$logs/$stage.log"; exit 1; }
  t1=$(now)
  took[$stage]=$(secs "$t0" "$t1")
done

# Two no-op runs: the first after the stage-by-stage rebuild (the preflight report's free-space figures have
# moved since, so the controller rewrites it), the second the steady state. Three setup round trips, median.
noop=()
for run in 1 2; do
  t0=$(now); ansible-playbook "${inv[@]}" site.yml > "$logs/noop-$run.log" 2>&1; t1=$(now)
  noop+=("$(secs "$t0" "$t1")")
  recap[$run]=$(grep -E "^$name +:" "$logs/noop-$run.log" | tail -1 | grep -oE 'changed=[0-9]+')
done
setups=()
for run in 1 2 3; do
  t0=$(now); ansible "${inv[@]}" all -m ansible.builtin.setup > /dev/null; t1=$(now)
  setups+=("$(secs "$t0" "$t1")")
done
setup=$(printf '%s\n' "${setups[@]}" | sort -n | sed -n 2p)

printf '%-34s %8s\n' "fresh twin, by stage" seconds
printf '%-34s %8s\n' "twin up (container, mounts)" "${took[twin]}"
total=0
for stage in "${stages[@]}"; do
  printf '%-34s %8s\n' "  $stage" "${took[$stage]}"
  total=$(echo "$total + ${took[$stage]}" | bc)
done
printf '%-34s %8s\n' "  all stages" "$total"
for run in 1 2; do
  printf '%-34s %8s   (%s)\n' "no-op re-run $run of site.yml" "${noop[$((run - 1))]}" "${recap[$run]}"
done
printf '%-34s %8s   (median of %s)\n' "ansible -m setup round trip" "$setup" "${setups[*]}"
for run in 1 2; do
  printf '%-34s %8s   (goal: under 10x)\n' "ratio no-op $run / setup" "$(echo "scale=1; ${noop[$((run - 1))]} / $setup" | bc)"
done
echo "ansible output of each run: $logs/"
