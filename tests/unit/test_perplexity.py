"""The perplexity baseline: the reader on real llama-perplexity output from public threads (tests/fixtures/perplexity)
and on the failures the engine source prints, the regression verdict, the command built from the service's argv, and
validate's filter that puts them together."""
import hashlib
import os
import re

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.hmk.moe_kit.plugins.filter import validate as vf
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_perplexity as ppl
from test_bad_inputs import role_vars

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "perplexity")
OUTPUTS = yaml.safe_load(open(os.path.join(FIXTURES, "outputs.yml"), encoding="utf-8"))["outputs"]


@pytest.mark.parametrize("case", OUTPUTS, ids=[c["id"] for c in OUTPUTS])
def test_a_real_output_gives_its_final_estimate_or_says_why_not(case):
    result = ppl.read(case["text"])
    if case["ppl"] is None:
        assert result["ok"] is False and result["ppl"] is None and case["reason"] in result["reason"]
    else:
        assert result["ok"] is True and result["ppl"] == pytest.approx(case["ppl"])
        assert result["error"] == pytest.approx(case["error"])
    assert result["chunks"] == case["chunks"] and result["n_ctx"] == case["n_ctx"]


def test_every_output_has_a_public_source_and_an_index_line():
    index = open(os.path.join(FIXTURES, "INDEX.md"), encoding="utf-8").read()
    assert len({c["id"] for c in OUTPUTS}) == len(OUTPUTS)
    for case in OUTPUTS:
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$", case["source"]), case["id"]
        assert "| %s | %s |" % (case["id"], case["source"]) in index


# Written from perplexity.cpp's printf formats at the kit's pin (55d3c05, lines 513-516 and 687; INDEX.md).
TOO_SHORT = ("perplexity: tokenizing the input ..\nperplexity: tokenization took 1.2 ms\n"
             "perplexity: you need at least 512 tokens to evaluate perplexity with a context of 256\n"
             "perplexity: the data file you provided tokenizes to only 301 tokens\n")
ONE_CHUNK = "[1]12.3456,\nUnexpected negative standard deviation of log(prob)\n"
NAN_FINAL = "[1]nan,[2]nan,\nFinal estimate: PPL over 2 chunks for n_ctx=256 = nan +/- nan\n"


@pytest.mark.parametrize("text,reason", [
    (TOO_SHORT, "512 tokens needed at n_ctx 256, it has 301"),
    (ONE_CHUNK, "one chunk only"),
    (NAN_FINAL, "the final estimate is nan"),
    ("[1]nan,[2]nan,", "the running estimate is nan"),
    ("", "no 'Final estimate: PPL' line"),
])
def test_the_failures_the_engine_prints_are_named(text, reason):
    result = ppl.read(text)
    assert result["ok"] is False and reason in result["reason"]


def test_the_last_final_estimate_counts_when_a_log_holds_several():
    result = ppl.read("Final estimate: PPL = 9.0000 +/- 0.10000\nFinal estimate: PPL over 4 chunks for n_ctx=256 = "
                      "8.5000 +/- 0.20000\n")
    assert result["ppl"] == 8.5 and result["chunks"] == 4 and result["n_ctx"] == 256


@pytest.mark.parametrize("current,base,tolerance,status", [
    (10.0, None, 2, "recorded"),
    (10.1, 10.0, 2, "ok"),
    (10.2, 10.0, 2, "ok"),          # exactly at the tolerance is still within it
    (10.21, 10.0, 2, "regressed"),
    (9.0, 10.0, 2, "ok"),           # a fall is never a regression
    (12.0, 10.0, 25, "ok"),
])
def test_a_rise_beyond_the_tolerance_is_a_regression(current, base, tolerance, status):
    result = {"ok": True, "ppl": current, "error": 0.1, "chunks": 8, "n_ctx": 256}
    verdict = ppl.verdict(result, {"ppl": base, "source": "recorded"} if base else None, tolerance)
    assert verdict["status"] == status, verdict
    if status == "regressed":
        assert "2.10% above 10.0000" in verdict["reason"] and "2% tolerance" in verdict["reason"]


def test_a_failed_run_is_failed_not_a_pass():
    verdict = ppl.verdict(ppl.read(NAN_FINAL), {"ppl": 10.0}, 2)
    assert verdict["status"] == "failed" and "nan" in verdict["reason"]


# The command at the service's settings

