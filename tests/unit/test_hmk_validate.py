"""The shared validator's rules, the node-side checks' parsers, the service account's refusals, the running-process
judge, the dry parse, the model integrity code and the config-file escaping (curl config, unit words, arguments
file): every newline or control character is refused before anything is written."""
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import time
from collections import namedtuple
from pathlib import Path

import pytest

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_validate as v
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_integrity as integrity
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_sync as sync

REPO = Path(__file__).resolve().parents[2]


def _module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


account = _module("hmk_service_account", REPO / "plugins" / "modules" / "hmk_service_account.py")
state = _module("hmk_inference_state", REPO / "plugins" / "modules" / "hmk_inference_state.py")
gate = _module("hmk_inference_gate", REPO / "plugins" / "modules" / "hmk_inference_gate.py")
svc = _module("inference_service_filters", REPO / "plugins" / "filter" / "inference_service.py")

CONTROL = ["a\nb", "a\rb", "a\x00b", "a\x1bb", "a\x7fb", "a\u2028b", "a\x85b", "line\n"]


def refused(rule, value, **opts):
    return v.RULES[rule](value, **opts)


# ----------------------------------------------------------------------------------- full matches only

@pytest.mark.parametrize("rule,good,opts", [
    ("text", "ok", {}), ("component", "tiny-deepseek2", {}), ("abs_path", "/srv/models", {}),
    ("rel_path", "DeepSeek-R1/x.gguf", {}), ("url", "https://models.lab/gguf", {}), ("user", "moe", {}),
    ("sysctl_key", "vm.max_map_count", {}), ("kernel_arg", "iommu=pt", {}), ("sha1", "a" * 40, {}),
    ("journal_since", "-1h", {}), ("unit_name", "hmk-inference.service", {}), ("ip", "127.0.0.1", {}),
    ("cidr", "10.0.0.0/24", {}), ("calendar", "weekly", {}), ("cmake_define", "-DGGML_CUDA=ON", {}),
    ("package", "nvidia-open", {}), ("env_name", "CPU_INSTRUCT", {}), ("regex", "^tiny-", {}),
])
def test_every_rule_accepts_its_value_and_refuses_it_with_a_trailing_newline(rule, good, opts):
    assert refused(rule, good, **opts) is None
    assert refused(rule, good + "\n", **opts), "%s accepted %r" % (rule, good + "\n")


@pytest.mark.parametrize("value", CONTROL)
@pytest.mark.parametrize("rule", ["text", "secret", "abs_path", "url", "component", "rel_path"])
def test_control_characters_and_line_breaks_are_refused_by_every_text_rule(rule, value):
    assert refused(rule, ("/" if rule == "abs_path" else "http://h/" if rule == "url" else "") + value)


def test_python_dollar_would_have_let_the_newline_through():
    import re
    assert re.match(r"^[0-9]{3}$", "570\n")  # why the kit never uses it for validation
    assert v.check({"var": "x", "value": "570\n", "rule": "text", "pattern": "[0-9]{3}"})


# ------------------------------------------------------------------------------------------- the rules

def test_path_components_never_leave_their_directory():
    for bad in ("../../tmp/x", "..", ".", ".hidden", "a/b", "a b", "", "x" * 256, "a;b", "$(id)"):
        assert refused("component", bad), bad
    for bad in ("../x", "/abs", "a//b", "a/../b", "a/.git"):
        assert refused("rel_path", bad), bad
    assert refused("rel_path", "DeepSeek-R1-IQ4_XS/split-00001.gguf") is None


def test_absolute_paths_are_normalised_and_system_directories_are_not_owned():
    assert refused("abs_path", "relative")
    assert refused("abs_path", "/srv/../etc")
    assert refused("abs_path", "/srv/a b")
    assert "system directory /tmp" in refused("abs_path", "/tmp", not_system=True)
    assert "outside /proc" in refused("abs_path", "/proc/sys/vm", not_system=True)
    assert refused("abs_path", "/srv/models", not_system=True) is None
    assert "under /dev" in refused("abs_path", "/tmp/disk", under=["/dev"])


def test_urls_keep_to_their_schemes_and_carry_no_injection():
    assert refused("url", "https://models.lab/gguf?x=1") is None
    for bad in ("ftp://models.lab/x", "http://models.lab/$(id)", "http://models.lab/`id`", "http://models.lab/a b",
                "http://user:pw@models.lab/", "http://models.lab/%0d%0aX", "http://models.lab/%zz", "models.lab/x",
                "http://models.lab/a'b", "http:///nohost"):
        assert refused("url", bad), bad
    assert refused("url", "", allow_empty=True) is None


def test_git_urls_refuse_command_transports_and_options():
    for good in ("https://github.com/ikawrakow/ik_llama.cpp.git", "file:///srv/fixtures/ik_llama.cpp.git",
                 "git@github.com:ikawrakow/ik_llama.cpp.git", "ssh://git@mirror.lab/ik.git"):
        assert refused("git_url", good) is None, good
    for bad in ("ext::sh -c touch% /tmp/p", "fd::17", "--upload-pack=id", "host:-oProxyCommand=x"):
        assert refused("git_url", bad), bad


