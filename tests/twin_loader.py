"""Imports scripts/twin (a script without a .py suffix) as a module for the tests."""
import importlib.machinery
import importlib.util
from pathlib import Path

TWIN_PATH = Path(__file__).resolve().parents[1] / "scripts" / "twin"


def load_twin():
    loader = importlib.machinery.SourceFileLoader("twin", str(TWIN_PATH))
    spec = importlib.util.spec_from_loader("twin", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
