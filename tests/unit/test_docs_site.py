"""The collection's public surface is documented, and the README stays a front door (issue 29 items 2 and 3).

- ansible-doc renders every module, action, callback, filter and role entry point of hmk.moe_kit (what galaxy-importer
  and the docs site read); each filter's documentation says it is internal to the roles.
- README.md stays under FRONT_DOOR_MAX_LINES, and every section that moved out of it keeps its heading there, pointing
  at a page of docs/docsite/rst/ that holds the section and is in the site's table of contents.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FRONT_DOOR_MAX_LINES = 320
INTERNAL = "Internal to the kit's roles; not a stable interface"
OG, TB, BM, RO = ("docs/docsite/rst/%s.rst" % n for n in ("operator_guide", "test_bed", "benchmarks", "roles"))
# Each section that left the README: its heading there, the page that holds it now, and facts of it that the page
# must still state (a sample; the test fails when one of them is lost in an edit or a move).
MOVED = [
    ("Stages", OG, ["bios_checklist", "--tags"]),
    ("What the preflight and the doctor read, and what they say when they cannot know", OG, []),
    ("Validation and the roofline", OG, ["validate-roofline.png"]),
    ("The answer probe: right answers, not only answers", OG, ["answer_probes.yml"]),
    ("Tuning the engine's flags (`playbooks/tune.yml`)", OG, ["tune_objective", "tune_budget_minutes"]),
    ("Engine decisions made explicit, and opt-in engine flags", OG,
     ["inference_service_cache_ram_mib", "inference_service_split_mode_graph", "tests/unit/test_engine_flags.py"]),
    ("Metrics and the dashboard (`playbooks/monitoring.yml`)", OG, []),
    ("GPUs: verified where", OG, ["molecule/gpu_devices"]),
    ("Day 2: upgrades, model swaps, diagnosis", OG, []),
    ("Rolling engine upgrade (`playbooks/upgrade.yml`) and model swap (`playbooks/model_swap.yml`)", OG, []),
    ("Diagnosing a slow or broken node (`playbooks/doctor.yml`)", OG, []),
    ("A fleet: one endpoint in front of many nodes", OG, ["benchmarks/fleet.sh"]),
    ("Installing the kit as a collection, and running it from AWX / Automation Platform", OG,
     ["execution-environment.yml"]),
    ("Layout", TB, ["scripts/lab-fixtures"]),
    ("The twin (`scripts/twin`)", TB, ["scripts/twin up", "$HMK_STATE/failed/NAME.log"]),
    ("Bumping an engine pin", TB, ["make pins", "pins_checked"]),
    ("Roles and their variables", RO, ["scripts/gen-role-docs"]),
    ("What the roles refuse, and why", OG, []),
    ("Troubleshooting a node", OG, []),
    ("Troubleshooting the bed", TB, []),
]
# The benchmark history has no heading of its own in the README (it was a block of the Tests section).
BENCHMARK_FACTS = ["benchmarks/bed.sh", "image_cold", "benchmarks/model_sync.py", "benchmarks/site.sh", "9.1x"]


def _ansible_doc(kind, names):
    exe = Path(sys.executable).with_name("ansible-doc")
    exe = str(exe) if exe.exists() else shutil.which("ansible-doc")
    assert exe, "ansible-doc is not installed"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"))
    run = subprocess.run([exe, "-t", kind, "--json"] + ["hmk.moe_kit." + n for n in names],
                         capture_output=True, text=True, env=env, check=False, cwd=str(REPO))
    assert run.returncode == 0, run.stderr
    assert "[WARNING]" not in run.stderr, run.stderr
    return json.loads(run.stdout)


def _stems(folder, ext=".py"):
    return sorted(p.stem for p in (REPO / "plugins" / folder).glob("*" + ext) if not p.name.startswith("_"))


def _filters():
    sys.path.insert(0, str(REPO / ".collections"))
    import importlib.util
    names = []
    for path in sorted((REPO / "plugins" / "filter").glob("*.py")):
        spec = importlib.util.spec_from_file_location("hmk_docs_site_" + path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        names += list(module.FilterModule().filters())
    return sorted(names)


@pytest.mark.parametrize("kind,folder", [("module", "modules"), ("callback", "callback")])
def test_ansible_doc_renders_every_module_and_callback(kind, folder):
    names = _stems(folder)
    docs = _ansible_doc(kind, names)
    for name in names:
        doc = docs.get("hmk.moe_kit." + name, {}).get("doc") or {}
        assert doc.get("short_description") and doc.get("description"), name


def test_every_action_plugin_is_documented_by_its_module():
    assert set(_stems("action")) <= set(_stems("modules"))


def test_ansible_doc_renders_every_filter_and_each_says_it_is_internal():
    names = _filters()
    assert len(names) > 100
    docs = _ansible_doc("filter", names)
    for name in names:
        doc = docs.get("hmk.moe_kit." + name, {}).get("doc") or {}
        assert doc.get("name") == name and doc.get("short_description"), name
        assert any(INTERNAL in line for line in doc.get("description", [])), name
        assert docs["hmk.moe_kit." + name].get("examples"), name


def test_filter_sidecars_match_the_filters_arguments():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-filter-docs"), "--check"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


def test_ansible_doc_renders_every_role_entry_point():
    roles = sorted(p.parents[1].name for p in REPO.glob("roles/*/meta/argument_specs.yml"))
    docs = _ansible_doc("role", roles)
    for role in roles:
        specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        rendered = docs.get("hmk.moe_kit." + role, {}).get("entry_points") or {}
        assert set(rendered) == set(specs), role
        for entry, spec in rendered.items():
            assert spec.get("short_description"), (role, entry)


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= FRONT_DOOR_MAX_LINES, "README.md has %d lines; move sections to docs/docsite/rst/" % len(lines)
    text = "\n".join(lines)
    for heading in ("## Quick start (no hardware needed)", "## Pointing it at a real node", "## Where the rest lives"):
        assert heading in lines, heading
    assert "make lab" in text and "ansible-playbook site.yml -l epyc-node" in text


def _plain(text):
    return re.sub(r"`+", "", text)


def _toctree():
    sections = yaml.safe_load((REPO / "docs" / "docsite" / "extra-docs.yml").read_text())["sections"]
    return {entry for section in sections for entry in section["toctree"]}


@pytest.mark.parametrize("heading,page,facts", MOVED, ids=[m[0][:40] for m in MOVED])
def test_a_moved_section_points_at_the_page_that_holds_it(heading, page, facts):
    readme = (REPO / "README.md").read_text().splitlines()
    at = [i for i, line in enumerate(readme) if re.fullmatch(r"#{2,3} " + re.escape(heading), line)]
    assert at, "README.md lost the heading %r (keep it, pointing at %s)" % (heading, page)
    pointer = "\n".join(readme[at[0] + 1:at[0] + 4])
    assert "](%s)" % page in pointer, "the README heading %r does not point at %s" % (heading, page)
    rst = (REPO / page).read_text()
    titles = {_plain(line.strip()) for line in rst.splitlines()}
    assert _plain(heading) in titles, "%s has no section %r" % (page, heading)
    for fact in facts:
        assert fact in _plain(rst), "%s lost %r" % (page, fact)
    assert Path(page).stem in _toctree(), "%s is not in docs/docsite/extra-docs.yml" % page


def test_the_benchmark_history_is_a_page_of_the_site():
    rst = _plain((REPO / BM).read_text())
    for fact in BENCHMARK_FACTS:
        assert fact in rst, fact
    assert "benchmarks" in _toctree()
    assert "](%s)" % BM in (REPO / "README.md").read_text()


def test_every_extra_docs_page_has_the_label_antsibull_docs_wants():
    for name in _toctree():
        first = (REPO / "docs" / "docsite" / "rst" / (name + ".rst")).read_text().splitlines()[0]
        assert first == ".. _ansible_collections.hmk.moe_kit.docsite.%s:" % name, name
