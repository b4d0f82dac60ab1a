#!/usr/bin/env bash
# Prints what one Ansible task costs on the same container twin reached two ways, measured in this run: over SSH with
# a persistent connection (how molecule/shared/create.yml's container twins are reached) and through `docker exec`
# (Molecule's docker driver: community.docker.docker, the docker client and a new exec session per task). Ten
# `command` tasks after an untimed one, two rounds each, alternating; the seconds per task from profile_tasks and the
# CPU time the whole ansible-playbook run cost the machine (both cores, /proc/stat), then the ratios docker/SSH.
# Numbers, not gates. Usage: benchmarks/twin_connection.sh [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib/task_loop.sh
source benchmarks/lib/task_loop.sh
port=${1:-2399}
name=bench-conn
task_loop_twins conn "container:$name:$port"
# WORK's hosts.yml reaches the twin over SSH; WORK/docker's through docker exec, with the same play.
mkdir "$work/docker"
cp "$work/tasks.yml" "$work/docker/tasks.yml"
cat > "$work/docker/hosts.yml" <<EOF
all:
  hosts:
    $name: {ansible_connection: community.docker.docker, ansible_host: hmk-$name,
            ansible_docker_extra_args: "-H=$DOCKER_HOST", ansible_python_interpreter: /usr/bin/python3}
EOF

busy_jiffies() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
declare -A seconds=() cpu=() dir=([ssh]=$work [docker]=$work/docker)
for round in 1 2; do
  for way in ssh docker; do
    before=$(busy_jiffies)
    per_task=$(task_loop_seconds "${dir[$way]}" "$name")
    after=$(busy_jiffies)
    seconds[$way]="${seconds[$way]:-} $per_task"
    cpu[$way]="${cpu[$way]:-} $(echo "($after - $before) / $(getconf CLK_TCK)" | bc -l)"
    printf 'round %s %-7s %.2f s per task, %.1f core-s for the run\n' "$round" "$way" "$per_task" \
      "$(echo "($after - $before) / $(getconf CLK_TCK)" | bc -l)"
  done
done
mean() { echo "$*" | awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; print s / NF}'; }
printf '%-40s %.2f\n' "ratio per task, docker exec / SSH" "$(echo "$(mean "${seconds[docker]}") / $(mean "${seconds[ssh]}")" | bc -l)"
printf '%-40s %.2f\n' "ratio CPU per run, docker exec / SSH" "$(echo "$(mean "${cpu[docker]}") / $(mean "${cpu[ssh]}")" | bc -l)"
printf 'load average after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
