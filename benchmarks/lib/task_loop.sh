# shellcheck shell=bash
# Sourced by the benchmarks that time Ansible tasks on twins (twin_pyc.sh, twin_mitigations.sh): an inventory of
# twins on 127.0.0.1, a play of ten `command` tasks after one untimed task, and the seconds per task it measures.
# Not run on its own.

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

# task_loop_vm NAME PORT: one VM twin NAME on PORT, up, with WORK (a scratch directory holding hosts.yml and
# tasks.yml) set for the caller; both are removed when the caller's shell exits.
task_loop_vm() {
  local name=$1 port=$2
  work=$(mktemp -d "/var/tmp/hmk-$name.XXXXXX")
  # shellcheck disable=SC2064  # expanded now: the twin's name and the directory of this run
  trap "scripts/twin down '$name' >/dev/null 2>&1 || true; rm -rf '$work'" EXIT
  scripts/twin up --kind vm --name "$name" --port "$port" >/dev/null
  task_loop_files "$work" "$name:$port"
}
