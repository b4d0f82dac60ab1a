"""Data from nodes is data: what the controller writes from a node's answers is never templated.

tune copies the engine, build, commit and model the node reports into the controller's inventory
(host_vars/<host>/tuned.yml), which Ansible reads as variables on every later run and would template. Each field
is planted here with a template that touches a file when evaluated ({{ }}, {% %} and {# #} together), written by
the real writer, read back through a real inventory by ansible-playbook, and must come back byte for byte with no
file touched. The fields of a known shape (build, commit, engine, date) are refused before they are written.
"""
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from ansible.parsing.yaml.loader import AnsibleLoader

from test_tune import _result, tune

REPO = Path(__file__).resolve().parents[2]
ERR = tune.AnsibleFilterError
GOOD_BUILD, GOOD_COMMIT = "462213ef9ec3-5a2b9c1d", "462213ef9ec32d610a70c0aba165aaf67d9bfb9e"


def payload(canary, astral=True):
    """A value that runs a command on the controller wherever Ansible templates it, and has the characters a naive
    YAML or JSON writer gets wrong (quotes, backslash, newline, a tab, non-ASCII and, with astral, a character
    beyond the BMP, which a JSON writer escapes as a surrogate pair that libyaml refuses)."""
    return ("{{ lookup('pipe', 'touch %s') }} {%% set _x = lookup('pipe', 'touch %s-statement') %%}{# a note #}"
            " \"quoted\" 'single' back\\slash\n\tline 2 \u00e9%s : - ? # &anchor *alias !tag %%"
            % (canary, canary, " \U0001F600" if astral else ""))


def touched(canaries):
    return [str(path) for canary in canaries for path in (Path(canary), Path(canary + "-statement")) if path.exists()]


def playbook(tmp_path, name, text, inventory):
    """ansible-playbook on the controller itself, its results as the json callback prints them."""
    (tmp_path / name).write_text(text)
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CONFIG=str(tmp_path / "none.cfg"))
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), name],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = json.loads(run.stdout[run.stdout.index("{"):])
    return {task["task"]["name"]: task["hosts"]["node-1"] for play in out["plays"] for task in play["tasks"]}


def inventory_for(tmp_path):
    inventory = tmp_path / "inventory"
    (inventory / "host_vars" / "node-1").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(
        "all:\n  hosts:\n    node-1:\n      ansible_connection: local\n      ansible_python_interpreter: %s\n"
        % json.dumps(sys.executable))
    return inventory


def planted_record(tmp_path, fields, astral=True):
    canaries = {field: str(tmp_path / ("pwned-%s-%s" % (field, uuid.uuid4().hex))) for field in fields}
    record = tune.tuned_record(_result())
    for field, canary in canaries.items():
        record[field] = payload(canary, astral)
    return record, canaries


# ------------------------------------------------------------------------------------ the writer, unit by unit

@pytest.mark.parametrize("field", ["build", "commit", "date", "engine"])
def test_a_field_of_a_known_shape_that_holds_a_template_is_refused_naming_it(tmp_path, field):
    record, canaries = planted_record(tmp_path, [field])
    with pytest.raises(ERR, match=r"tune_result\.%s is '\{\{ lookup\(.*nothing is written to the inventory" % field):
        tune.tuned_file(record, "header")
    # what the node reports is checked the same way before the search stops the service
    deployed = {"engine": "ik_llama.cpp", "build": GOOD_BUILD, "commit": GOOD_COMMIT, "model": "/m.gguf"}
    assert tune.tuned_checked(deployed) == deployed
    if field != "date":
        with pytest.raises(ERR, match=r"tune_result\.%s" % field):
            tune.tuned_checked(dict(deployed, **{field: record[field]}))
    assert touched(canaries.values()) == []


@pytest.mark.parametrize("field, value", [("build", "7E0C0F7F87E3-5A2B9C1D"), ("build", GOOD_BUILD + "\n"),
                                          ("commit", GOOD_COMMIT[:12]), ("commit", None), ("engine", "ktransformers"),
                                          ("date", "2026-12-02 10:00:00")])
def test_a_field_of_another_shape_is_refused_too(field, value):
    record = dict(tune.tuned_record(_result()), **{field: value})
    with pytest.raises(ERR, match=r"tune_result\.%s is " % field):
        tune.tuned_file(record)


def test_every_string_of_the_tuned_file_is_unsafe_or_cannot_hold_a_template(tmp_path):
    record, _unused = planted_record(tmp_path, ["model", "host"])
    record["commit"] = ""  # a build without a record of its commit
    text = tune.tuned_file(record, "Written by playbooks/tune.yml")
    for line in text.splitlines()[3:]:
        value = line.split(": ", 1)[1] if ": " in line else ""
        if value.startswith('"'):
            assert "{" not in value, line  # written plain only where the value reads as another type under !unsafe
        elif "{" in value or "'" in value:
            assert value.startswith('!unsafe "'), line
    assert text.isascii() and "\t" not in text
    assert sum(line.lstrip().startswith(("model: !unsafe", "host: !unsafe")) for line in text.splitlines()) == 2
    loaded = AnsibleLoader(text).get_single_data()["tune_result"]
    assert loaded == record and loaded["commit"] == "" and loaded["date"] == record["date"]


