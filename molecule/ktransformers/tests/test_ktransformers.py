"""Verify of molecule/ktransformers: what an operator would check on the node after converge, idempotence and
side_effect (kt-kernel's own CPU tests, the tiny MoE forward, a broken pin)."""
import json
import xml.etree.ElementTree as ET

ROOT = "/opt/hmk/engines/ktransformers"
STATE = "/var/lib/hmk-kt-test"
FIXTURE_SHA = "10ec5c14fa855830c691aafd13373085fb4c8653"
BROKEN_SHA = "4bfe1d6473697341ccc44b1d0d6f766a1a8b8270"


def _json(host, path):
    f = host.file(path)
    assert f.exists, path
    return json.loads(f.content_string)


def _results(host):
    return _json(host, STATE + "/side-effect.json")


def test_current_is_the_pinned_build_with_a_record(host):
    res = _results(host)
    key = res["converge"]["key"]
    assert key.startswith(FIXTURE_SHA[:12])
    current = host.file(ROOT + "/current")
    assert current.is_symlink and current.linked_to == "%s/builds/%s" % (ROOT, key)
    record = _json(host, "%s/builds/%s/build-record.json" % (ROOT, key))
    assert record["commit"] == FIXTURE_SHA
    assert record["kt_version"] == "0.7.0"
    assert record["torch_pinned_by_kt_kernel"] == "2.9.1"


def test_the_build_is_avx2_without_amx_or_cuda_and_proves_it(host):
    record = _json(host, "%s/builds/%s/build-record.json" % (ROOT, _results(host)["converge"]["key"]))
    env = record["env"]
    assert env["CPUINFER_CPU_INSTRUCT"] in ("AVX2", "NATIVE")
    if env["CPUINFER_CPU_INSTRUCT"] == "AVX2":
        assert env["CPUINFER_ENABLE_AMX"] == "OFF"
        assert record["proof"]["variant"] == "avx2"
    assert env["CPUINFER_USE_CUDA"] == "0"
    assert "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache" in env["CMAKE_ARGS"]
    assert record["proof"]["versions"] == {"kt-kernel": "0.7.0"}
    assert record["proof"]["cuda"] is False
    # every one of kt-kernel's ~70 compiles went through the compiler cache (hits when it was warm)
    assert record["ccache_hits"] + record["ccache_misses"] >= 60


def test_the_idempotence_run_built_nothing(host):
    res = _results(host)
    assert res["entries_after_idempotence"] == res["converge"]["entries"]
    assert res["record_mtime_after_idempotence"] == res["converge"]["record_mtime"]


def test_kt_kernels_own_cpu_tests_pass_without_skips(host):
    res = _results(host)
    assert res["upstream_rc"] == 0, "\n".join(res["upstream_output"])
    suite = ET.fromstring(host.file(STATE + "/upstream-junit.xml").content_string)
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("tests")) >= 9
    assert int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
    assert int(suite.get("skipped")) == 0, "an upstream test skipped: the module did not import"


def test_the_tiny_deepseek_moe_matches_the_torch_reference(host):
    res = _results(host)
    forward = res["forward"]
    assert res["forward_rc"] == 0 and forward.get("ok"), res["forward_output"]
    assert forward["worst_rel_diff"] < 0.02
    layers = {entry["layer"] for entry in forward["layers"]}
    assert layers == {1, 2}
    assert all(entry["nonzero"] for entry in forward["layers"])


def test_a_broken_pin_failed_and_left_current_alone(host):
    res = _results(host)
    key = res["converge"]["key"]
    assert res["broken_built"] is False
    assert "current is untouched: " + key in res["broken_msg"]
    assert "last 40 lines of the log" in res["broken_msg"]
    assert "must not build" in res["broken_msg"]
    assert res["current_after_broken"] == "builds/" + key
    broken = host.run("ls %s/builds | grep ^%s || true" % (ROOT, BROKEN_SHA[:12])).stdout.split()
    assert broken, "the broken pin never started a build"
    for name in broken:
        assert not host.file("%s/builds/%s/build-record.json" % (ROOT, name)).exists
    assert res["current_key_final"] == key
