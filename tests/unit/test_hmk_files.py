"""hmk_files: a role's directories and files in one visit, idempotent, atomic, all-or-nothing on bad input,
check mode and diff that tell the truth. The module runs here as Ansible runs it on a node (its own process,
arguments as JSON), against a real filesystem."""
import json
import os
import stat

import pytest

from ansible_collections.hmk.moe_kit.plugins.modules import hmk_files as m
from module_process import run_module

ME = str(os.getuid())
GROUP = str(os.getgid())


def run(tmp_path, check=False, diff=False, logged=None, **args):
    args.update(_ansible_check_mode=check, _ansible_diff=diff)
    return run_module("hmk_files", tmp_path, args, logged)


def layout(tmp_path, key="s3cret"):
    conf = tmp_path / "etc" / "svc"
    return dict(
        directories=[{"path": str(conf), "owner": ME, "group": GROUP, "mode": "0750"}],
        files=[
            {"path": str(conf / "args"), "content": "-m\n/models/x.gguf\n", "owner": ME, "group": GROUP,
             "mode": "0640"},
        ],
        secrets=[
            {"path": str(conf / "api-key"), "owner": ME, "group": GROUP, "mode": "0600"},
        ],
        secret_contents={str(conf / "api-key"): key + "\n"},
    )


def test_first_run_creates_everything_and_the_second_changes_nothing(tmp_path):
    first = run(tmp_path, **layout(tmp_path))
    conf = tmp_path / "etc" / "svc"
    assert first["changed"] is True
    assert first["changed_paths"] == sorted([str(tmp_path / "etc"), str(conf), str(conf / "args"),
                                             str(conf / "api-key")])
    assert (conf / "args").read_text() == "-m\n/models/x.gguf\n"
    assert stat.S_IMODE(os.stat(conf).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(tmp_path / "etc").st_mode) == 0o750  # a created parent gets the same mode
    assert stat.S_IMODE(os.stat(conf / "api-key").st_mode) == 0o600
    again = run(tmp_path, **layout(tmp_path))
    assert again["changed"] is False and again["changed_paths"] == []


def test_a_new_content_replaces_the_file_atomically_and_a_mode_change_keeps_it(tmp_path):
    run(tmp_path, **layout(tmp_path))
    key = tmp_path / "etc" / "svc" / "api-key"
    inode = os.stat(key).st_ino
    changed = run(tmp_path, **layout(tmp_path, key="other"))
    assert changed["changed_paths"] == [str(key)]
    assert key.read_text() == "other\n"
    assert os.stat(key).st_ino != inode  # a new file renamed over the old one, never a half-written one
    assert not [p for p in os.listdir(key.parent) if p.startswith(".")]
    os.chmod(key, 0o644)
    inode = os.stat(key).st_ino
    fixed = run(tmp_path, **layout(tmp_path, key="other"))
    assert fixed["changed_paths"] == [str(key)]
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and os.stat(key).st_ino == inode


def test_check_mode_reports_the_changes_and_makes_none(tmp_path):
    result = run(tmp_path, check=True, **layout(tmp_path))
    assert result["changed"] is True and len(result["changed_paths"]) == 4
    assert not (tmp_path / "etc").exists()


def test_check_mode_takes_an_account_the_run_would_create_first_as_a_change(tmp_path):
    args = layout(tmp_path)
    args["files"][0]["group"] = "no-such-group-hmk"
    result = run(tmp_path, check=True, **args)
    assert result["changed"] is True and result.get("failed") is not True
    assert str(tmp_path / "etc" / "svc" / "args") in result["changed_paths"]
    assert "group 'no-such-group-hmk' does not exist" in run(tmp_path, **args)["msg"]


def test_diff_shows_text_but_never_a_secret_and_the_log_never_holds_content(tmp_path):
    result = run(tmp_path, diff=True, **layout(tmp_path))
    shown = {d["after_header"]: d["after"] for d in result["diff"]}
    conf = tmp_path / "etc" / "svc"
    assert shown[str(conf / "args")] == "-m\n/models/x.gguf\n"
    assert shown[str(conf / "api-key")] == "(not shown, changed)\n"
    assert "s3cret" not in json.dumps(result)  # neither the diff nor the echoed invocation


