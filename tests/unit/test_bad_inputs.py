"""The bad-input table (tests/bad_inputs.yml) run through each role's own validation step.

Every `ansible.builtin.assert` task of roles/<role>/tasks/validate.yml is evaluated in process with Ansible's
templar, on the role's defaults and vars, the lab inventory's values and the case's override, in task order; the
first failing assert is the refusal, as in a play. A case passes when its refusal names the variable, contains the
expected text and never shows a secret's value. The lab's own values must pass every role's validation untouched.
Refusals only the node can make (`node: true`) are the replay scenario's (molecule/hardening) and
tests/unit/test_hmk_validate.py's.
"""
import os
import re
from pathlib import Path

import pytest
import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
import unit_support

REPO = Path(__file__).resolve().parents[2]

TABLE = yaml.safe_load((REPO / "tests" / "bad_inputs.yml").read_text())
LAB = REPO / "inventories" / "lab" / "group_vars" / "twins"
FACTS = {"processor_vcpus": 2, "processor_cores": 2, "processor_count": 1, "distribution": "Debian",
         "distribution_major_version": "12", "distribution_version": "12.7", "distribution_release": "bookworm",
         "os_family": "Debian"}
# What a play gives a role besides the lab inventory before the role can run at all (molecule/hardening passes the same).
ROLE_CONTEXT = {"ktransformers_build": {"hmk_ktransformers": {"method": "BF16", "weight_path": "/srv/kt-models/tiny"}}}


_trust = unit_support.trust


def _load(path):
    return yaml.safe_load(Path(path).read_text()) or {}


def role_vars(role, overrides=None):
    """Defaults < the lab inventory < role vars < the case (extra vars), as a play sees them."""
    variables = {}
    variables.update(_load(REPO / "roles" / role / "defaults" / "main.yml"))
    for name in sorted(os.listdir(LAB)):
        variables.update(_load(LAB / name))
    for name in ("main.yml", "catalog.yml"):
        path = REPO / "roles" / role / "vars" / name
        if path.exists():
            variables.update(_load(path))
    variables.update(ROLE_CONTEXT.get(role, {}))
    variables.update(overrides or {})
    variables["ansible_facts"] = dict(FACTS)
    variables["inventory_hostname"] = "epyc-node"
    variables.setdefault("inventory_dir", str(LAB.parents[1]))
    return _trust(variables)


def _conditions(value):
    return value if isinstance(value, list) else [value]


def first_refusal(role, overrides=None):
    """The fail_msg of the first assert of the role's validate.yml that fails, or None."""
    tasks = yaml.safe_load((REPO / "roles" / role / "tasks" / "validate.yml").read_text())
    base = role_vars(role, overrides)
    # Facts that earlier tasks set or register on the node exist only in a play: an assert that reads them is the
    # play's (Molecule's) to judge, not this in-process test's.
    runtime = set()
    for task in tasks:
        runtime.update((task.get("ansible.builtin.set_fact") or {}).keys())
        if task.get("register"):
            runtime.add(task["register"])
        if "ansible.builtin.assert" not in task:
            continue
        if any(name in str(task) for name in runtime):
            continue
        templar = Templar(loader=DataLoader(), variables=dict(base, **_trust(task.get("vars") or {})))
        if "when" in task and not all(templar.evaluate_conditional(trust_as_template(str(c)))
                                      for c in _conditions(task["when"])):
            continue
        items = templar.template(trust_as_template(task["loop"])) if "loop" in task else [None]
        for item in items:
            scoped = Templar(loader=DataLoader(), variables=dict(base, item=item, **_trust(task.get("vars") or {})))
            spec = task["ansible.builtin.assert"]
            if not all(scoped.evaluate_conditional(trust_as_template(str(c))) for c in _conditions(spec["that"])):
                return str(scoped.template(trust_as_template(spec.get("fail_msg", "assertion failed"))))
    return None


CASES = [pytest.param(role, case, id="%s:%s=%s" % (role, case["var"], str(case["value"])[:40].replace("\n", "\\n")))
         for role, cases in TABLE.items() for case in cases if not case.get("node")]


@pytest.mark.parametrize("role", sorted(TABLE))
def test_the_lab_values_pass_every_role_validation(role):
    assert first_refusal(role) is None


@pytest.mark.parametrize("role,case", CASES)
def test_each_bad_input_is_refused_naming_the_variable(role, case):
    overrides = dict(case.get("with") or {})
    overrides[case["var"]] = case["value"]
    message = first_refusal(role, overrides)
    assert message is not None, "%s = %r was accepted" % (case["var"], case["value"])
    assert case["var"] in message, message
    assert case["expect"] in message, message
    if case.get("secret") and case["value"]:
        assert case["value"] not in message and case["value"][:8] not in message, message