SERVER_ARGV = ["/opt/hmk/engines/ik_llama.cpp/current/bin/llama-server", "-m", "/srv/models/m/m-00001-of-00002.gguf",
               "--host", "127.0.0.1", "--port", "8080", "--api-key-file", "/etc/hmk/hmk-inference.api-key",
               "-a", "deepseek-r1", "-t", "32", "-tb", "32", "-c", "32768", "-b", "2048", "-ub", "2048",
               "-ctk", "q8_0", "-ctv", "q8_0", "-ngl", "99", "-mla", "3", "-fa", "on", "-amb", "512", "--numa",
               "distribute", "--metrics", "-ot", "blk\\.(3|4)\\.ffn_.*_exps=CUDA0", "-ot", "exps=CPU",
               "--chat-template", "gemma", "-np", "1", "--jinja", "--no-mmap", "-cram", "8192", "--ctx-checkpoints",
               "8", "--defer-experts", "-sm", "graph", "--spec-type", "mtp"]


def test_the_command_keeps_what_changes_the_numbers_and_drops_the_servers_own_flags():
    cmd = ppl.command(SERVER_ARGV, "/opt/x/bin/llama-perplexity", "/var/lib/hmk/perplexity.txt", 256, 8)
    argv = cmd["argv"]
    assert argv[0] == "/opt/x/bin/llama-perplexity" and argv[1:3] == ["-m", "/srv/models/m/m-00001-of-00002.gguf"]
    for pair in (["-t", "32"], ["-tb", "32"], ["-ctk", "q8_0"], ["-ngl", "99"], ["-mla", "3"], ["-fa", "on"],
                 ["-amb", "512"], ["--numa", "distribute"], ["-ot", "exps=CPU"],
                 ["-ot", "blk\\.(3|4)\\.ffn_.*_exps=CUDA0"]):
        assert any(argv[i:i + 2] == pair for i in range(len(argv))), pair
    assert "--no-mmap" in argv and "--defer-experts" in argv and ["-sm", "graph"] == argv[argv.index("-sm"):][:2]
    assert argv[-10:] == ["-f", "/var/lib/hmk/perplexity.txt", "-c", "256", "-b", "256", "-ub", "256",
                          "--chunks", "8"]
    for flag in ("--host", "--port", "--api-key-file", "-a", "--metrics", "--chat-template", "-np", "--jinja", "-cram",
                 "--ctx-checkpoints", "--spec-type"):
        assert flag not in argv and flag in cmd["dropped"], flag
    assert "32768" not in argv and "2048" not in argv and "/etc/hmk/hmk-inference.api-key" not in argv
    assert "8192" not in argv and "mtp" not in argv


def test_a_service_without_a_model_has_no_command():
    with pytest.raises(ValueError, match="no -m MODEL"):
        ppl.command(["/bin/llama-server", "--port", "8080"], "/bin/llama-perplexity", "/t.txt")


# validate's filter: the run, the record and the catalog

DEPLOYMENT = {"model": "/srv/models/gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf"}
GOOD = {"rc": 0, "stdout": "[1]20.1,[2]21.3,\nFinal estimate: PPL over 2 chunks for n_ctx=256 = 21.3000 +/- 0.90000\n",
        "stderr": "perplexity: calculating perplexity over 2 chunks, n_ctx=256, batch_size=256, n_seq=1\n"}


def test_the_first_good_run_is_recorded_then_compared():
    key = vf.perplexity_key(DEPLOYMENT, "ab" * 32, 256)
    assert key == DEPLOYMENT["model"] + "|" + "ab" * 8 + "|256"
    first = vf.perplexity_judge(GOOD, {}, key, 2)
    assert first["status"] == "recorded" and first["ppl"] == 21.3 and first["n_ctx"] == 256
    record = {key: {"ppl": 21.3, "date": "2026-12-03"}}
    same = vf.perplexity_judge(GOOD, record, key, 2)
    assert same["status"] == "ok" and same["rise_pct"] == 0.0 and "recorded on this node" in same["reason"]
    worse = dict(GOOD, stdout=GOOD["stdout"].replace("21.3000", "24.0000"))
    assert vf.perplexity_judge(worse, record, key, 2)["status"] == "regressed"
    # Another text or context is another key: nothing to compare with, so it is recorded anew.
    assert vf.perplexity_judge(GOOD, record, vf.perplexity_key(DEPLOYMENT, "cd" * 32, 256), 2)["status"] == "recorded"


