"""Runs one of the collection's modules as Ansible runs it on a node: its own process, the arguments as JSON in a
file, the collection's module_utils on the path. Shared by the module tests (imported explicitly)."""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_module(name, tmp_path, args):
    argsfile = tmp_path / "args.json"
    argsfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, ".collections"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "plugins", "modules", name + ".py"), str(argsfile)],
                          capture_output=True, text=True, env=env, check=False)
    argsfile.unlink()
    return json.loads(proc.stdout)
