"""Make the role's pure module_utils importable as a plain module (no Ansible needed)."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "roles", "bios_checklist", "module_utils"))
