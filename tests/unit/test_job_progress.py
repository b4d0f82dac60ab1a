"""Progress that looks like progress (issue 29 item 4): the build scripts write the compiler's output straight to their
log, hmk_job_progress returns the compiler's own count read from the log's end with async_status's result, and the
hmk_progress stdout callback prints it at each retry instead of FAILED - RETRYING, every other line being the default
callback's; with `model` the same for a model sync, from hmk_model_fetch's own log lines."""
import os
import shlex
import subprocess

import jinja2
import pytest
from ansible import constants as C
from ansible.executor.task_result import CallbackTaskResult
from ansible.inventory.host import Host
from ansible.playbook.task import Task
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

from ansible_collections.hmk.moe_kit.plugins.action import hmk_job_progress
from ansible_collections.hmk.moe_kit.plugins.callback.hmk_progress import CallbackModule

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LLAMA = os.path.join(ROOT, "roles", "llama_build", "templates", "build.sh.j2")
KT = os.path.join(ROOT, "roles", "ktransformers_build", "templates", "build.sh.j2")
TASK = "Checked every 15 s, the compiler has produced build b1"


# --- the stdout callback ------------------------------------------------------------------------------------------

class FakeDisplay:
    verbosity = 0

    def __init__(self):
        self.lines = []

    def display(self, msg, color=None, stderr=False, screen_only=False, log_only=False, newline=True):
        self.lines.append((msg, color))


def retry(callback_class, extra):
    display = FakeDisplay()
    callback = callback_class()
    callback._display = display
    callback.set_options()
    data = dict(attempts=3, retries=962, finished=False, started=True, ansible_job_id="j1.2", **extra)
    callback.v2_runner_retry(CallbackTaskResult(Host("epyc-node"), Task(), data, {"name": TASK}))
    return display.lines


def test_a_retry_with_progress_prints_the_calm_line():
    lines = retry(CallbackModule, {"hmk_progress": "312/1024 objects compiled (30%), 4m10s elapsed"})
    assert lines == [("  [epyc-node] %s: 312/1024 objects compiled (30%%), 4m10s elapsed" % TASK, C.COLOR_DEBUG)]
    assert "FAILED" not in lines[0][0] and "retries left" not in lines[0][0]


def test_a_retry_without_progress_prints_the_default_line_unchanged():
    ours = retry(CallbackModule, {})
    assert ours == retry(DefaultCallback, {})
    assert ours == [("FAILED - RETRYING: [epyc-node]: %s (959 retries left)." % TASK, C.COLOR_DEBUG)]


def test_the_callback_changes_only_the_retry_line():
    changed = [name for name, value in vars(CallbackModule).items() if callable(value) and not name.startswith("__")]
    assert changed == ["v2_runner_retry"]


# --- the action plugin --------------------------------------------------------------------------------------------

class FakeShell:
    @staticmethod
    def join_path(*parts):
        return "/".join(parts)


class FakeConnection:
    _shell = FakeShell()


def action(responses, args):
    """hmk_job_progress with _execute_module answered from `responses` (module name -> result), and the calls kept."""
    plugin = hmk_job_progress.ActionModule.__new__(hmk_job_progress.ActionModule)
    plugin._task = type("T", (), {"args": args, "async_val": 0, "check_mode": False, "diff": False,
                                  "environment": None, "no_log": False, "action": "hmk_job_progress"})()
    plugin._connection = FakeConnection()
    plugin.calls = []

    def execute(module_name=None, module_args=None, task_vars=None, **kwargs):
        plugin.calls.append((module_name, dict(module_args)))
        return dict(responses[module_name])

    def low_level(cmd, sudoable=True, **kwargs):
        plugin.calls.append(("command", cmd))
        return dict(responses["command"])

    plugin._execute_module = execute
    plugin._low_level_execute_command = low_level
    plugin.get_shell_option = lambda option, default=None: default
    plugin._remote_expand_user = lambda path: path.replace("~", "/root")
    return plugin