def test_numbers_ports_and_addresses():
    assert refused("int", 0, min=1) and refused("int", True) and refused("int", "5x")
    assert refused("int", "7", min=1, max=9) is None
    assert "from 1024" in refused("service_port", 22)
    assert refused("service_port", 18551) is None
    for bad in ("300.1.1.1", "localhost", "127.0.0.1\n", "1.2.3"):
        assert refused("ip", bad), bad
    assert refused("ip", "::1") is None
    assert "narrower than /0" in refused("cidr", "0.0.0.0/0")
    assert "narrower than /0" in refused("cidr", "::/0")


def test_secrets_are_masked_and_need_length():
    message = v.check({"var": "k", "value": "short\nsecond", "rule": "secret", "secret": True, "min_length": 24})[0]
    assert "short" not in message and "second" not in message and "<secret, 12 characters>" in message
    assert "line break" in message
    assert refused("secret", "x" * 23, min_length=24)
    assert refused("secret", "x" * 24, min_length=24) is None
    assert refused("secret", "x" * 12 + " " + "x" * 12, no_whitespace=True)


def test_modes_that_let_another_account_write_are_refused():
    assert refused("mode", "0644") is None and refused("mode", "0750") is None
    for bad in ("0666", "0664", "0646", "0777", "644", "420", "0o644"):
        assert refused("mode", bad), bad


def test_the_service_user_is_never_root():
    assert "never root" in refused("user", "root")
    assert refused("user", "root", not_root=False) is None
    assert refused("user", "@moe", allow_group=True) is None
    assert refused("user", "Moe") and refused("user", "moe;id")


def test_unit_names_and_override_rules():
    assert refused("unit_name", "hmk-inference") is None
    assert "with a suffix" in refused("unit_name", "nvidia-persistenced", suffix_optional=False)
    assert refused("unit_name", "a@b.service") and refused("unit_name", "../x.service")
    assert refused("override_tensor", r"blk\.(3|4)\.ffn_.*_exps=CUDA0") is None
    assert refused("override_tensor", "exps=GPU") and refused("override_tensor", "(=CPU")


def test_journal_times_are_journalctl_times_only():
    for good in ("-1h", "-2h 30min", "today", "2026-11-30", "2026-11-30 09:41:02", "+5m"):
        assert refused("journal_since", good) is None, good
    for bad in ("$(reboot)", "-1h; rm -rf /", "-1h\n", "yesterday && id"):
        assert refused("journal_since", bad), bad


def test_gpu_architectures_are_named_when_unknown():
    assert refused("gpu_arch", ["89", "120"]) is None and refused("gpu_arch", "89;120") is None
    message = v.check({"var": "gpus.arch", "value": "77", "rule": "gpu_arch"})[0]
    assert message.startswith('gpus.arch = "77" refused')


def test_composites_name_each_element():
    out = v.check({"var": "xs", "value": ["ok", "bad\n"], "rule": "list", "elements": {"rule": "text"}})
    assert len(out) == 1 and out[0].startswith("xs[1] = ")
    out = v.check({"var": "env", "value": {"BAD NAME": "1"}, "rule": "dict", "keys": {"rule": "env_name"},
                   "values": {"rule": "text"}})
    assert out and out[0].startswith('env["BAD NAME"] key')
    assert v.check({"var": "xs", "value": [], "rule": "list", "min_items": 1})
    assert v.check({"var": "x", "value": 5, "rule": "int", "max": 1, "skip": True}) == []


def test_sysctl_drop_in_lines_stay_single():
    out = v.check({"var": "s", "value": {"vm.swappiness": 10, "kernel.core_pattern": "core\nvm.x=1",
                                         "vm.max_map_count\n": 1, "vm.x": "1 2\t3"},
                   "rule": "sysctl", "string_keys": ["kernel.core_pattern"]})
    assert len(out) == 2
    assert any("kernel.core_pattern" in o and "line break" in o for o in out)
    assert any("vm.max_map_count\\n" in o for o in out)


def test_the_profile_is_checked_in_full_for_the_preflight_and_in_part_elsewhere():
    assert v.check_profile({}) == []
    assert v.check_profile({}, complete=True)
    out = v.check_profile({"cpu": {"numa_nodes_per_socket": 0}})
    assert out == ['hmk_hardware.cpu.numa_nodes_per_socket = 0 refused: an integer from 1 to 8']
    out = v.check_profile({"cpu": {}, "gpus": {"count": 0}, "models_path": "/srv/models", "models_min_free_gb": 1},
                          "p", complete=True)
    assert out and out[0].startswith("p.memory")
    assert v.check_profile({"gpus": {"count": 1, "vram_gib": 24}})[0].startswith("hmk_hardware.gpus")


# --------------------------------------------------------------------------------- on the node itself

def test_proc_sys_paths_follow_sysctl():
    assert v.proc_sys_path("vm.max_map_count") == "/proc/sys/vm/max_map_count"
    assert v.proc_sys_path("net.ipv4.conf.eth0/100.rp_filter") == "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"
    assert v.proc_sys_path("net/ipv4/ip_forward") == "/proc/sys/net/ipv4/ip_forward"


