"""What `ansible-test sanity` (scripts/sanity, ~3 min) and `ansible-doc` demand of the collection, checked in
seconds: module docs that render (every description a string, only documentation keys, EXAMPLES, authors as
validate-modules wants them, no module-level tuple assignment ansible-doc cannot read), an ignore file with a reason
on every line and no blanket entries, and the get-pip stand-in scripts/sanity puts where ansible-test looks."""
import ast
import glob
import os
import re
import subprocess
import sys
import zipfile

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODULES = sorted(glob.glob(os.path.join(ROOT, "plugins", "modules", "hmk_*.py")))
IGNORES = os.path.join(ROOT, "tests", "sanity", "ignore-2.19.txt")
STANDIN = os.path.join(ROOT, "scripts", "get-pip-standin.py")

# The keys ansible-doc and validate-modules know in an option's documentation (no_log belongs to argument_spec).
OPTION_KEYS = {"description", "type", "required", "default", "choices", "elements", "suboptions", "aliases",
               "version_added", "deprecated"}
RETURN_KEYS = {"description", "returned", "type", "elements", "sample", "contains", "version_added"}
# validate-modules' author line: "Name (@github-handle)".
AUTHOR = re.compile(r"^\w.*\(@[\w-]+\)")


def tree(path):
    return ast.parse(open(path).read())


def blocks(path):
    out = {}
    for node in tree(path).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    out[target.id] = node.value.value
    return out


def texts(value):
    return value if isinstance(value, list) else [value]


def option_problems(options, where, keys):
    out = []
    for name, spec in (options or {}).items():
        here = "%s.%s" % (where, name)
        if not isinstance(spec, dict):
            out.append("%s is %r, not a mapping" % (here, spec))
            continue
        out += ["%s has key %r, not a documentation key" % (here, k) for k in sorted(set(spec) - keys)]
        out += ["%s: description item %r is not a string" % (here, d) for d in texts(spec.get("description"))
                if not isinstance(d, str)]
        out += option_problems(spec.get("suboptions") or spec.get("contains"), here, keys)
    return out


@pytest.mark.parametrize("path", MODULES, ids=os.path.basename)
def test_module_docs_are_what_ansible_doc_renders(path):
    docs = blocks(path)
    doc = yaml.safe_load(docs["DOCUMENTATION"])
    problems = ["description item %r is not a string" % d for d in texts(doc["description"]) if not isinstance(d, str)]
    problems += option_problems(doc.get("options"), "options", OPTION_KEYS)
    problems += option_problems(yaml.safe_load(docs["RETURN"]), "RETURN", RETURN_KEYS)
    problems += ["author %r is not 'Name (@handle)'" % a for a in texts(doc.get("author")) if not AUTHOR.match(str(a))]
    if not docs.get("EXAMPLES", "").strip():
        problems.append("no EXAMPLES")
    assert problems == []


@pytest.mark.parametrize("path", MODULES, ids=os.path.basename)
def test_no_module_level_tuple_assignment(path):
    # ansible-doc reads module-level assignments for the doc blocks and warns on every build about one it cannot name.
    bad = [node.lineno for node in tree(path).body if isinstance(node, ast.Assign)
           and any(isinstance(target, ast.Tuple) for target in node.targets)]
    assert bad == []


def test_every_ignore_line_names_one_file_one_check_and_why():
    lines = open(IGNORES).read().splitlines()
    assert lines
    for line in lines:
        match = re.fullmatch(r"(\S+) ([a-z0-9-]+(?:[:!][\w-]+)?) # (.{20,})", line)
        assert match, line
        assert os.path.isfile(os.path.join(ROOT, match.group(1))), line  # a file, never a directory
    assert len(set(line.split(" #")[0] for line in lines)) == len(lines)


def fake_pip_wheel(directory, version):
    # A wheel whose pip._internal.cli.main records the arguments it is called with.
    path = os.path.join(str(directory), "pip-%s-py3-none-any.whl" % version)
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("pip/__init__.py", "")
        wheel.writestr("pip/_internal/__init__.py", "")
        wheel.writestr("pip/_internal/cli/__init__.py", "")
        wheel.writestr("pip/_internal/cli/main.py",
                       "import json, os\n"
                       "def main(args):\n"
                       "    open(os.environ['RECORD'], 'w').write(json.dumps(args))\n"
                       "    return 0\n")
    return path


def test_get_pip_standin_installs_pip_from_the_wheel_without_get_pip_only_options(tmp_path):
    fake_pip_wheel(tmp_path, "24.2")
    record = tmp_path / "args.json"
    env = dict(os.environ, HMK_GET_PIP_WHEELS=str(tmp_path), RECORD=str(record))
    run = subprocess.run([sys.executable, STANDIN, "--disable-pip-version-check", "pip==24.2", "--no-setuptools",
                          "--no-wheel"], env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert yaml.safe_load(record.read_text()) == ["install", "--no-index", "--find-links", str(tmp_path),
                                                  "--disable-pip-version-check", "pip==24.2"]


def test_get_pip_standin_without_the_wheel_names_what_is_missing(tmp_path):
    env = dict(os.environ, HMK_GET_PIP_WHEELS=str(tmp_path))
    run = subprocess.run([sys.executable, STANDIN, "pip==24.2"], env=env, capture_output=True, text=True, check=False)
    assert run.returncode != 0
    assert "pip-24.2-py3-none-any.whl" in run.stderr and str(tmp_path) in run.stderr
    assert "Traceback" not in run.stderr