@pytest.fixture
def base_run(monkeypatch):
    """ActionBase.run's own work (connection checks, tmp) is not what is tested here."""
    monkeypatch.setattr(hmk_job_progress.ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    monkeypatch.setattr(hmk_job_progress.time, "time", lambda: 1000250.0)


ARGS = {"jid": "j1.2", "log": "/opt/b 1.log"}
RUNNING = {"started": 1, "finished": 0, "ansible_job_id": "j1.2"}
MARK = hmk_job_progress._TAIL_MARK


def test_a_running_job_returns_async_status_and_the_progress_from_its_log(base_run):
    log = "== configure 1970-01-12T13:46:40Z\n%s\n== build 1970-01-12T13:46:49Z\n[312/1024] Building CXX ops.o\n" % MARK
    plugin = action({"ansible.builtin.async_status": RUNNING, "command": {"rc": 0, "stdout": log}}, ARGS)
    result = plugin.run(task_vars={})
    assert result["finished"] is False and result["started"] is True
    assert result["ansible_job_id"] == "j1.2" and result["results_file"] == "/root/.ansible_async/j1.2"
    assert result["hmk_progress"] == "312/1024 objects compiled (30%), 4m10s elapsed"
    # The log's path is quoted for the node's shell; the log itself is only read.
    assert plugin.calls == [
        ("ansible.builtin.async_status", {"jid": "j1.2", "mode": "status", "_async_dir": "/root/.ansible_async"}),
        ("command", "head -n 1 -- '/opt/b 1.log' && echo %s && tail -n 80 -- '/opt/b 1.log'" % MARK),
    ]


def test_a_missing_log_is_no_error(base_run):
    plugin = action({"ansible.builtin.async_status": RUNNING,
                     "command": {"rc": 1, "stdout": "", "stderr": "head: cannot open '/opt/b 1.log'"}}, ARGS)
    result = plugin.run(task_vars={})
    assert not result.get("failed")
    assert result["hmk_progress"] == "no progress yet, log: /opt/b 1.log"


def test_a_failed_job_fails_as_with_async_status_and_reads_no_log(base_run):
    failed = {"started": 1, "finished": 1, "failed": True, "rc": 2, "msg": "non-zero return code",
              "stderr": "build of b1 failed (rc=2), log: /opt/b1.log", "stdout": "", "ansible_job_id": "j1.2"}
    plugin = action({"ansible.builtin.async_status": failed}, ARGS)
    result = plugin.run(task_vars={})
    assert result["failed"] is True and result["rc"] == 2 and result["finished"] is True
    assert result["stderr"].startswith("build of b1 failed")
    assert "hmk_progress" not in result
    # Read once, then the finished job's results file is removed from the node's async directory.
    assert plugin.calls == [
        ("ansible.builtin.async_status", {"jid": "j1.2", "mode": "status", "_async_dir": "/root/.ansible_async"}),
        ("ansible.builtin.async_status", {"jid": "j1.2", "mode": "cleanup", "_async_dir": "/root/.ansible_async"}),
    ]


def test_a_finished_job_returns_its_output_without_progress(base_run):
    done = {"started": 1, "finished": 1, "rc": 0, "stdout": '{"build_seconds": 600}', "changed": True}
    plugin = action({"ansible.builtin.async_status": done}, ARGS)
    result = plugin.run(task_vars={})
    assert result["finished"] is True and result["stdout"] == '{"build_seconds": 600}' and result["rc"] == 0
    assert "hmk_progress" not in result
    assert [args["mode"] for name, args in plugin.calls] == ["status", "cleanup"]


def test_a_running_job_keeps_its_results_file(base_run):
    plugin = action({"ansible.builtin.async_status": RUNNING, "command": {"rc": 1, "stdout": ""}}, ARGS)
    plugin.run(task_vars={})
    assert [args.get("mode") for name, args in plugin.calls if name == "ansible.builtin.async_status"] == ["status"]


# --- the model sync's jobs (model): that model's lines of the shared log, since its job started --------------------

SYNC_ARGS = {"jid": "j9.1", "log": "/var/log/hmk-model-sync.log", "model": "tiny-qwen3moe"}
SYNC_RUNNING = {"started": 1, "finished": 0, "ansible_job_id": "j9.1"}
# The format is hmk_model_fetch's (ProgressLog and Syncer write it; tests/unit/test_model_sync_progress.py makes these
# lines with the real writer): another model's lines and this model's earlier run are in the same log.
SYNC_LOG = """2026-12-03T11:00:00Z tiny-qwen3moe sync of 1 file(s), 100 bytes missing, 9 bytes free at /m, from http://p/m
2026-12-03T12:00:00Z tiny-qwen3moe sync of 2 file(s), 3221225472 bytes missing, 9 bytes free at /m, from http://p/m
2026-12-03T12:00:00Z tiny-qwen3moe a.gguf: fetching 1073741824 bytes from http://p/m/a.gguf
2026-12-03T12:00:00Z tiny-qwen3moe b.gguf: fetching 2147483648 bytes from http://p/m/b.gguf
2026-12-03T12:00:01Z other-model x.gguf: 5/9 bytes (55.6%%) at 900.0 MB/s, ETA 0m00s
2026-12-03T12:00:04Z tiny-qwen3moe a.gguf: verified (sha256 %s) and published
2026-12-03T12:00:10Z tiny-qwen3moe b.gguf: 1073741824/2147483648 bytes (50.0%%) at 104.9 MB/s, ETA 0m10s
""" % ("0" * 64)


def test_a_model_sync_job_reports_bytes_rate_and_time_left_of_its_own_run(base_run):
    # The job's results file was written at 2026-12-03T11:59:59Z (node clock): the 11:00 run is an earlier one's.
    out = "1796299199\n%s\n%s" % (MARK, SYNC_LOG)
    plugin = action({"ansible.builtin.async_status": SYNC_RUNNING, "command": {"rc": 0, "stdout": out}}, SYNC_ARGS)
    result = plugin.run(task_vars={})
    assert result["finished"] is False
    assert result["hmk_progress"] == "tiny-qwen3moe: 2.0 GiB of 3.0 GiB (66%), 100 MiB/s, 11s left"
    mine, log = "' tiny-qwen3moe '", "/var/log/hmk-model-sync.log"
    assert plugin.calls[1] == ("command", "stat -c %%Y -- /root/.ansible_async/j9.1; echo %s; "
                                          "grep -F -e %s -- %s | grep -v -F -e ' MB/s, ETA ' | tail -n 1000; "
                                          "grep -F -e %s -- %s | tail -n 40" % (MARK, mine, log, mine, log))


def test_a_model_sync_job_before_its_first_line_is_not_the_earlier_run(base_run):
    out = "1796299199\n%s\n%s" % (MARK, SYNC_LOG.splitlines()[0])
    result = action({"ansible.builtin.async_status": SYNC_RUNNING, "command": {"rc": 0, "stdout": out}},
                    SYNC_ARGS).run(task_vars={})
    assert result["hmk_progress"] == "tiny-qwen3moe: starting, no progress yet"


def test_a_finished_model_sync_returns_the_module_s_result_without_its_arguments(base_run):
    done = {"started": 1, "finished": 1, "changed": True, "fetched": ["a.gguf"], "bytes_received": 7,
            "bytes_needed": 7, "invocation": {"module_args": {"http_token": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER",
                                                              "source_location": "http://p/m"}}}
    plugin = action({"ansible.builtin.async_status": done}, SYNC_ARGS)
    result = plugin.run(task_vars={})
    assert result["fetched"] == ["a.gguf"] and result["bytes_received"] == 7 and result["changed"] is True
    assert "invocation" not in result and "hmk_progress" not in result
    # No log is read for a finished job; its results file is removed.
    assert [(name, args.get("mode")) for name, args in plugin.calls] == [
        ("ansible.builtin.async_status", "status"), ("ansible.builtin.async_status", "cleanup")]


def test_the_callback_prints_the_model_sync_s_progress_line():
    task = "Checked at each poll, each model's sync from the source has finished"
    display = FakeDisplay()
    callback = CallbackModule()
    callback._display = display
    callback.set_options()
    progress = "tiny-qwen3moe: 1.2 GiB of 3.4 GiB (35%), 412 MiB/s, 5m40s left"
    data = dict(attempts=2, retries=11521, finished=False, started=True, ansible_job_id="j9.1", hmk_progress=progress,
                item={"key": "tiny-qwen3moe"}, ansible_loop_var="item")
    callback.v2_runner_retry(CallbackTaskResult(Host("epyc-node"), Task(), data, {"name": task}))
    assert display.lines == [("  [epyc-node] %s: %s" % (task, progress), C.COLOR_DEBUG)]


# 1000000 s after the epoch is 1970-01-12T13:46:40Z; "now" is 250 s later.
START = "1970-01-12T13:46:40Z"

MAKE_LOG = """== configure 1970-01-12T13:46:40Z
-- The C compiler identification is GNU 12.2.0
-- Build files have been written to: /opt/hmk/engines/llama.cpp/staging/b1
== build 1970-01-12T13:46:49Z
[  1%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
[  2%] Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o
/opt/src/ggml/src/ggml.c:12:5: warning: unused variable \u2018x\u2019 [-Wunused-variable]
[ 31%] Building CUDA object ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/fattn.cu.o
   12 |     int x;
      |         ^
"""

NINJA_LOG = """== configure 1970-01-12T13:46:40Z
== build 1970-01-12T13:46:49Z
[1/1024] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
[312/1024] Building CXX object ggml/src/CMakeFiles/ggml-cpu.dir/ops.cpp.o
"""

KT_LOG = """== 1970-01-12T13:46:40Z step 4/5: /opt/kt/venv/bin/pip install ...
  Building wheel for kt-kernel (pyproject.toml): started
  [ 12/80] not a ninja line
  [17/80] Building CXX object CMakeFiles/kt_kernel_ext.dir/ext_bindings.cpp.o
== 1970-01-12T13:48:00Z step 5/5: /opt/kt/venv/bin/python -c ...
"""


@pytest.mark.parametrize("log, line", [
    (MAKE_LOG, "31% compiled, 4m10s elapsed"),
    (NINJA_LOG, "312/1024 objects compiled (30%), 4m10s elapsed"),
    # A step marker starts a new count.
    (KT_LOG, "step 5/5, 4m10s elapsed"),
    (KT_LOG.rsplit("== ", 1)[0], "step 4/5, 17/80 objects compiled (21%), 4m10s elapsed"),
    (MAKE_LOG.split("== build", maxsplit=1)[0], "configuring, 4m10s elapsed"),
    (MAKE_LOG.split("[  1%]", maxsplit=1)[0], "compiling, 4m10s elapsed"),
    ("no progress at all\n", "no progress yet"),
    ("", "no progress yet"),
    # A node clock ahead of the controller's, or far behind it: no elapsed time rather than a wrong one.
    (NINJA_LOG.replace(START, "1970-01-12T13:51:40Z"), "312/1024 objects compiled (30%)"),
    (NINJA_LOG.replace(START, "1970-01-01T00:00:05Z"), "312/1024 objects compiled (30%)"),
    ("[7/0] odd\n", "no progress yet"),
])
def test_logs_are_described(log, line):
    first = log.split("\n", 1)[0]
    # The tail is the log's last 80 lines: the first line may or may not be in it.
    assert hmk_job_progress.describe_progress(first, log, now=1000250) == line
    assert hmk_job_progress.describe_progress(first, "\n".join(log.splitlines()[1:]), now=1000250) == line


def test_a_long_log_is_judged_on_its_last_lines_only():
    """A compiler that prints many warnings: the count is the last one in the tail, the start still from line one."""
    tail = "\n".join(["[ 40%%] Building CXX object o%d.o" % i if i % 20 == 0 else "warning %d" % i for i in range(80)])
    assert hmk_job_progress.describe_progress("== configure %s" % START, tail, now=1000250) == "40% compiled, 4m10s elapsed"


def render(template, variables):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["quote"] = lambda value: shlex.quote(str(value))
    env.filters["comment"] = lambda value: "# " + value
    env.filters["bool"] = bool
    return env.from_string(open(template).read()).render(ansible_managed="Ansible managed", **variables)


@pytest.fixture
def fake_tools(tmp_path):
    """cmake and c++ stand-ins: the configure prints a line, the build prints make's progress, then exits $BUILD_RC."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(
        "#!/bin/bash\n"
        'case "$1" in --version) echo "cmake version 3.25.1";;\n'
        '  --build) for i in 10 55 100; do printf "[%3d%%] Building CXX object o%d.o\\n" $i $i; done;'
        ' echo "error: boom" >&2; exit "${BUILD_RC:-0}";;\n'
        '  *) echo "-- Configuring done";; esac\n')
    (bin_dir / "c++").write_text('#!/bin/bash\necho "c++ (Debian 12.2.0-14) 12.2.0"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("rc", [0, 2])
def test_the_llama_build_script_writes_everything_to_its_log(tmp_path, fake_tools, rc):
    root = tmp_path / "engine"
    for sub in ("staging", "logs", "src"):
        (root / sub).mkdir(parents=True)
    script = tmp_path / "b1.sh"
    script.write_text(render(LLAMA, {
        "llama_build_root": str(root), "llama_build_engine": "llama.cpp", "__llama_build_sha": "abc",
        "__llama_build_key": "b1", "llama_build_ccache_dir": str(tmp_path / "ccache"),
        "llama_build_ccache_max_size": "5G", "__llama_build_cuda_on": False, "__llama_build_cuda_home": "",
        "__llama_build_cmake_args": ["-DGGML_NATIVE=OFF"], "llama_build_jobs": 2,
        "llama_build_targets": ["llama-server"]}))
    env = dict(os.environ, PATH="%s:%s" % (fake_tools, os.environ["PATH"]), BUILD_RC=str(rc))
    run = subprocess.run(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    assert run.returncode == rc
    log = (root / "logs" / "b1.log").read_text().splitlines()
    assert log[0].startswith("== configure ") and log[1] == "-- Configuring done" and log[2].startswith("== build ")
    assert log[3:] == ["[ 10%] Building CXX object o10.o", "[ 55%] Building CXX object o55.o",
                       "[100%] Building CXX object o100.o", "error: boom"]
    # What the poll reads from it.
    assert hmk_job_progress.describe_progress(log[0], "\n".join(log[-80:])).startswith("100% compiled")
    if rc:
        assert "build of b1 failed (rc=2)" in run.stderr.decode()
    else:
        assert '"compiler": "c++ (Debian 12.2.0-14) 12.2.0"' in run.stdout.decode()


@pytest.mark.parametrize("rc", [0, 3])
def test_the_ktransformers_build_script_logs_every_step_and_reports_a_failed_one(tmp_path, fake_tools, rc):
    root = tmp_path / "engine"
    (root / "logs").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    script = tmp_path / "k1.sh"
    script.write_text(render(KT, {
        "ktransformers_build_root": str(root), "__ktransformers_build_sha": "abc", "__ktransformers_build_key": "k1",
        "__ktransformers_build_kt_version": "0.4", "ktransformers_build_ccache_dir": str(tmp_path / "ccache"),
        "ktransformers_build_ccache_max_size": "5G", "__ktransformers_build_cuda_archs": "",
        "__ktransformers_build_cuda_home": "",
        "__ktransformers_build_plan": {"chdir": str(tmp_path / "src"), "env": {"PATH": "%s:/usr/bin:/bin" % fake_tools},
                                       "commands": [["echo", "venv made"], ["cmake", "--build", "."],
                                                    ["bash", "-c", "exit %d" % rc], ["echo", "not reached on failure"]]}}))
    run = subprocess.run(["bash", str(script)], env=dict(os.environ, BUILD_RC="0"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, check=False)
    assert run.returncode == rc
    log = (root / "logs" / "k1.log").read_text()
    assert "step 2/4: cmake --build ." in log and "[ 55%] Building CXX object o55.o\n" in log
    lines = log.splitlines()
    progress = hmk_job_progress.describe_progress(lines[0], "\n".join(lines[-80:]))
    if rc:
        assert "not reached on failure" not in log
        assert progress.startswith("step 3/4, ")
        assert "build of k1 failed (rc=3)" in run.stderr.decode()
    else:
        assert log.endswith("not reached on failure\n")
        assert progress.startswith("step 4/4, ")


@pytest.mark.parametrize("engine", ["llama", "kt"])
def test_the_build_scripts_compile_in_the_c_locale_whatever_the_session_brings(tmp_path, fake_tools, engine):
    """ccache hashes LANG, LC_ALL, LC_CTYPE and LC_MESSAGES: an SSH session (which sends the operator's locale) and a
    docker exec (none) must hand the compiler the same, or the same build key compiles from scratch."""
    seen = tmp_path / "seen-by-cmake"
    (fake_tools / "cmake").write_text(
        '#!/bin/bash\n[ "$1" = --version ] && { echo "cmake version 3.25.1"; exit 0; }\n'
        'for v in LANG LANGUAGE LC_ALL LC_CTYPE LC_MESSAGES; do echo "$v=${!v-unset}"; done >> %s\n' % seen)
    root = tmp_path / "engine"
    for sub in ("staging", "logs", "src"):
        (root / sub).mkdir(parents=True)
    if engine == "llama":
        text = render(LLAMA, {
            "llama_build_root": str(root), "llama_build_engine": "llama.cpp", "__llama_build_sha": "abc",
            "__llama_build_key": "b1", "llama_build_ccache_dir": str(tmp_path / "ccache"),
            "llama_build_ccache_max_size": "5G", "__llama_build_cuda_on": False, "__llama_build_cuda_home": "",
            "__llama_build_cmake_args": ["-DGGML_NATIVE=OFF"], "llama_build_jobs": 2,
            "llama_build_targets": ["llama-server"]})
    else:
        text = render(KT, {
            "ktransformers_build_root": str(root), "__ktransformers_build_sha": "abc", "__ktransformers_build_key": "k1",
            "__ktransformers_build_kt_version": "0.4", "ktransformers_build_ccache_dir": str(tmp_path / "ccache"),
            "ktransformers_build_ccache_max_size": "5G", "__ktransformers_build_cuda_archs": "",
            "__ktransformers_build_cuda_home": "",
            "__ktransformers_build_plan": {"chdir": str(root / "src"), "env": {"PATH": "%s:/usr/bin:/bin" % fake_tools},
                                           "commands": [["cmake", "--build", "."]]}})
    script = tmp_path / "b.sh"
    script.write_text(text)
    session = {"LANG": "de_DE.UTF-8", "LANGUAGE": "de", "LC_ALL": "C.UTF-8", "LC_CTYPE": "C.UTF-8",
               "LC_MESSAGES": "fr_FR.UTF-8"}
    run = subprocess.run(["bash", str(script)], env=dict(os.environ, PATH="%s:%s" % (fake_tools, os.environ["PATH"]),
                                                         **session),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    assert run.returncode == 0, run.stderr.decode()
    lines = set(seen.read_text().split())
    assert lines == {"LANG=unset", "LANGUAGE=unset", "LC_ALL=unset", "LC_CTYPE=unset", "LC_MESSAGES=unset"}, lines