def test_a_missing_sysctl_key_is_refused_in_the_same_words_on_the_node_and_from_kernel_tunings_live_read():
    node = _module("hmk_validate_node", REPO / "plugins" / "modules" / "hmk_validate_node.py")
    filters = _module("hmk_validate_filters", REPO / "plugins" / "filter" / "hmk_validate.py").FilterModule().filters()
    keys = ["vm.max_map_count", "vm.hmk_no_such_key", "net.ipv4.conf.eth0/100.rp_filter"]
    on_node = node.check_sysctl_keys({"var": "kernel_tuning_sysctl", "keys": keys})
    assert len(on_node) == 2 and "a sysctl key this kernel has" in on_node[0]
    assert on_node[0].startswith("kernel_tuning_sysctl[vm.hmk_no_such_key]")
    paths = [filters["hmk_proc_sys_path"](key) for key in keys]
    assert paths[2] == "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"
    found = [path for path in paths if os.path.exists(path)]  # what the role's shell prints
    assert filters["hmk_validate_sysctl_keys"](keys, "kernel_tuning_sysctl", found) == on_node
    assert filters["hmk_validate_sysctl_keys"](keys, "kernel_tuning_sysctl", paths) == []


# /proc/net/tcp and tcp6 as the kernel prints them (sshd on 127.0.0.1:2386, the engine on [::]:18551).
PROC_NET_TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0952 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31337 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0952 0100007F:D3A4 01 00000000:00000000 02:0000A1F0 00000000     0        0 31338 2 0000000000000000 20 4 30 10 -1
"""
PROC_NET_TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  \
timeout inode
   0: 00000000000000000000000000000000:4877 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 4242 1 \
0000000000000000 100 0 0 10 0
"""


def test_listening_sockets_are_parsed_and_overlaps_found():
    listeners = v.parse_proc_net_tcp(PROC_NET_TCP) + v.parse_proc_net_tcp(PROC_NET_TCP6, ipv6=True)
    assert listeners == [("127.0.0.1", 2386, "31337"), ("::", 18551, "4242")]
    assert v.port_holders(2386, "127.0.0.1", listeners, {}) == [("127.0.0.1", "31337", "")]
    assert v.port_holders(2386, "0.0.0.0", listeners, {})
    assert v.port_holders(2386, "127.0.0.2", listeners, {}) == []
    assert v.port_holders(18551, "127.0.0.1", listeners, {})


def test_the_unit_of_a_process_comes_from_its_cgroup():
    v1 = "12:pids:/system.slice/ssh.service\n1:name=systemd:/system.slice/ssh.service\n"
    assert v.unit_of_cgroup(v1) == "ssh.service"
    assert v.unit_of_cgroup("0::/system.slice/hmk-inference.service\n") == "hmk-inference.service"
    assert v.unit_of_cgroup("0::/user.slice/user-0.slice/session-4.scope\n") == "session-4.scope"


# --------------------------------------------------------------------------------- the service account

P = namedtuple("P", "pw_name pw_passwd pw_uid pw_gid pw_gecos pw_dir pw_shell")
G = namedtuple("G", "gr_name gr_passwd gr_gid gr_mem")
USERS = [P("root", "x", 0, 0, "root", "/root", "/bin/bash"),
         P("alice", "x", 1000, 1000, "Alice", "/home/alice", "/bin/bash"),
         P("moe", "x", 998, 998, account.MARK, "/nonexistent", "/usr/sbin/nologin"),
         P("messagebus", "x", 100, 101, "", "/nonexistent", "/usr/sbin/nologin")]
GROUPS = [G("root", "x", 0, []), G("alice", "x", 1000, []), G("moe", "x", 998, []), G("messagebus", "x", 101, []),
          G("adm", "x", 4, ["alice"])]


def test_the_kits_own_account_and_a_new_one_are_accepted():
    assert account.account_problems("moe", "moe", account.MARK, USERS, GROUPS) == []
    assert account.account_problems("inference", "inference", account.MARK, USERS, GROUPS) == []


def test_root_and_accounts_the_kit_did_not_create_are_refused_untouched():
    assert "never root" in account.account_problems("root", "root", account.MARK, USERS, GROUPS)[0]
    message = account.account_problems("alice", "alice", account.MARK, USERS, GROUPS)[0]
    assert "was not created by this kit" in message and "/home/alice" in message and "usermod -c" in message
    assert account.account_problems("messagebus", "messagebus", account.MARK, USERS, GROUPS)
    assert "adm also belongs to alice" in account.account_problems("moe", "adm", account.MARK, USERS, GROUPS)[0]


def test_what_creating_an_account_would_change_is_known_so_a_converged_node_is_visited_once():
    assert v.account_pending("moe", "moe", USERS, GROUPS) == {
        "group_missing": False, "user_missing": False, "wrong_group": False, "pending": False, "uid": 998}
    fresh = v.account_pending("inference", "inference", USERS, GROUPS)
    assert fresh["pending"] and fresh["user_missing"] and fresh["group_missing"] and "uid" not in fresh
    regrouped = v.account_pending("moe", "hmk", USERS, GROUPS)
    assert regrouped["pending"] and regrouped["wrong_group"] and regrouped["group_missing"] and not regrouped["user_missing"]
    assert v.account_pending("moe", "alice", USERS, GROUPS)["wrong_group"]