# A key ends with a newline in its file; some hold a backslash or a quote. Ansible logs a nested option as the repr of
# its parent, where each of these is escaped and no longer matches the no_log value it masks: the key was found in a
# node's journal that way (molecule/gateway, 2026-12-03), when the content was a suboption of secrets.
@pytest.mark.parametrize("key", ["s3cret-plain-0123456789abcdef", "back\\slash-'single\"double-0123456789",
                                 "tab\there-\u00fcnic\u00f6de-0123456789"])
def test_the_nodes_log_of_the_invocation_never_holds_a_secret_in_any_spelling(tmp_path, key):
    logged = []
    result = run(tmp_path, logged=logged, **layout(tmp_path, key=key))
    assert result["changed"] is True
    invoked = [line for line in logged if line.startswith("Invoked with")]
    assert len(invoked) == 1, logged
    assert "secret_contents=NOT_LOGGING_PARAMETER" in invoked[0]
    assert "api-key" in invoked[0]  # the secret's path and mode are still logged, only its text is not
    for spelling in (key, repr(key)[1:-1], repr(key + "\n")[1:-1], json.dumps(key)[1:-1], key[:12]):
        assert spelling not in "\n".join(logged)
    assert (tmp_path / "etc" / "svc" / "api-key").read_text() == key + "\n"


@pytest.mark.parametrize("contents, message", [
    ({}, "secret_contents has no text for "),
    ({"/etc/other": "x"}, "which secrets does not list"),
])
def test_a_secret_without_its_text_or_a_text_without_its_secret_is_refused_by_path(tmp_path, contents, message):
    args = layout(tmp_path)
    key_path = args["secrets"][0]["path"]
    args["secret_contents"] = dict(contents, **({} if not contents else {key_path: "k\n"}))
    result = run(tmp_path, **args)
    assert result.get("failed") is True and message in result["msg"] and "nothing was changed" in result["msg"]
    assert not (tmp_path / "etc").exists()


def test_a_file_without_its_directory_fails_before_anything_is_written(tmp_path):
    args = layout(tmp_path)
    args["files"].append({"path": str(tmp_path / "nowhere" / "f"), "content": "x", "owner": ME, "group": GROUP,
                          "mode": "0644"})
    result = run(tmp_path, **args)
    assert result["failed"] is True
    assert "directory of" in result["msg"] and "nothing was changed" in result["msg"]
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize("bad, message", [
    ({"mode": "644x"}, "is not an octal permission"),
    ({"mode": "17777"}, "is not an octal permission"),
    ({"owner": "no-such-user-hmk"}, "owner 'no-such-user-hmk' does not exist"),
    ({"group": "no-such-group-hmk"}, "group 'no-such-group-hmk' does not exist"),
    ({"path": "relative/args"}, "is not an absolute path"),
])
def test_bad_items_are_refused_by_name(tmp_path, bad, message):
    args = layout(tmp_path)
    args["files"][0].update(bad)
    with pytest.raises(m.FilesError, match=message):
        m.plan(args["directories"], args["files"], [], args["secrets"])


def test_absent_removes_a_file_and_refuses_a_directory(tmp_path):
    run(tmp_path, **layout(tmp_path))
    key = tmp_path / "etc" / "svc" / "api-key"
    assert run(tmp_path, absent=[str(key)])["changed_paths"] == [str(key)]
    assert not key.exists()
    assert run(tmp_path, absent=[str(key)])["changed"] is False
    with pytest.raises(m.FilesError, match="is a directory"):
        m.plan([], [], [str(tmp_path / "etc")])


def test_a_directory_in_the_way_of_a_file_is_refused(tmp_path):
    args = layout(tmp_path)
    os.makedirs(args["files"][0]["path"])
    with pytest.raises(m.FilesError, match="is a directory, not a file"):
        m.plan(args["directories"], args["files"], [], args["secrets"])
