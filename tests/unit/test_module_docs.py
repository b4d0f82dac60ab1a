"""Every module's DOCUMENTATION, EXAMPLES and RETURN are YAML that ansible-doc can show, and the documented
options are the ones the module takes: a collection whose docs do not parse fails `ansible-doc` on the
operator's machine and the collection's doc build."""
import ast
import glob
import os

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODULES = sorted(glob.glob(os.path.join(ROOT, "plugins", "modules", "hmk_*.py")))


def blocks(path):
    tree = ast.parse(open(path).read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    out[target.id] = node.value.value
    return out


@pytest.mark.parametrize("path", MODULES, ids=os.path.basename)
def test_the_documentation_parses_and_names_the_module(path):
    docs = blocks(path)
    assert "DOCUMENTATION" in docs and "RETURN" in docs
    doc = yaml.safe_load(docs["DOCUMENTATION"])
    assert doc["module"] == os.path.basename(path)[:-3]
    assert doc["short_description"] and doc["description"]
    yaml.safe_load(docs["RETURN"])
    if "EXAMPLES" in docs:
        yaml.safe_load(docs["EXAMPLES"])