def test_the_node_check_refuses_accounts_in_the_service_account_modules_words_and_returns_what_is_pending():
    node = _module("hmk_validate_node", REPO / "plugins" / "modules" / "hmk_validate_node.py")
    refusals, states = node.check_accounts(
        [{"name": "moe", "group": "moe", "user_var": "inference_service_user", "group_var": "inference_service_group"},
         {"name": "alice", "user_var": "model_sync_service_user"}], USERS, GROUPS)
    assert refusals == account.account_problems("alice", "alice", account.MARK, USERS, GROUPS,
                                                "model_sync_service_user")
    assert refusals[0].startswith("model_sync_service_user") and "was not created by this kit" in refusals[0]
    assert states == {"moe": v.account_pending("moe", "moe", USERS, GROUPS)}


# ------------------------------------------------------------------------------- the running engine

def test_drift_is_judged_from_the_process_not_the_records():
    argv = ["/opt/hmk/engines/ik_llama.cpp/current/bin/llama-server", "-np", "2"]
    assert state.judge(argv, argv, 100.0, {"/etc/hmk/a.args": 90.0}) == []
    drift = state.judge(argv, argv[:1], 100.0, {"/etc/hmk/a.args": 101.0, "/srv/x.gguf": None},
                        exe="/opt/x/builds/old/bin/llama-server", binary="/opt/x/builds/new/bin/llama-server")
    assert any("lacks 2 argument(s)" in d for d in drift)
    assert any("/etc/hmk/a.args changed after the engine started" == d for d in drift)
    assert any("/srv/x.gguf is missing" == d for d in drift)
    assert any("builds/old" in d and "builds/new" in d for d in drift)


def test_a_process_start_is_placed_to_the_tick_so_a_file_written_just_before_it_is_no_drift(tmp_path):
    # The start was once /proc/stat's btime (whole seconds) + starttime: up to a second early, so a file written in
    # the second before a restart read as changed after it and a converged re-run restarted the engine (CI).
    written = tmp_path / "a.args"
    written.write_text("-np 2\n")
    mtime = written.stat().st_mtime
    time.sleep(0.05)
    before = time.time()
    proc = subprocess.Popen(["sleep", "30"])
    after = time.time()
    try:
        started = state.process_start(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    assert before - tick - 0.005 <= started <= after, (before, started, after)
    assert state.judge([], [], started, {str(written): mtime}) == []


def test_the_gate_fails_early_on_a_failed_or_restarting_unit():
    first = {"ActiveState": "activating", "NRestarts": "0"}
    assert gate.verdict(first, {"ActiveState": "active", "SubState": "running", "NRestarts": "0"}) is None
    assert "failed" in gate.verdict(first, {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "78"})
    assert "restarting" in gate.verdict(first, {"ActiveState": "activating", "SubState": "auto-restart",
                                                "NRestarts": "1", "ExecMainStatus": "1"})


def test_the_gates_failure_names_the_cuda_error_class_its_line_and_what_to_try():
    # a real crash (tests/fixtures/engine-logs/mainline--no-kernel-image-dgx-spark-issue3.log), then a backtrace
    # long enough to push it out of the last lines the message carries
    crash = (REPO / "tests" / "fixtures" / "engine-logs" / "mainline--no-kernel-image-dgx-spark-issue3.log").read_text()
    lines = crash.splitlines() + ["#%d 0x00007e0a5a510813 in ggml_abort ()" % i for i in range(40)]
    msg, errors = gate.failure("hmk-inference.service", "the unit failed (result core-dump, exit status 6)", lines, 25)
    assert [e["class"] for e in errors] == ["no_kernel_image"]
    assert ("CUDA error no_kernel_image: CUDA error: no kernel image is available for execution on the device "
            "Try: ") in msg and "CMAKE_CUDA_ARCHITECTURES" in msg
    assert msg.endswith(" / ".join(lines[-25:])) and "SCALE failed" not in msg.split("Its last journal lines:")[1]
    plain, none = gate.failure("hmk-inference.service", "not ready after 600 s (active/running)", ["loading"], 25)
    assert none == [] and plain == ("hmk-inference.service: not ready after 600 s (active/running). "
                                    "Its last journal lines: loading")


def test_the_dry_parse_swaps_the_model_and_finds_the_parsers_refusals():
    argv = ["/x/llama-server", "-m", "/srv/models/m.gguf", "--port", "18551", "--hmk-no-such-flag"]
    assert svc.dry_parse_argv(argv)[2] == svc.DRY_PARSE_MODEL and svc.dry_parse_argv(argv)[:2] == argv[:2]
    refused_output = ("error: unknown argument: --hmk-no-such-flag\nusage: /x/llama-server [options]\n\n"
                      "general:\n  -h,    --help, --usage          print usage and exit\n")
    assert svc.dry_parse_errors(refused_output)[:2] == ["error: unknown argument: --hmk-no-such-flag",
                                                        "usage: /x/llama-server [options]"]
    accepted_output = ("INFO [main] build info | build=4411 commit=\"55d3c05\"\n"
                       "llama_model_load: error loading model: failed to open /nonexistent/hmk-dry-parse.gguf\n"
                       "ERR [main] unable to load model | model=\"/nonexistent/hmk-dry-parse.gguf\"\n")
    assert svc.dry_parse_errors(accepted_output) == []


def test_slot_reporting_is_always_off_and_cannot_be_switched_back_on():
    opts = {"engine": "ik_llama.cpp", "accepted": ["-t", "--host", "-ngl", "-c", "-ctk", "-ctv", "--metrics"],
            "model": "/m.gguf", "threads": 1}
    assert "--no-slots" in svc.llama_argv(opts)
    for extra in (["--slots"], ["--api-key-file", "/tmp/k"], ["--api-key=abc"]):
        with pytest.raises(svc.AnsibleFilterError):
            svc.llama_argv(dict(opts, extra=extra))


# --------------------------------------------------------------------------- config files take one line

@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b"])
def test_unit_words_and_argument_files_refuse_line_breaks(value):
    with pytest.raises(svc.AnsibleFilterError):
        svc.systemd_word("/etc/hmk/" + value)
    with pytest.raises(svc.AnsibleFilterError):
        svc.args_file(["/x/llama-server", "--alias", value])


def test_catalog_ids_and_file_names_are_refused_before_a_path_is_built(tmp_path):
    files = [{"name": "x.gguf", "size": 1, "sha256": "0" * 64}]
    problems = sync.validate_catalog({"../../tmp/x": {"files": files, "source_dir": "../etc"}}, ["../../tmp/x"])
    assert any("model id" in p for p in problems) and any("source_dir" in p for p in problems)
    with pytest.raises(sync.SyncError, match="model id"):
        sync.Syncer("../../tmp/x", str(tmp_path / "m"), str(tmp_path / "s"), str(tmp_path / "q"), files,
                    sync.Source("local", str(tmp_path)))
    assert sync.validate_catalog({"m": {"files": [dict(files[0], name="a\nb.gguf")]}}, ["m"])


# ------------------------------------------------------------------------------------ model integrity

def _gguf(tmp_path, name="m-00001-of-00001.gguf"):
    """A minimal valid GGUF (v3, no metadata, one tensor) followed by data."""
    import struct
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0)
    tensor = struct.pack("<Q", 1) + b"t" + struct.pack("<I", 1) + struct.pack("<Q", 64) + struct.pack("<I", 0)
    tensor += struct.pack("<Q", 0)
    body = head + tensor
    body += b"\0" * (-len(body) % 32) + bytes(range(256))
    path = tmp_path / name
    path.write_bytes(body)
    return path


