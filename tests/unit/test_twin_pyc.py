"""scripts/twin-pyc.py: the twin's cache of code compiled from zip imports (AnsiballZ) is keyed by content, gives
each hit the path of the zip it came from, and falls back to compile() whenever the cache cannot serve."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from twin_loader import load_twin  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "scripts" / "twin-pyc.py"

SOURCE = '''
VALUE = {value}


def outer():
    def inner():
        raise RuntimeError("from inner")
    return inner
'''

# Run in a child Python as the twin's python3 runs a module: the hook imported at start (the .pth line), the zip first
# on sys.path. COMPILE=refuse replaces compile() so that only a cache hit can import the module.
CHILD = '''
import os, sys
import hmk_twin_pyc
if os.environ.get("COMPILE") == "refuse":
    def refuse(pathname, source):
        raise SystemExit("compiled " + pathname)
    hmk_twin_pyc._compile = refuse
sys.path.insert(0, sys.argv[1])
import pkg.mod
try:
    pkg.mod.outer()()
except RuntimeError as exc:
    tb = exc.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    print(tb.tb_frame.f_code.co_filename)
print(pkg.mod.outer.__code__.co_filename)
print(pkg.mod.VALUE)
'''


@pytest.fixture
def bed(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(HOOK, site / "hmk_twin_pyc.py")
    return {"site": site, "cache": tmp_path / "cache", "root": tmp_path}


def _zip(bed, name, value):
    path = bed["root"] / name / "ansible_mod_payload.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/mod.py", SOURCE.format(value=value))
    return path


def _run(bed, zip_path, compile_="allow", cache=None):
    env = {"PYTHONPATH": str(bed["site"]), "HMK_TWIN_PYC_DIR": str(cache or bed["cache"]), "COMPILE": compile_,
           "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", CHILD, str(zip_path)], env=env, capture_output=True, text=True,
                          check=False)


def _entries(bed):
    return sorted(p for p in bed["cache"].rglob("*") if p.is_file())


def test_a_module_from_another_zip_with_the_same_source_is_served_from_the_cache_under_its_own_path(bed):
    first = _run(bed, _zip(bed, "a", 1))
    assert first.returncode == 0, first.stderr
    assert len(_entries(bed)) == 2  # pkg/__init__.py and pkg/mod.py
    second_zip = _zip(bed, "b", 1)
    second = _run(bed, second_zip, compile_="refuse")
    assert second.returncode == 0, second.stdout + second.stderr
    raised_in, defined_in, value = second.stdout.split()
    assert raised_in == defined_in == str(second_zip / "pkg" / "mod.py")  # nested code too, not the first zip's path
    assert value == "1"


def test_a_changed_source_is_compiled_again_and_never_gets_the_old_code(bed):
    assert _run(bed, _zip(bed, "a", 1)).returncode == 0
    refused = _run(bed, _zip(bed, "b", 2), compile_="refuse")
    assert refused.returncode != 0 and "compiled " in refused.stderr + refused.stdout
    changed = _run(bed, _zip(bed, "c", 2))
    assert changed.returncode == 0 and changed.stdout.split()[-1] == "2"
    assert len(_entries(bed)) == 3  # the new mod.py beside the old one; __init__.py unchanged


def test_a_damaged_entry_is_compiled_again_and_replaced(bed):
    assert _run(bed, _zip(bed, "a", 1)).returncode == 0
    for entry in _entries(bed):
        entry.write_bytes(b"\x00not marshal data")
    again = _run(bed, _zip(bed, "b", 1))
    assert again.returncode == 0 and again.stdout.split()[-1] == "1", again.stderr
    assert _run(bed, _zip(bed, "c", 1), compile_="refuse").returncode == 0  # the entries were written again


def test_a_cache_that_cannot_be_written_changes_nothing(bed):
    blocker = bed["root"] / "not-a-directory"
    blocker.write_text("")
    result = _run(bed, _zip(bed, "a", 1), cache=blocker)
    assert result.returncode == 0 and result.stdout.split()[-1] == "1", result.stderr
    assert blocker.read_text() == ""


def test_a_syntax_error_in_a_zipped_module_is_still_reported_as_one(bed):
    path = bed["root"] / "bad" / "ansible_mod_payload.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/mod.py", "def broken(:\n")
    result = _run(bed, path)
    assert result.returncode != 0 and "SyntaxError" in result.stderr


def test_the_image_key_follows_the_cache_hook(monkeypatch, tmp_path):
    twin = load_twin()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("build-image.sh", "twin-pyc.py"):
        shutil.copy(REPO / "scripts" / name, scripts / name)
    monkeypatch.setattr(twin, "HERE", scripts)
    monkeypatch.setattr(twin, "KEY", tmp_path / "keys" / "id_ed25519")
    first = twin.image_key()
    (scripts / "twin-pyc.py").write_text((scripts / "twin-pyc.py").read_text() + "\n# changed\n")
    assert twin.image_key() != first