def test_a_lone_surrogate_or_a_key_that_is_no_name_is_refused(tmp_path):
    record = dict(tune.tuned_record(_result()), model="/srv/\udc80.gguf")
    with pytest.raises(ERR, match=r"tune_result\.model holds a lone surrogate"):
        tune.tuned_file(record)
    record = tune.tuned_record(_result())
    record["best"] = dict(record["best"], **{"{{ x }}": 1})
    with pytest.raises(ERR, match=r"tune_result\.best has a key"):
        tune.tuned_file(record)


# ------------------------------------------------------------------------------------ written and read by Ansible

READER = """
- name: The inventory is read as every later run reads it
  hosts: node-1
  gather_facts: false
  tasks:
    - name: tuned
      ansible.builtin.debug:
        var: tune_result
    - name: The node's answer is read again
      ansible.builtin.slurp:
        src: %(node)s
      register: node_answer
    - name: matched
      ansible.builtin.debug:
        msg: "{{ tune_result | hmk.moe_kit.tune_tuned_match(deployed) }}"
      vars:
        deployed:
          engine: ik_llama.cpp
          build: %(build)s
          model: "{{ (node_answer.content | b64decode | from_json).model }}"
          model_bytes: 15414624
    - name: report
      ansible.builtin.debug:
        msg: "{{ lookup('ansible.builtin.file', '%(report)s') | from_json }}"
"""

PLANTED_READER = """
- name: The inventory is read as every later run reads it
  hosts: node-1
  gather_facts: false
  tasks:
    - name: planted
      ansible.builtin.debug:
        var: planted_result
"""


def test_a_template_planted_in_every_field_copied_from_a_node_is_written_inert_and_read_back_unchanged(tmp_path):
    inventory = inventory_for(tmp_path)
    # Through the role's own writer (record.yml): the record arrives as the node's data does, read from a file.
    record, canaries = planted_record(tmp_path, ["model", "host"], astral=False)
    node_file = tmp_path / "node-record.json"
    node_file.write_text(json.dumps(record))
    (tmp_path / "reports" / "node-1").mkdir(parents=True)  # the search's report.yml made it
    deployment = tmp_path / "deployment.json"
    deployment.write_text(json.dumps({"build": GOOD_BUILD, "model": record["model"]}))
    writer = """
- name: The winner is written by the tune role, from what the node reported
  hosts: node-1
  gather_facts: false
  tasks:
    - name: The node's answer is read
      ansible.builtin.slurp:
        src: %(node)s
      register: node_answer
    - name: The record is the node's data
      ansible.builtin.set_fact:
        tune_result: "{{ node_answer.content | b64decode | from_json }}"
        __tune_summary: "{{ node_answer.content | b64decode | from_json }}"
    - name: record
      ansible.builtin.include_role:
        name: hmk.moe_kit.tune
        tasks_from: record
      vars:
        tune_report_dir: %(reports)s
        tune_deployment_record: %(deployment)s
""" % {"node": json.dumps(str(node_file)), "reports": json.dumps(str(tmp_path / "reports")),
       "deployment": json.dumps(str(deployment))}
    playbook(tmp_path, "write.yml", writer, inventory)
    tuned = inventory / "host_vars" / "node-1" / "tuned.yml"
    assert tuned.is_file() and touched(canaries.values()) == []

    read = playbook(tmp_path, "read.yml", READER % {
        "build": GOOD_BUILD, "node": json.dumps(str(node_file)),
        "report": str(tmp_path / "reports" / "node-1" / "tune.json")}, inventory)
    assert touched(canaries.values()) == []
    assert read["tuned"]["tune_result"] == record
    assert read["tuned"]["tune_result"]["model"] == payload(canaries["model"], astral=False)
    assert read["matched"]["msg"]["applies"] is True  # the record still applies to the build and model it names
    assert read["report"]["msg"]["model"] == record["model"]  # the report, read back as validate and monitoring do

    # Every string field, the shaped ones too, through the same emitter (the shapes are a second wall, not the only)
    every = ("engine", "build", "commit", "model", "host", "date")
    planted, planted_canaries = planted_record(tmp_path, every)
    planted["vars"] = dict(planted["vars"], inference_service_numa_mode=payload(str(tmp_path / "pwned-numa")))
    planted["objective"] = dict(planted["objective"], kind=payload(str(tmp_path / "pwned-kind")))
    planted_canaries.update({"numa": str(tmp_path / "pwned-numa"), "kind": str(tmp_path / "pwned-kind")})
    (inventory / "host_vars" / "node-1" / "planted.yml").write_text(
        "---\nplanted_result:\n" + "\n".join(tune._yaml(planted, 1)) + "\n")
    read = playbook(tmp_path, "read-planted.yml", PLANTED_READER, inventory)
    assert touched(planted_canaries.values()) == []
    assert read["planted"]["planted_result"] == planted


def test_a_speed_that_is_not_a_number_reads_back_as_one():
    record = tune.tuned_record(_result())
    record["best"] = dict(record["best"], pp_tps=float("nan"), tg_tps=float("inf"))
    loaded = AnsibleLoader(tune.tuned_file(record)).get_single_data()["tune_result"]
    assert isinstance(loaded["best"]["pp_tps"], float) and loaded["best"]["pp_tps"] != loaded["best"]["pp_tps"]
    assert loaded["best"]["tg_tps"] == float("inf")