def test_the_prestart_check_names_a_missing_truncated_or_unreadable_file(tmp_path):
    good = _gguf(tmp_path)
    manifest = {"files": [{"path": str(good), "size": good.stat().st_size}]}
    assert integrity.prestart_problems(manifest) == []
    good.write_bytes(good.read_bytes()[:-10])
    assert "is %d bytes, %d were recorded" % (good.stat().st_size, good.stat().st_size + 10) in \
        integrity.prestart_problems(manifest)[0]
    garbage = tmp_path / "g.gguf"
    garbage.write_bytes(b"NOTGGUF" + b"\0" * 100)
    assert "no readable GGUF header" in integrity.prestart_problems({"files": [{"path": str(garbage), "size": 107}]})[0]
    assert "is missing" in integrity.prestart_problems({"files": [{"path": str(tmp_path / "nope.gguf"), "size": 1}]})[0]


def test_the_rehash_quarantines_a_flipped_bit_and_keeps_the_rest(tmp_path):
    root, stamps, quarantine = tmp_path / "models", tmp_path / "models" / ".hmk-sync", tmp_path / "models" / ".quarantine"
    (root / "m").mkdir(parents=True)
    (stamps / "m").mkdir(parents=True)
    for name, data in (("a.gguf", b"a" * 1000), ("b.gguf", b"b" * 1000)):
        (root / "m" / name).write_bytes(data)
        (stamps / "m" / (name + ".json")).write_text(json.dumps({"sha256": hashlib.sha256(data).hexdigest(),
                                                                 "size": 1000}))
    before = os.stat(root / "m" / "b.gguf")
    with open(root / "m" / "b.gguf", "r+b") as handle:
        handle.seek(500)
        handle.write(b"c")
    os.utime(root / "m" / "b.gguf", ns=(before.st_atime_ns, before.st_mtime_ns))
    record = integrity.rehash(str(root), str(stamps), str(quarantine))
    assert not record["ok"] and record["files_checked"] == 2
    assert [m["file"] for m in record["mismatches"]] == ["b.gguf"]
    assert not (root / "m" / "b.gguf").exists() and not (stamps / "m" / "b.gguf.json").exists()
    assert Path(record["mismatches"][0]["quarantined_to"]).read_bytes()[500:501] == b"c"
    assert (root / "m" / "a.gguf").exists()
    prom = integrity.metrics(record)
    assert "hmk_model_integrity_ok 0\n" in prom
    assert 'hmk_model_integrity_file_mismatch{model="m",file="b.gguf"} 1' in prom
    again = integrity.rehash(str(root), str(stamps), str(quarantine))
    assert again["ok"] and again["files_checked"] == 1


