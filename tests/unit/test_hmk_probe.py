"""hmk_probe: everything a role decides on, read from the node in one visit and never changed. The module runs here
as Ansible runs it on a node (its own process, arguments as JSON), against a real filesystem, a real git checkout
and this machine's own dpkg database and systemd answers where it has them."""
import json
import os
import shutil
import subprocess

import pytest

from ansible_collections.hmk.moe_kit.plugins.modules import hmk_probe as m
from module_process import run_module


def run(tmp_path, check=False, **args):
    args.update(_ansible_check_mode=check)
    return run_module("hmk_probe", tmp_path, args)


def build_tree(tmp_path):
    """An engine root as llama_build leaves it: two builds (one without its record), current linking one."""
    root = tmp_path / "llama"
    for key, record in (("aaa", True), ("bbb", False)):
        (root / "builds" / key / "bin").mkdir(parents=True)
        if record:
            (root / "builds" / key / "build-record.json").write_text('{"commit": "abc"}\n')
        binary = root / "builds" / key / "bin" / "llama-server"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    (root / "builds" / "stray-file").write_text("")
    os.symlink("builds/aaa", str(root / "current"))
    os.symlink("builds/gone", str(root / "dangling"))
    return root


def test_paths_answer_type_link_target_and_executable(tmp_path):
    root = build_tree(tmp_path)
    out = m.path_facts(str(root / "current"))
    assert out["exists"] and out["type"] == "link" and out["lnk_target"] == "builds/aaa"
    assert out["target_type"] == "directory" and not out["executable"]
    binary = m.path_facts(str(root / "current" / "bin" / "llama-server"))
    assert binary["type"] == "file" and binary["executable"] and binary["mode"] == "0755"
    (root / "builds" / "aaa" / "bin" / "llama-server").chmod(0o644)
    assert not m.path_facts(str(root / "current" / "bin" / "llama-server"))["executable"]
    dangling = m.path_facts(str(root / "dangling"))
    assert dangling["exists"] and dangling["type"] == "link" and dangling["target_type"] == "missing"
    assert not dangling["executable"]
    assert m.path_facts("/dev/null")["type"] == "char"  # /dev/nvidia-uvm is judged the same way
    missing = m.path_facts(str(root / "nothing"))
    assert missing == {"exists": False, "type": "missing", "lnk_target": "", "target_type": "missing", "executable": False}


def test_read_follows_links_and_answers_null_for_a_missing_file(tmp_path):
    root = build_tree(tmp_path)
    assert m.read_text(str(root / "current" / "build-record.json")) == '{"commit": "abc"}\n'
    assert m.read_text(str(root / "builds" / "bbb" / "build-record.json")) is None


def test_read_refuses_a_large_or_binary_file(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * (m.MAX_READ + 1))
    with pytest.raises(m.ProbeError, match="over"):
        m.read_text(str(big))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(m.ProbeError, match="not UTF-8"):
        m.read_text(str(binary))


def test_listdir_with_marker_and_pattern(tmp_path):
    root = build_tree(tmp_path)
    entries = m.list_dir(str(root / "builds"), marker="build-record.json")
    assert [(e["name"], e["type"], e["marker"]) for e in entries] == [
        ("aaa", "directory", True), ("bbb", "directory", False), ("stray-file", "file", False)]
    assert all(e["path"] == str(root / "builds" / e["name"]) and e["mtime"] > 0 for e in entries)
    nodes = tmp_path / "node"
    for name in ("node0", "node1", "node10", "possible", "has_cpu", "nodeX"):
        (nodes / name).mkdir(parents=True)
    assert [e["name"] for e in m.list_dir(str(nodes), pattern="node[0-9]+")] == ["node0", "node1", "node10"]
    assert m.list_dir(str(tmp_path / "absent")) == []
    assert m.list_dir(str(root / "builds" / "stray-file")) == []


def test_cpu_flags_line_x86_and_arm():
    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16\nbugs\t\t: sysret_ss_attrs\n"
    assert m.cpu_flags_line(x86) == "flags\t\t: fpu avx2 avx512f avx512_bf16"
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm sve\nCPU implementer\t: 0x41\n"
    assert m.cpu_flags_line(arm) == "Features\t: fp asimd evtstrm sve"
    assert m.cpu_flags_line("processor : 0\n") == ""


DPKG_STATUS = """Package: cmake
Status: install ok installed
Priority: optional
Version: 3.25.1-1
Description: cross-platform, open-source make system
 CMake is used to control the software compilation process using

Package: ccache
Status: deinstall ok config-files
Version: 4.8+really4.7.5-1

Package: git
Status: install ok half-configured
Version: 1:2.39.5-0+deb12u2

Package: pkg-config
Status: install ok installed
Version: 1.8.1-1
"""


def test_dpkg_status_only_fully_installed_packages_count():
    assert m.parse_dpkg_status(DPKG_STATUS, ["cmake", "ccache", "git", "pkg-config", "build-essential"]) == {
        "cmake": "3.25.1-1", "ccache": None, "git": None, "pkg-config": "1.8.1-1", "build-essential": None}


