"""The bed's stage snapshots (scripts/twin snapshot): the key follows what the stage depends on, and a scenario
never starts from a snapshot made for another key."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from twin_loader import load_twin  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def twin(tmp_path, monkeypatch):
    module = load_twin()
    cache = tmp_path / "cache"
    repo = cache / "fixtures" / "ik_llama.cpp.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / "f").write_text("one\n")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    subprocess.run([*git, "push", "-q", str(repo), "HEAD:refs/heads/main"], check=True)
    monkeypatch.setattr(module, "CACHE", cache)
    module.test_work = work
    module.test_git = git
    module.test_repo = repo
    return module


def _tree(root: Path) -> Path:
    """A copy of the files the engine stage's key reads, so the test can change them."""
    for rel in ["roles/llama_build", "roles/gateway", "plugins", "molecule/shared/stages",
                "inventories/lab/group_vars/twins/hardware.yml", "scripts/twin-init"]:
        src = REPO / rel
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
        else:
            dst.write_bytes(src.read_bytes())
    return root


def test_key_moves_with_every_input_and_only_with_them(twin, tmp_path):
    root = _tree(tmp_path / "tree")
    base = twin.stage_key("engine", "hybrid-moe-kit/twin:bookworm-x-c2", root)
    assert base == twin.stage_key("engine", "hybrid-moe-kit/twin:bookworm-x-c2", root)

    # A role the stage does not run: same key.
    (root / "roles/gateway/README.md").write_text("changed\n")
    assert twin.stage_key("engine", "hybrid-moe-kit/twin:bookworm-x-c2", root) == base

    seen = {base}
    changes = [
        lambda: (root / "roles/llama_build/tasks/main.yml").write_text(
            (root / "roles/llama_build/tasks/main.yml").read_text() + "\n# changed\n"),
        lambda: (root / "roles/llama_build/tasks/new.yml").write_text("---\n"),
        lambda: (root / "plugins/filter/llama_build.py").write_text(
            (root / "plugins/filter/llama_build.py").read_text() + "\n# changed\n"),
        lambda: (root / "molecule/shared/stages/engine-vars.yml").write_text(
            (root / "molecule/shared/stages/engine-vars.yml").read_text().replace("llama_build_jobs: 2", "llama_build_jobs: 3")),
        lambda: (root / "inventories/lab/group_vars/twins/hardware.yml").write_text(
            (root / "inventories/lab/group_vars/twins/hardware.yml").read_text() + "\n# changed\n"),
    ]
    for change in changes:
        change()
        key = twin.stage_key("engine", "hybrid-moe-kit/twin:bookworm-x-c2", root)
        assert key not in seen
        seen.add(key)
    # Another base image, and a new commit in the fixture repository: new keys.
    key = twin.stage_key("engine", "hybrid-moe-kit/twin:bookworm-y-c2", root)
    assert key not in seen
    seen.add(key)
    (twin.test_work / "f").write_text("two\n")
    subprocess.run([*twin.test_git, "commit", "-q", "-am", "two"], check=True)
    subprocess.run([*twin.test_git, "push", "-q", str(twin.test_repo), "HEAD:refs/heads/main"], check=True)
    assert twin.stage_key("engine", "hybrid-moe-kit/twin:bookworm-y-c2", root) not in seen


def test_missing_fixture_repository_is_named(twin, tmp_path):
    root = _tree(tmp_path / "tree")
    subprocess.run(["rm", "-rf", str(twin.test_repo)], check=True)
    with pytest.raises(twin.TwinError, match="lab-fixtures"):
        twin.stage_key("engine", "base", root)