def test_the_gate_sends_the_smoke_completion_with_the_key_and_returns_what_came_back():
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = []

    class Engine(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the handler's name is http.server's
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            if self.headers.get("Authorization") != "Bearer k3y":
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"error": {"message": "Invalid API Key"}}')
                return
            answer = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 3}})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(answer.encode())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/v1/chat/completions" % server.server_port
        smoke = {"url": url, "model": "default", "prompt": "Say hi", "max_tokens": 8, "timeout": 10}
        assert gate.completion(smoke, "k3y") == {"status": 200, "json": {"choices": [{"message": {"content": "hi"}}],
                                                                         "usage": {"completion_tokens": 3}}}
        assert seen[0] == ("/v1/chat/completions", "Bearer k3y",
                           {"model": "default", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8})
        refused = gate.completion(smoke, "")
        assert refused["status"] == 401 and refused["json"]["error"]["message"] == "Invalid API Key"
        assert seen[1][1] is None
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    down = gate.completion(dict(smoke, url="http://127.0.0.1:%d/v1/chat/completions" % closed))
    assert down["status"] == 0 and down["json"] == {} and down["error"]


@pytest.mark.parametrize("key", ["plain-key-0123456789abcdefgh", "back\\slash-'single\"double-0123456789"])
def test_the_gates_log_of_its_invocation_on_the_node_never_holds_the_key(tmp_path, key):
    # A refused timeout ends the run at once: the invocation is logged before anything else.
    from module_process import run_module
    logged = []
    result = run_module("hmk_inference_gate", tmp_path, {
        "unit": "hmk-inference.service", "url": "http://127.0.0.1:9/health", "timeout": 0,
        "smoke": {"url": "http://127.0.0.1:9/v1/chat/completions", "model": "default", "prompt": "Say hi"},
        "smoke_api_key": key}, logged)
    assert result["failed"] is True and "timeout" in result["msg"]
    invoked = [line for line in logged if line.startswith("Invoked with")]
    assert len(invoked) == 1 and "smoke_api_key=NOT_LOGGING_PARAMETER" in invoked[0], logged
    for spelling in (key, repr(key)[1:-1], json.dumps(key)[1:-1], key[:12]):
        assert spelling not in "\n".join(logged) and spelling not in json.dumps(result)


# ------------------------------------------------------------------------- classes of bad value (issue 27)
# Each class is refused by every rule that takes that kind of value, whatever the spelling, and the refusal says why.

NAN_AND_INFINITIES = [float("nan"), float("inf"), float("-inf"), "nan", "NaN", "-nan", "inf", "+inf", "-Infinity",
                      "INFINITY", "1e999", "-1e999", "1E400"]
NUMBER_RULES = [("int", {}), ("int", {"min": 0, "max": 100}), ("number", {}), ("number", {"min": 0, "max": 1024}),
                ("port", {}), ("service_port", {})]


@pytest.mark.parametrize("rule,opts", NUMBER_RULES)
@pytest.mark.parametrize("value", NAN_AND_INFINITIES, ids=str)
def test_nan_and_infinities_are_refused_by_every_number_rule_with_or_without_bounds(rule, opts, value):
    problem = refused(rule, value, **opts)
    assert problem and "not NaN or an infinity" in problem, problem


BOOLEANS = [True, False, "yes", "no", "on", "off", "true", "False", "YES"]


@pytest.mark.parametrize("rule,opts", NUMBER_RULES)
@pytest.mark.parametrize("value", BOOLEANS, ids=str)
def test_booleans_are_refused_where_a_number_count_or_port_belongs(rule, opts, value):
    # bool is a subclass of int in Python, and YAML 1.1 reads an unquoted yes as true: yes would count as 1.
    problem = refused(rule, value, **opts)
    assert problem and "not a boolean" in problem, problem


def test_numbers_keep_their_ordinary_spellings():
    for good in (0, 5, 2.5, "3", "0.25", "-1", "1e3", ".5"):
        assert refused("number", good) is None, good
    for bad in (" 5", "5 ", "1_000", "0x10", "", None, [1], {"a": 1}):
        assert refused("number", bad), bad


ZONE_INJECTIONS = ["fe80::1%eth0\n", "fe80::1%eth0\nExecStartPre=/bin/sh", "fe80::1%'eth0'", 'fe80::1%"x"',
                   "fe80::1%$(id)", "fe80::1%`id`", "fe80::1%a b", "fe80::1%%", "fe80::1%a/b", "fe80::1%",
                   "fe80::1%" + "x" * 16, "fe80::1%eth0;reboot"]


@pytest.mark.parametrize("value", ZONE_INJECTIONS)
def test_zone_ids_are_plain_interface_tokens(value):
    problem = refused("ip", value)
    assert problem and "zone ID" in problem, problem


def test_a_zone_id_only_on_a_link_local_address_and_never_in_an_allow_list():
    for good in ("fe80::1%eth0", "fe80::1%2", "fe80::abcd%enp1s0f0.100"):
        assert refused("ip", good) is None, good
    for bad in ("::1%lo", "::1%eth0", "2001:db8::1%eth0"):
        assert "link-local" in refused("ip", bad), bad
    for bad in ("::1%lo/128", "fe80::%eth0/64"):
        assert "without a zone ID" in refused("cidr", bad), bad


