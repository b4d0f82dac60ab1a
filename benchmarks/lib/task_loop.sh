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
