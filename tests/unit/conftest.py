"""The repository is the collection hmk.moe_kit (.collections/ansible_collections/hmk/moe_kit links back to
the root): with .collections on sys.path the tests import the shared Python exactly as the roles do,
`from ansible_collections.hmk.moe_kit.plugins.module_utils import ...`, without Ansible's loader."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, ".collections"))

# Ansible's collection loader is installed before any test imports the collection, so that the tests that template
# with the collection's filters (test_bad_inputs.py) and those that import its Python directly share one loader,
# whatever order pytest collects them in.
from ansible.plugins.loader import init_plugin_loader  # noqa: E402

init_plugin_loader([os.path.join(ROOT, ".collections")])