def test_an_address_with_a_zone_id_is_never_loopback():
    # ::1%... used to be loopback, which drops the API key requirement of a node that listens there.
    filters = _module("hmk_validate_filters_lo", REPO / "plugins" / "filter" / "hmk_validate.py").FilterModule().filters()
    for host in ("::1%lo", "::1%$(id)", "::1%eth0\n", "[::1%lo]", "localhost", "127.0.0.1.evil.lab", "", None, ["::1"]):
        assert v.loopback_address(host) is False, host
        assert filters["hmk_is_loopback"](host) is False, host
    for host in ("127.0.0.1", "127.3.2.1", "::1", "[::1]"):
        assert v.loopback_address(host) is True, host
    assert filters["hmk_is_loopback"]("::1") is True


def test_ports_outside_1_to_65535_are_refused_whatever_bounds_a_caller_gives():
    for value, opts in ((0, {}), ("0", {}), (65536, {}), (-1, {}), (0, {"min": 0}), (70000, {"max": 70000}),
                        (65536, {"max": 100000}), (0, {"min": -5, "max": 100000})):
        problem = refused("port", value, **opts)
        assert problem and "from 1 to 65535" in problem, (value, opts, problem)
    # a caller's bounds still narrow the range
    assert refused("port", 80, min=1024) and refused("port", 1024, min=1024) is None
    assert refused("port", 65535) is None and refused("port", 1) is None


def test_a_port_in_a_url_is_a_port_too():
    for url in ("http://models.lab:0/gguf", "https://hub.lab:65536", "https://hub.lab:99999/x", "http://[::1]:70000/",
                "https://hub.lab:00000/"):
        problem = refused("url", url)
        assert problem and "a port from 1 to 65535" in problem, (url, problem)
    for good in ("https://hub.lab:443/", "http://127.0.0.1:18581", "http://[::1]:8080/x", "https://hub.lab:1"):
        assert refused("url", good) is None, good


def test_a_url_that_carries_a_token_is_https_unless_loopback():
    for url in ("http://huggingface.co", "http://hub.lab:8080/api", "http://127.0.0.1.hub.lab/", "http://localhost:18581",
                "http://10.0.0.5:8080", "http://[fe80::1]/", "HTTP://hub.lab/"):
        problem = refused("url", url, carries_secret=True)
        assert problem and "an https:// URL" in problem and "loopback" in problem, (url, problem)
        assert refused("url", url) is None  # the same URL without a token to send is fine
    # The test beds' stand-in Hub and store listen on 127.0.0.1 over http (molecule/model_sync_hub, _transfer).
    for good in ("http://127.0.0.1:18581", "http://127.0.0.1:18431/models", "http://[::1]:8080", "https://hub.lab",
                 "https://10.0.0.5:8443/x"):
        assert refused("url", good, carries_secret=True) is None, good


def test_the_hub_endpoint_and_an_authenticated_store_are_declared_as_carrying_a_token():
    specs = (REPO / "roles" / "model_sync" / "vars" / "main.yml").read_text()
    import yaml
    by_var = dict((s["var"], s) for s in yaml.safe_load(specs)["__model_sync_input_specs"])
    assert by_var["model_sync_hub_endpoint"].get("carries_secret") is True
    assert "model_sync_http_token" in str(by_var["model_sync_http_base_url"].get("carries_secret"))


def test_huge_and_odd_values_end_in_a_refusal_not_an_exception():
    huge = 10 ** 5000
    assert "about 5001 digits" in v.refusal("x", huge, "a number")
    assert v.show([huge]) and v.show({"a": huge})
    assert refused("int", "9" * 5000) and refused("port", huge) and refused("number", huge, max=10)
    assert refused("int", huge, max=10) and v.check({"var": "n", "value": huge, "rule": "int", "max": 10})
    for value in (None, [1], {"a": 1}, "\udcff", "a\x00b", huge, float("nan")):
        for rule in v.RULES:
            v.check({"var": "x", "value": value, "rule": rule})
        assert v.check({"var": "s", "value": {"vm.x": value, "kernel.y": value}, "rule": "sysctl",
                        "string_keys": ["kernel.y"]})
        assert v.check_profile({"cpu": {"sockets": value}, "gpus": {"count": value}, "models_min_free_gb": value})


# Filters: a wrong-typed argument ends in AnsibleFilterError naming the filter and its arguments.
FILTER_FILES = ["doctor", "hmk_nvidia", "hmk_validate", "inference_service", "kernel_tuning", "ktransformers_build",
                "llama_build", "monitoring", "validate"]
WRONG_TYPES = [None, [1, 2], {"a": 1}, 10 ** 30, "x\n\x00y", [None], {"a": {"b": None}}]


@pytest.mark.parametrize("name", FILTER_FILES)
def test_every_filter_refuses_wrong_types_without_a_python_exception(name):
    from ansible.errors import AnsibleFilterError
    plugin = importlib.import_module("ansible_collections.hmk.moe_kit.plugins.filter." + name)
    failures = []
    for filter_name, function in plugin.FilterModule().filters().items():
        count = len([p for p in inspect.signature(function).parameters.values()
                     if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)])
        for value in WRONG_TYPES:
            try:
                function(*([value] * max(count, 1)))
            except AnsibleFilterError:
                pass
            except Exception as exc:  # noqa: BLE001 - what is looked for is any exception Python raised by itself
                if type(exc).__module__ == "builtins":
                    failures.append("%s(%s): %s: %s" % (filter_name, v.show(value)[:30], type(exc).__name__, exc))
    assert not failures, "\n".join(failures[:20])