class FakeDocker:
    """Stands in for the private dockerd's image store: which tags exist, and the calls made."""

    def __init__(self):
        self.images = set()
        self.calls = []

    def run(self, cmd, **_kw):
        self.calls.append(cmd)
        verb = cmd[3:5]
        if verb == ["image", "inspect"]:
            return subprocess.CompletedProcess(cmd, 0 if cmd[5] in self.images else 1, "", "")
        if cmd[3] == "tag":
            self.images.add(cmd[5])
            return subprocess.CompletedProcess(cmd, 0 if cmd[4] in self.images else 1, "", "")
        if cmd[3] == "rmi":
            self.images.discard(cmd[4])
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def fake(twin, monkeypatch):
    docker = FakeDocker()
    built = []

    def build(stage, key, base, tag):
        built.append(key)
        docker.images.add(tag)

    keys = iter(["k1", "k1", "k2", "k2", "k1"])
    monkeypatch.setattr(twin, "run", docker.run)
    monkeypatch.setattr(twin, "container_image", lambda: "hybrid-moe-kit/twin:base")
    monkeypatch.setattr(twin, "stage_key", lambda stage, base: next(keys))
    monkeypatch.setattr(twin, "build_stage", build)
    return docker, built


def test_first_consumer_builds_the_next_finds_it(twin, fake, capsys):
    docker, built = fake
    assert twin.stage_snapshot("engine") == "hybrid-moe-kit/twin:stage-engine-k1"
    assert built == ["k1"]
    assert "hmk-bed-cache: miss engine-k1" in capsys.readouterr().out
    assert twin.stage_snapshot("engine") == "hybrid-moe-kit/twin:stage-engine-k1"
    assert built == ["k1"]
    assert "hmk-bed-cache: hit engine-k1" in capsys.readouterr().out
    assert "hybrid-moe-kit/twin:engine" in docker.images


def test_a_changed_key_is_not_served_from_the_stale_snapshot(twin, fake, capsys):
    docker, built = fake
    twin.stage_snapshot("engine")              # k1 built
    twin.stage_snapshot("engine")              # k1 hit
    capsys.readouterr()
    # The role changed: the key is k2. The k1 image is there and tagged :engine, and must not be used.
    assert twin.stage_snapshot("engine") == "hybrid-moe-kit/twin:stage-engine-k2"
    assert built == ["k1", "k2"]
    out = capsys.readouterr().out
    assert "hmk-bed-cache: miss engine-k2" in out and "hit" not in out
    tag_calls = [c for c in docker.calls if c[3] == "tag"]
    assert tag_calls[-1][4:] == ["hybrid-moe-kit/twin:stage-engine-k2", "hybrid-moe-kit/twin:engine"]
    # The old snapshot is dropped with its marker.
    assert "hybrid-moe-kit/twin:stage-engine-k1" not in docker.images
    assert sorted(p.name for p in (twin.CACHE / "snapshots").glob("*.json")) == ["engine-k2.json"]
    assert json.loads((twin.CACHE / "snapshots" / "engine-k2.json").read_text())["key"] == "k2"
    twin.stage_snapshot("engine")              # k2 hit
    # Back to k1 (a revert): built again, not served from anything stale.
    twin.stage_snapshot("engine")
    assert built == ["k1", "k2", "k1"]


def test_marker_without_image_is_a_miss(twin, fake, capsys):
    docker, built = fake
    twin.stage_snapshot("engine")
    docker.images.discard("hybrid-moe-kit/twin:stage-engine-k1")  # dockerd's store was emptied, the marker stayed
    twin.stage_snapshot("engine")
    assert built == ["k1", "k1"]
    assert capsys.readouterr().out.count("miss engine-k1") == 2


def test_a_failed_build_fails_again_at_once_for_the_same_key(twin, monkeypatch, fake):
    docker, _built = fake
    calls = []

    def broken(stage, key, base, tag):
        calls.append(key)
        raise twin.TwinError("the engine stage did not converge (rc 2); log: /x.log\ntail")

    monkeypatch.setattr(twin, "build_stage", broken)
    with pytest.raises(twin.TwinError, match="did not converge"):
        twin.stage_snapshot("engine")
    with pytest.raises(twin.TwinError, match="failed for key k1 at .*log: /x.log"):
        twin.stage_snapshot("engine")
    assert calls == ["k1"]