def test_a_catalog_value_counts_only_for_the_same_text_and_context():
    value = {"ppl": 20.0, "text": "hmk-perplexity-v1", "ctx": 256, "source": "https://example.invalid/card"}
    used = vf.perplexity_judge(GOOD, {}, "k", 10, value, "hmk-perplexity-v1", 256)
    assert used["status"] == "ok" and used["baseline"]["source"].startswith("catalog:")
    assert vf.perplexity_judge(GOOD, {}, "k", 10, value, "hmk-perplexity-v1", 512)["status"] == "recorded"


def test_a_skipped_or_crashed_run_says_why():
    assert vf.perplexity_judge({"skipped": True, "skip_reason": "family none"}, {}, "k", 2) == {
        "status": "skipped", "reason": "family none"}
    crashed = vf.perplexity_judge({"rc": -6, "stdout": "", "stderr": "GGML_ASSERT(n_batch < n_ctx) failed"}, {}, "k", 2)
    assert crashed["status"] == "failed" and "exited -6" in crashed["reason"] and "GGML_ASSERT" in crashed["reason"]
    assert crashed["ppl"] is None


def test_the_kits_text_is_long_enough_for_its_context():
    text = open(os.path.join(ROOT, "roles", "validate", "files", "hmk-perplexity.txt"), encoding="utf-8").read()
    words = len(text.split())
    # 2 x n_ctx tokens are needed at least; English runs at about 1.3 tokens a word, so 256-token chunks need 400+
    # words, and 8 chunks about 1600.
    assert 1600 <= words <= 3000, words
    assert text.isascii()


# The role's wiring, in process with Ansible's templar on the validate role's own variables

def _validate_templar(deployment, **overrides):
    variables = role_vars("validate", dict({"role_path": os.path.join(ROOT, "roles", "validate"),
                                            "__validate_deployment": deployment, "ansible_check_mode": False},
                                           **overrides))
    return Templar(loader=DataLoader(), variables=variables), variables


def _skip_reason(deployment, **overrides):
    tasks = yaml.safe_load(open(os.path.join(ROOT, "roles", "validate", "tasks", "perplexity.yml"), encoding="utf-8"))
    templar, _unused = _validate_templar(deployment, **overrides)
    expression = tasks[0]["ansible.builtin.set_fact"]["__validate_perplexity_skip"]
    return templar.template(trust_as_template(expression)).strip()


PROBED = {"engine": "ik_llama.cpp", "model": DEPLOYMENT["model"], "argv": SERVER_ARGV,
          "answer_probe": {"family": "gemma3", "probes": [{"name": "capital"}], "reason": "3 probes"}}


def test_validate_measures_perplexity_only_for_a_probed_model_on_a_llama_engine():
    assert _skip_reason(PROBED) == ""
    tiny = dict(PROBED, answer_probe={"family": "none", "probes": [], "reason": "its weights are random"})
    assert "runs no answer probe (its weights are random)" in _skip_reason(tiny)
    assert "carries none" in _skip_reason({k: v for k, v in PROBED.items() if k != "answer_probe"})
    assert "has no llama-perplexity" in _skip_reason(dict(PROBED, engine="ktransformers"))
    assert _skip_reason(PROBED, validate_perplexity=False) == "validate_perplexity is false"


def test_the_record_key_follows_the_shipped_texts_bytes():
    templar, variables = _validate_templar(PROBED)
    sha = hashlib.sha256(open(os.path.join(ROOT, "roles", "validate", "files", "hmk-perplexity.txt"), "rb").read())
    assert templar.template(variables["__validate_perplexity_text_sha256"]) == sha.hexdigest()
    assert templar.template(variables["__validate_perplexity_key"]) == "%s|%s|256" % (
        DEPLOYMENT["model"], sha.hexdigest()[:16])


def _answer_skip(deployment, **overrides):
    tasks = yaml.safe_load(open(os.path.join(ROOT, "roles", "validate", "tasks", "answers.yml"), encoding="utf-8"))
    templar, _unused = _validate_templar(deployment, **overrides)
    expression = tasks[0]["ansible.builtin.set_fact"]["__validate_answer_skip"]
    return templar.template(trust_as_template(expression)).strip()


def test_validate_sends_the_gates_probes_and_says_why_when_it_sends_none():
    assert _answer_skip(PROBED) == ""
    tiny = dict(PROBED, answer_probe={"family": "none", "probes": [], "reason": "no answer probe runs"})
    assert _answer_skip(tiny) == "no answer probe runs"
    assert "deployed by an older kit" in _answer_skip({k: v for k, v in PROBED.items() if k != "answer_probe"})
    assert _answer_skip(PROBED, validate_answer_probe=False) == "validate_answer_probe is false"
    assert _answer_skip(PROBED, ansible_check_mode=True) == "check mode"