def test_a_filters_refusal_names_the_filter_and_each_argument():
    from ansible.errors import AnsibleFilterError
    plugin = importlib.import_module("ansible_collections.hmk.moe_kit.plugins.filter.inference_service")
    ready_timeout = plugin.FilterModule().filters()["inference_service_ready_timeout"]
    with pytest.raises(AnsibleFilterError) as err:
        ready_timeout([1, 2], 60, 2)
    message = str(err.value)
    assert "inference_service_ready_timeout" in message and "model_bytes = a list of 2 item(s)" in message, message
    assert "base = 60" in message and "per_gb = 2" in message, message


def test_a_secret_argument_of_a_filter_is_shown_by_its_length_only():
    def needs_a_dict(opts, api_key):
        return opts["x"]
    guarded = v.guard_filters({"f": needs_a_dict}, RuntimeError)["f"]
    with pytest.raises(RuntimeError) as err:
        guarded("not a dict", "sk-0123456789abcdef")
    assert "sk-0123" not in str(err.value) and "api_key = <secret, 19 characters>" in str(err.value)


def test_the_scrape_targets_ports_and_addresses_are_checked():
    from ansible.errors import AnsibleFilterError
    plugin = importlib.import_module("ansible_collections.hmk.moe_kit.plugins.filter.monitoring")
    scrape = plugin.FilterModule().filters()["monitoring_scrape_configs"]
    good = {"name": "node-a", "address": "10.0.0.5", "node_exporter_port": 9100, "engine_port": 8080,
            "engine_key": True, "gpu_exporter_port": 0}
    assert scrape([good])
    for key, value, words in (("engine_port", 0, "inference_service_port"),
                              ("node_exporter_port", 65536, "monitoring_node_exporter_port"),
                              ("gpu_exporter_port", 70000, "monitoring_dcgm_exporter_port"),
                              ("engine_port", True, "not a boolean"), ("engine_port", "abc", "inference_service_port"),
                              ("address", "10.0.0.5\n- targets: [evil:80]", "monitoring_scrape_address"),
                              ("address", "fe80::1%$(id)", "monitoring_scrape_address")):
        with pytest.raises(AnsibleFilterError) as err:
            scrape([dict(good, **{key: value})])
        assert words in str(err.value) and "node-a" in str(err.value), str(err.value)


# Modules: every one ends a bad argument in a refusal that names it (run as Ansible runs them, in their own process).
@pytest.mark.parametrize("module,args,words", [
    ("hmk_validate_node", {"ports": [{"var": "inference_service_port", "port": "abc"}]}, "inference_service_port"),
    ("hmk_validate_node", {"ports": [{"var": "inference_service_port", "port": 0}]}, "a TCP port from 1 to 65535"),
    ("hmk_validate_node", {"ports": [{"var": "inference_service_port", "port": True}]}, "not a boolean"),
    ("hmk_validate_node", {"ports": [{"var": "inference_service_port"}]}, "inference_service_port = null"),
    ("hmk_validate_node", {"ports": [{"var": "p", "port": 8080, "host": "::1%$(id)"}]}, "zone ID"),
    ("hmk_validate_node", {"paths": [{"var": "model_path", "path": ["/srv"]}]}, "model_path"),
    ("hmk_validate_node", {"paths": [{"path": "/srv"}]}, "paths[0].var"),
    ("hmk_validate_node", {"sysctl_keys": {"var": "kernel_tuning_sysctl", "keys": "vm.swappiness"}},
     "kernel_tuning_sysctl = \"vm.swappiness\" refused: a list of sysctl key names"),
    ("hmk_roofline_chart", {"spec": {"points": [None]}, "path": "/nonexistent/chart.png"}, "spec.points[0]"),
    ("hmk_roofline_chart", {"spec": {"points": [{"gb_per_token": "nan", "tps": 5, "label": "x"}]},
                            "path": "/nonexistent/chart.png"}, "spec.points[0].gb_per_token"),
    ("hmk_hardware_facts", {"profile": {"cpu": {"sockets": "x"}}}, "profile.cpu.sockets"),
    ("hmk_hardware_facts", {"profile": {"memory": {"channels_per_socket": float("nan"), "min_speed_mts": 4800}}},
     "profile.memory.channels_per_socket"),
    ("hmk_hardware_facts", {"profile": {"gpus": {"count": True}}}, "profile.gpus.count"),
    ("hmk_inference_gate", {"unit": "hmk-none.service", "url": "http://127.0.0.1:1/health", "since": float("nan"),
                            "timeout": 1}, "since"),
    ("hmk_inference_gate", {"unit": "hmk-none.service", "url": "http://127.0.0.1:1/health", "timeout": -1}, "timeout"),
    ("hmk_probe", {"paths": ["/tmp/a\x00b"]}, "paths[0]"),
    ("hmk_probe", {"listdirs": [{"path": "/tmp", "pattern": "("}]}, "listdirs[0].pattern"),
])
def test_every_module_refuses_a_bad_argument_by_name_without_a_traceback(tmp_path, module, args, words):
    from module_process import run_module
    result = run_module(module, tmp_path, args)
    assert result.get("failed") and "exception" not in result, result
    assert words in result["msg"], result["msg"]
