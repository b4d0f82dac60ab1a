# shellcheck shell=bash
# Sourced by the benchmarks that time Ansible tasks on twins (twin_pyc.sh, twin_mitigations.sh, twin_aslr.sh,
# twin_connection.sh): the twins up, an inventory of them on 127.0.0.1, a play of ten `command` tasks after one
# untimed task, and the seconds per task it measures.
# Not run on its own; the caller has cd'd to the repository's root.

# The venv's Ansible when there is one, and the kit's private dockerd.
if [ -x .venv/bin/ansible-playbook ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
export DOCKER_HOST=unix://${HMK_STATE:-/var/tmp/hybrid-moe-kit}/dockerd/docker.sock

# task_loop_files DIR NAME:PORT...: DIR/hosts.yml (the twins, reached with the bed's key) and DIR/tasks.yml.
task_loop_files() {
  local dir=$1 key twin
  shift
  key=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])' < <(scripts/twin image 2>/dev/null | tail -n 1))
  {
    echo "all:"
    echo "  vars: {ansible_host: 127.0.0.1, ansible_user: root, ansible_python_interpreter: /usr/bin/python3,"
    echo "         ansible_ssh_private_key_file: $key,"
    echo '         ansible_ssh_common_args: "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}'
    echo "  hosts:"
    for twin in "$@"; do echo "    ${twin%%:*}: {ansible_port: ${twin#*:}}"; done
  } > "$dir/hosts.yml"
  cat > "$dir/tasks.yml" <<'PLAY'
- name: Ten module tasks in a row
  hosts: all
  gather_facts: false
  tasks:
    - name: The connection is open (not timed)
      ansible.builtin.command: "true"
      changed_when: false
    - name: Timed
      ansible.builtin.command: "true"
      changed_when: false
      loop: "{{ range(10) | list }}"
PLAY
}

# task_loop_seconds DIR HOST: seconds per task on HOST, the timed loop's total from profile_tasks over its ten items.
task_loop_seconds() {
  local total
  total=$(ANSIBLE_PIPELINING=True ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks \
    ansible-playbook -i "$1/hosts.yml" -l "$2" "$1/tasks.yml" | sed -n 's/^Timed -* \([0-9.]*\)s$/\1/p')
  echo "$total / 10" | bc -l
}

# task_loop_twins LABEL KIND:NAME:PORT...: each twin up (KIND vm or container; the private dockerd started first
# when a container twin needs it and it is not running), with WORK (a scratch directory holding hosts.yml and
# tasks.yml for them all) set for the caller. When the caller's shell exits the twins are taken down, a dockerd
# started here is stopped again and WORK is removed (task_loop_cleanup).
task_loop_twins() {
  local label=$1 spec kind name port inventory=()
  shift
  work=$(mktemp -d "/var/tmp/hmk-bench-$label.XXXXXX")
  task_loop_names=()
  task_loop_started_dockerd=0
  trap task_loop_cleanup EXIT
  for spec; do
    IFS=: read -r kind name port <<<"$spec"
    if [ "$kind" = container ] && [ "$(scripts/twin dockerd status)" != running ]; then
      scripts/twin dockerd start >/dev/null
      task_loop_started_dockerd=1
    fi
    task_loop_names+=("$name")
    scripts/twin up --kind "$kind" --name "$name" --port "$port" >/dev/null
    inventory+=("$name:$port")
  done
  task_loop_files "$work" "${inventory[@]}"
}

task_loop_cleanup() {
  if [ "${#task_loop_names[@]}" -gt 0 ]; then scripts/twin down "${task_loop_names[@]}" >/dev/null 2>&1 || true; fi
  if [ "$task_loop_started_dockerd" = 1 ]; then scripts/twin dockerd stop >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