def test_dpkg_status_of_this_machine_agrees_with_dpkg_query():
    if not os.path.exists("/var/lib/dpkg/status") or not shutil.which("dpkg-query"):
        pytest.skip("no dpkg database on this machine")
    names = ["dpkg", "coreutils", "hmk-no-such-package"]
    ours = m.parse_dpkg_status(m.read_text_large("/var/lib/dpkg/status"), names)
    for name in names:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}", name],
                              capture_output=True, text=True, check=False)
        installed = proc.returncode == 0 and proc.stdout.startswith("ii")
        assert ours[name] == (proc.stdout.split("|", 1)[1] if installed else None), name


def test_systemctl_show_blocks_are_matched_to_units_in_order():
    text = ("LoadState=loaded\nUnitFileState=enabled\nActiveState=active\nSubState=waiting\n\n"
            "LoadState=not-found\nUnitFileState=\nActiveState=inactive\nSubState=dead\n")
    out = m.parse_systemctl_show(text, ["hmk-model-rehash.timer", "hmk-model-peer.service"])
    assert out["hmk-model-rehash.timer"] == {"LoadState": "loaded", "UnitFileState": "enabled", "ActiveState": "active",
                                             "SubState": "waiting"}
    assert out["hmk-model-peer.service"]["LoadState"] == "not-found"
    assert m.parse_systemctl_show("", ["a.service"])["a.service"]["ActiveState"] == "inactive"


def git(repo, *args):
    env = dict(os.environ, GIT_AUTHOR_DATE="2026-04-13T10:00:00Z", GIT_COMMITTER_DATE="2026-04-13T10:00:00Z",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.invalid")
    return subprocess.run(["git", "-C", str(repo)] + list(args), capture_output=True, text=True, env=env,
                          check=True).stdout.strip()


def test_git_commit_reads_the_local_checkout_only(tmp_path):
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f").write_text("1")
    git(repo, "add", "f")
    git(repo, "commit", "-qm", "one")
    sha = git(repo, "rev-parse", "HEAD")
    out = m.git_commit(str(repo), sha + "^{commit}")
    assert out["rc"] == 0 and out["stdout"] == sha + " 2026-04-13"
    assert m.git_commit(str(repo), "0" * 40 + "^{commit}")["rc"] != 0
    assert m.git_commit(str(tmp_path / "nothing"), sha)["rc"] != 0


def test_the_module_answers_everything_in_one_run_and_changes_nothing(tmp_path):
    root = build_tree(tmp_path)
    before = sorted(os.path.join(d, f) for d, _unused, files in os.walk(str(root)) for f in files)
    out = run(tmp_path, check=True,
              paths=[str(root / "current"), str(root / "current/bin/llama-server"), str(root / "none")],
              read=[str(root / "current/build-record.json"), str(root / "builds/bbb/build-record.json")],
              listdirs=[{"path": str(root / "builds"), "marker": "build-record.json"}],
              cpu_flags=True, packages=["dpkg"] if os.path.exists("/var/lib/dpkg/status") else [],
              git=[{"repo": str(root / "src"), "rev": "HEAD"}])
    assert out["changed"] is False and "failed" not in out, out
    assert out["paths"][str(root / "current")]["lnk_target"] == "builds/aaa"
    assert out["paths"][str(root / "current/bin/llama-server")]["executable"] is True
    assert out["paths"][str(root / "none")]["exists"] is False
    assert json.loads(out["contents"][str(root / "current/build-record.json")]) == {"commit": "abc"}
    assert out["contents"][str(root / "builds/bbb/build-record.json")] is None
    assert [e["name"] for e in out["dirs"][str(root / "builds")] if e["marker"]] == ["aaa"]
    assert out["git"][0]["rc"] != 0
    if os.path.exists("/proc/cpuinfo"):
        assert out["cpu_flags"].split(":")[0].strip() in ("flags", "Features")
    assert sorted(os.path.join(d, f) for d, _unused, files in os.walk(str(root)) for f in files) == before


def test_the_module_fails_with_the_path_on_an_unreadable_answer(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * (m.MAX_READ + 1))
    out = run(tmp_path, read=[str(big)])
    assert out["failed"] and str(big) in out["msg"]


def test_the_service_account_check_says_pending_even_where_changed_when_masks_changed(tmp_path):
    """The roles validate the account in check mode (changed_when: false) and visit again only when it is pending."""
    out = run_module("hmk_service_account", tmp_path, {"name": "hmk-no-such-account", "_ansible_check_mode": True})
    assert out["changed"] is True and out["pending"] is True and out["created"] is True


def test_the_probe_reads_a_model_layout_as_hmk_gguf_layout_does(tmp_path):
    from conftest_model_sync import catalog, generate

    from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_gguf import layout

    entry = catalog()["tiny-deepseek2"]
    paths = sorted(p for p in generate(str(tmp_path / "model"), entry["generator"], "tiny-deepseek2") if p.endswith(".gguf"))
    out = run(tmp_path, gguf_layout=paths[0])
    assert "failed" not in out, out
    assert out["gguf_layout"] == json.loads(json.dumps(layout(paths[0])))
    assert out["gguf_layout"]["expert_bytes"] and out["gguf_layout"]["files"][0]["path"] == paths[0]
    assert run(tmp_path, paths=["/"])["gguf_layout"] == {}
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"NOTGGUF" + b"\0" * 64)
    failed = run(tmp_path, gguf_layout=str(broken))
    assert failed["failed"] and failed["msg"].startswith("cannot read the model's tensor table")