def test_every_role_has_cases_and_one_replayed_case():
    roles = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
    assert sorted(TABLE) == roles
    for role, cases in TABLE.items():
        assert len([c for c in cases if c.get("replay")]) == 1, role


# The classes of bad value each kind of rule must refuse (issue 27), named by the table's `class` field.
CLASSES_OF_RULE = {"int": {"nan", "boolean"}, "number": {"nan", "boolean"}, "port": {"boolean"},
                   "service_port": {"boolean"}, "ip": {"zone_id"}, "cidr": {"zone_id"}}


@pytest.mark.parametrize("role", sorted(TABLE))
def test_every_role_has_a_case_of_each_class_its_rules_take(role):
    """A role whose inputs include a number, a port, an address or a URL that carries a token has a case of each class
    of bad value that kind of input draws: the table grows by classes, not by the examples an issue names."""
    specs = (REPO / "roles" / role / "vars" / "main.yml").read_text()
    wanted = set()
    for rule in set(re.findall(r"\brule: (\w+)", specs)):
        wanted |= CLASSES_OF_RULE.get(rule, set())
    if re.search(r"carries_secret: (true|\"\{\{)", specs):
        wanted |= {"secret_scheme", "port_range"}
    have = set(case.get("class") for case in TABLE[role])
    assert wanted <= have, "%s: no case of class %s" % (role, ", ".join(sorted(wanted - have)))


# Scenarios that run a role only through an entry point without validation (their values never reach validate.yml).
NOT_VALIDATED = {("gpu_devices", "nvidia_driver"),  # tasks_from: device_nodes.yml
                 ("bmc_os_install", "bmc")}  # the install's URLs come from the bed's files: below, filled in


def _scenario_values():
    """Each scenario's literal inventory values (group_vars and host_vars in molecule.yml), by role prefix: what the
    scenarios converge with must pass the roles' validation too (an empty value a role documents, for one)."""
    out = []
    for path in sorted((REPO / "molecule").glob("*/molecule.yml")):
        scenario = _load(path)
        inventory = (scenario.get("provisioner") or {}).get("inventory") or {}
        values = {}
        for section in ("group_vars", "host_vars"):
            for group_values in (inventory.get(section) or {}).values():
                values.update(group_values or {})
        # A play's hostvars: each twin of the scenario with its own host_vars (a peer is looked up there).
        own = inventory.get("host_vars") or {}
        hostvars = {p["name"]: dict(own.get(p["name"]) or {}) for p in scenario.get("platforms") or []}
        for role in sorted(TABLE):
            mine = {k: v for k, v in values.items()
                    if k.startswith(role + "_") and "{{" not in str(v) and "${" not in str(v)}
            if mine and (path.parent.name, role) not in NOT_VALIDATED:
                out.append(pytest.param(role, dict(mine, hostvars=hostvars), id="%s:%s" % (path.parent.name, role)))
    return out


@pytest.mark.parametrize("role, values", _scenario_values())
def test_the_scenario_values_pass_the_role_validation(role, values):
    assert first_refusal(role, values) is None


def test_the_os_install_scenario_values_pass_the_bmc_validation_with_its_bed_urls():
    scenario = _load(REPO / "molecule" / "bmc_os_install" / "molecule.yml")
    values = scenario["provisioner"]["inventory"]["group_vars"]["inference_nodes"]
    mine = {k: v for k, v in values.items() if k.startswith("bmc_") and "{{" not in str(v)}
    assert mine["bmc_os_install"] is True and mine["bmc_os_install_debian_tasks"] == ["ssh-server"]
    mine.update(bmc_address="127.0.0.1:8443", bmc_username="hmk-admin", bmc_password="x",
                bmc_os_install_image_url="http://127.0.0.1:8080/mirror/debian-12-amd64-netboot-cd.iso",
                bmc_os_install_image_checksum="sha256:" + "0" * 64,
                bmc_os_install_publish_url="http://10.0.2.2:8080/seeds",
                bmc_os_install_media_url="http://127.0.0.1:8080/seeds")
    assert first_refusal("bmc", mine) is None
    assert "bmc_os_install_media_url" in first_refusal("bmc", dict(mine, bmc_os_install_media_url="ftp:/x"))
    assert "bmc_os_install_debian_tasks" in first_refusal("bmc", dict(mine, bmc_os_install_debian_tasks=["ssh server"]))
    assert "bmc_os_install_debian_tasks" in first_refusal("bmc", dict(mine, bmc_os_install_debian_tasks=[]))
