"""The README's role variable tables are generated from argument_specs and must match them."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_readme_role_tables_match_argument_specs():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-role-docs"), "--check"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_every_role_has_argument_specs_and_readme():
    for role in sorted((REPO / "roles").iterdir()):
        assert (role / "meta" / "argument_specs.yml").is_file(), role.name
        assert (role / "README.md").is_file(), role.name


def test_readme_cost_table_is_the_measured_run():
    """The README's cost table is the one scripts/test-run renders from the run recorded in docs/test-timing.json."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "test-run"), "--check", str(REPO / "docs" / "test-timing.json")],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
