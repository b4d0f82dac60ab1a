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
