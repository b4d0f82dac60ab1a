"""Runs one of the collection's modules as Ansible runs it on a node: its own process, the arguments as JSON in a
file, the collection's module_utils on the path. Shared by the module tests (imported explicitly)."""
import ast
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LOG_MARK = "hmk-node-log: "
# What the module writes to the node's log (AnsibleModule.log: its "Invoked with ..." line, after Ansible's own
# masking of no_log values), sent to stderr instead: the journal is turned off for the run and syslog(3) replaced.
LOGGING_RUNNER = """
import runpy, sys, syslog
import ansible.module_utils.basic as basic
basic.has_journal = False
syslog.openlog = lambda *args, **kwargs: None
syslog.syslog = lambda *args: sys.stderr.write(%r + repr(args[-1]) + "\\n")
path = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(path, run_name="__main__")
""" % LOG_MARK


def run_module(name, tmp_path, args, logged=None):
    """The module's result. With a list as `logged`, what it logged on the node is appended to it."""
    argsfile = tmp_path / "args.json"
    argsfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, ".collections"))
    module = os.path.join(ROOT, "plugins", "modules", name + ".py")
    argv = [sys.executable, module, str(argsfile)]
    if logged is not None:
        argv = [sys.executable, "-c", LOGGING_RUNNER, module, str(argsfile)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    argsfile.unlink()
    if logged is not None:
        logged.extend(ast.literal_eval(line[len(LOG_MARK):]) for line in proc.stderr.splitlines()
                      if line.startswith(LOG_MARK))
    return json.loads(proc.stdout)
