#!/usr/bin/env bash
# Prints what the venv's interpreter costs the controller side of the bed, measured in this run: the same Ansible work
# (a local play of 60 set_fact tasks that template a list and 20 `command` tasks, the kind of work that fills
# ansible-playbook's side of every scenario) and the same pytest module of the kit's unit tests, each run by Debian's
# /usr/bin/python3 (what scripts/venv builds the venv with) and by the first python3 on PATH that is not it (this
# machine kind's pyenv build), three times each, alternating. Both run with -S (neither loads its own site-packages,
# where the pyenv build has a pytest and plugins of its own) and import the venv's site-packages through PYTHONPATH
# (the same minor version, the same wheels), so only the interpreter differs. CPU seconds (user + system) are what
# count on 2 shared cores; wall seconds are printed beside them. Numbers, not gates. Usage: benchmarks/venv_python.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv .venv >/dev/null
site=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
distro=$(readlink -f .venv/bin/python)
other=""
while read -r candidate; do
  # The interpreter itself, not a wrapper in front of it (pyenv's shims are shell scripts).
  real=$("$candidate" -c 'import os, sys; print(os.path.realpath(sys.executable))')
  if [ "$real" != "$distro" ]; then other=$real; break; fi
done < <(type -ap python3 | grep -v "^$PWD/.venv/")
if [ -z "$other" ]; then
  echo "no second python3 on PATH besides $distro: nothing to compare" >&2
  exit 2
fi
same=$("$other" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$same" = "$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ] \
  || { echo "$other is Python $same, not the venv's minor version: its wheels would not load" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/play.yml" <<'YAML'
- name: Controller work
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    numbers: "{{ range(0, 60) | list }}"
  tasks:
    - name: A list is templated
      ansible.builtin.set_fact:
        joined: "{{ numbers | map('string') | join(',') }}"
      loop: "{{ numbers }}"
    - name: A command runs
      ansible.builtin.command: "true"
      changed_when: false
      loop: "{{ range(0, 20) | list }}"
YAML
printf '[defaults]\nstdout_callback = default\n' > "$work/ansible.cfg"

cpu() {  # interpreter, what: "user+system wall" of one run
  local py=$1 what=$2
  local -a cmd
  case $what in
    play) cmd=(env PYTHONPATH="$site" ANSIBLE_PYTHON_INTERPRETER="$py" ANSIBLE_CONFIG="$work/ansible.cfg"
               "$py" -S .venv/bin/ansible-playbook -i "localhost," "$work/play.yml") ;;
    unit) cmd=(env PYTHONPATH="$site" "$py" -S -m pytest -q -p no:cacheprovider tests/unit/test_engine_build.py) ;;
  esac
  /usr/bin/time -o "$work/time" -f '%U %S %e' "${cmd[@]}" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  awk '{printf "%.2f %.2f\n", $1 + $2, $3}' "$work/time"
}
declare -A sum_cpu sum_wall
for round in 1 2 3; do
  for what in play unit; do
    for which in distro other; do
      py=$([ "$which" = distro ] && echo "$distro" || echo "$other")
      read -r c w < <(cpu "$py" "$what")
      sum_cpu[$which.$what]=$(echo "${sum_cpu[$which.$what]:-0} + $c" | bc -l)
      sum_wall[$which.$what]=$(echo "${sum_wall[$which.$what]:-0} + $w" | bc -l)
      echo "round $round, $what, $py: $c CPU s, $w s" >&2
    done
  done
done
printf '%-34s %14s %14s %8s\n' "mean of 3 (CPU s / wall s)" "$("$distro" -V | cut -d' ' -f2) distro" \
  "$("$other" -V | cut -d' ' -f2) other" "ratio"
for what in play unit; do
  label=$([ "$what" = play ] && echo 'ansible-playbook, 80 local tasks' || echo 'pytest tests/unit/test_engine_build.py')
  printf '%-34s %6.2f / %5.2f %6.2f / %5.2f %7.2fx\n' "$label" \
    "$(echo "${sum_cpu[distro.$what]} / 3" | bc -l)" "$(echo "${sum_wall[distro.$what]} / 3" | bc -l)" \
    "$(echo "${sum_cpu[other.$what]} / 3" | bc -l)" "$(echo "${sum_wall[other.$what]} / 3" | bc -l)" \
    "$(echo "${sum_cpu[other.$what]} / ${sum_cpu[distro.$what]}" | bc -l)"
done
printf 'interpreters: distro %s, other %s; load average after: %s\n' "$distro" "$other" "$(cut -d' ' -f1-3 /proc/loadavg)"
