"""Helpers shared by the model_sync and tiny-GGUF tests (imported explicitly; tests/unit/conftest.py is not ours)."""
import json
import os
import socket
import subprocess
import sys
import time

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GENERATOR = os.path.join(ROOT, "scripts", "make-tiny-moe-gguf")
SERVER = os.path.join(ROOT, "molecule", "model_sync_transfer", "files", "ranged_http_server.py")
CATALOG = os.path.join(ROOT, "roles", "model_sync", "vars", "catalog.yml")


def load_module_utils():
    """The role's module_utils, imported as the roles import it (tests/unit/conftest.py puts .collections on sys.path)."""
    sys.path.insert(0, os.path.join(ROOT, ".collections"))
    from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_sync
    return hmk_model_sync


def catalog():
    with open(CATALOG) as handle:
        return yaml.safe_load(handle)["__model_sync_catalog_builtin"]


def generate(out_dir, generator_args, stem, hf=True):
    """Run scripts/make-tiny-moe-gguf; returns the paths it printed."""
    argv = [sys.executable, GENERATOR, "-o", os.path.join(out_dir, stem + ".gguf")] + list(generator_args)
    if hf:
        argv += ["--hf-dir", out_dir]
    done = subprocess.run(argv, check=True, stdout=subprocess.PIPE, universal_newlines=True)
    return done.stdout.split()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RangedServer:
    """The Molecule scenario's ranged HTTP store, started on 127.0.0.1 for one test and stopped by its PID."""

    def __init__(self, root, workdir, token=""):
        self.root, self.port = root, free_port()
        self.stats = os.path.join(workdir, "stats.json")
        self.control = os.path.join(workdir, "control.json")
        self.token, self.proc = token, None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def __enter__(self):
        argv = [sys.executable, SERVER, "--root", self.root, "--port", str(self.port), "--stats", self.stats,
                "--control", self.control, "--lifetime", "300"]
        if self.token:
            argv += ["--token", self.token]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("ranged server did not start")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def die_after(self, path, nbytes):
        with open(self.control, "w") as handle:
            json.dump({"die_after": {path: nbytes}}, handle)

    def served(self):
        try:
            with open(self.stats) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return {}

    def bytes_served(self, path=None):
        stats = self.served()
        if path is not None:
            return stats.get(path, {}).get("bytes", 0)
        return sum(entry["bytes"] for entry in stats.values())
