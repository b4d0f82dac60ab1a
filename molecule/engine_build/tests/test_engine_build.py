"""Verify of molecule/engine_build: what an operator would check on the node after
converge, idempotence and side_effect (flag change, broken commit, missing commit, rollback)."""
import json
import re

ROOT = "/opt/hmk/engines/ik_llama.cpp"
STATE = "/var/lib/hmk-engine-build-test"
FIXTURE_SHA = "462213ef9ec32d610a70c0aba165aaf67d9bfb9e"


def _json(host, path):
    f = host.file(path)
    assert f.exists, path
    return json.loads(f.content_string)


def _results(host):
    return _json(host, STATE + "/side-effect.json")


def _record(host, key):
    return _json(host, "%s/builds/%s/build-record.json" % (ROOT, key))


def test_current_is_back_on_the_base_build_after_the_rollback_playbook(host):
    res = _results(host)
    current = host.file(ROOT + "/current")
    assert current.is_symlink
    assert current.linked_to == "%s/builds/%s" % (ROOT, res["base_key"])


def test_current_llama_server_names_the_pinned_commit(host):
    out = host.run(ROOT + "/current/bin/llama-server --version")
    assert out.rc == 0
    text = out.stdout + out.stderr
    match = re.search(r"version: \d+ \(([0-9a-f]{7,})\)", text)
    assert match, text
    assert FIXTURE_SHA.startswith(match.group(1))


def test_binaries_are_static_in_engine_libraries(host):
    for binary in ("llama-server", "llama-bench", "llama-perplexity"):
        path = "%s/current/bin/%s" % (ROOT, binary)
        assert host.file(path).mode & 0o111
        libs = host.run("ldd " + path).stdout
        assert "libllama" not in libs and "libggml" not in libs, libs


def test_build_key_layout_and_record(host):
    res = _results(host)
    record = _record(host, res["base_key"])
    assert res["base_key"] == "%s-%s" % (FIXTURE_SHA[:12], record["flags_hash"])
    assert record["commit"] == FIXTURE_SHA
    assert record["commit_date"] == "2026-08-15"  # the fixture commit carries upstream 8337e4cd's date
    for arg in ("-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
                "-DGGML_CCACHE=ON", "-DGGML_IQK_FA_ALL_QUANTS=OFF", "-DCMAKE_BUILD_TYPE=Release"):
        assert arg in record["cmake_args"], (arg, record["cmake_args"])
    assert not any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in record["cmake_args"])
    assert record["targets"] == ["llama-server", "llama-bench", "llama-perplexity"]
    assert record["compiler"].startswith(("c++", "g++")), record["compiler"]
    assert record["cmake"].startswith("cmake version")
    assert record["nvcc"] == ""
    assert record["wall_seconds"] >= record["build_seconds"] >= 0
    assert "version:" in record["version_output"]
    assert host.file("%s/builds/%s/build.log" % (ROOT, res["base_key"])).exists


def test_isa_flags_follow_the_cpu(host):
    res = _results(host)
    record = _record(host, res["base_key"])
    cpu = host.run("grep -m1 ^flags /proc/cpuinfo").stdout.split(":", 1)[1].split()
    assert record["cpu_flags"] == sorted(set(cpu))
    if {"avx512f", "avx512bw", "avx512vl"} <= set(cpu):
        assert record["cpu_isa"] == "avx512"
        assert "-DGGML_AVX512=ON" in record["cmake_args"]
        assert ("-DGGML_AVX512_BF16=ON" in record["cmake_args"]) == ("avx512_bf16" in cpu)
        assert "-DGGML_AVX2=ON" not in record["cmake_args"]
    else:
        assert "-DGGML_AVX512=ON" not in record["cmake_args"]


def test_flag_change_built_a_second_directory_from_the_cache(host):
    res = _results(host)
    assert res["flag_key"] != res["base_key"]
    assert res["flag_key"][:12] == res["base_key"][:12]
    record = _record(host, res["flag_key"])
    assert record["cmake_args"][-1] == res["changed_flag"]
    # Same compile commands: every object comes from ccache (CCACHE_BASEDIR makes the build
    # directory's name irrelevant, and the build script's fixed locale the session's LANG/LC_*, which
    # side_effect sets for this build); a handful of misses at most.
    assert record["ccache_hits"] > 50, record
    assert record["ccache_misses"] <= 5, record
    assert host.file("%s/builds/%s/bin/llama-server" % (ROOT, res["flag_key"])).exists


def test_broken_commit_failed_with_its_log_and_left_current_alone(host):
    res = _results(host)
    assert res["current_after_failures"] == "builds/" + res["flag_key"]
    msg = res["broken_msg"]
    log_path = re.search(r"log: (\S+\.log)", msg).group(1)
    assert log_path.startswith(ROOT + "/logs/" + res["broken_sha"][:12])
    log = host.file(log_path)
    assert log.exists
    assert "must not build" in log.content_string
    assert "must not build" in msg
    builds = host.run("ls %s/builds" % ROOT).stdout.split()
    assert not any(b.startswith(res["broken_sha"][:12]) for b in builds), builds


def test_no_build_without_a_record_and_no_leftover_temp_link(host):
    for name in host.run("ls %s/builds" % ROOT).stdout.split():
        assert host.file("%s/builds/%s/build-record.json" % (ROOT, name)).exists, name
    assert not host.file(ROOT + "/current.new").exists


def test_ktransformers_was_refused_before_touching_the_node(host):
    res = _results(host)
    assert "declares none" in res["kt_msg"] and "stays off silently" in res["kt_msg"]
    assert not host.file("/opt/hmk/engines/ktransformers").exists
