"""The answer probe: its judge on real answers from public issue threads (tests/fixtures/answers) and on degenerate
outputs, its request body, the probe sets as data, and the module against a real HTTP server on 127.0.0.1 that
answers as llama-server's /v1/chat/completions does."""
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_answer_probe as ap
from module_process import run_module
from test_bad_inputs import role_vars

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "answers")
ANSWERS = yaml.safe_load(open(os.path.join(FIXTURES, "answers.yml"), encoding="utf-8"))["answers"]
PROBES = yaml.safe_load(open(os.path.join(ROOT, "roles", "inference_service", "vars", "answer_probes.yml"),
                             encoding="utf-8"))["__inference_service_answer_probes"]
CATALOG = yaml.safe_load(open(os.path.join(ROOT, "roles", "model_sync", "vars", "catalog.yml"),
                              encoding="utf-8"))["__model_sync_catalog_builtin"]
NEUTRAL_PROMPT = "Tell me in a few words what you can help me with today."


# The judge on real answers

@pytest.mark.parametrize("case", ANSWERS, ids=[c["id"] for c in ANSWERS])
def test_a_real_answer_gets_its_verdict_and_the_reason_names_the_fault(case):
    probe = {"name": case["id"], "prompt": case["prompt"] or NEUTRAL_PROMPT, "expect": case["expect"]}
    verdict = ap.judge(probe, case["message"])
    assert verdict["passed"] is case["passed"], verdict
    assert case["reason"] in verdict["reason"], verdict
    assert verdict["prompt"] == probe["prompt"]


def test_every_real_answer_has_a_public_source_and_an_index_line():
    index = open(os.path.join(FIXTURES, "INDEX.md"), encoding="utf-8").read()
    assert len({c["id"] for c in ANSWERS}) == len(ANSWERS)
    assert any(c["passed"] for c in ANSWERS) and any(not c["passed"] for c in ANSWERS)
    for case in ANSWERS:
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$", case["source"]), case["id"]
        assert "| %s |" % case["id"] in index and case["source"] in index, case["id"]


# The judge on what a probe expects

ARITH = {"name": "multiply", "prompt": "Compute 17 multiplied by 23 and reply with the number only.",
         "expect": {"number": 391}}


@pytest.mark.parametrize("content,passed", [
    ("391", True),
    ("391.", True),
    ("17 x 23 = **391**", True),
    ("The answer is 3,910.", False),      # a number that merely starts the same is another number
    ("39", False),
    ("42", False),
])
def test_a_number_is_matched_as_a_number(content, passed):
    assert ap.judge(ARITH, {"content": content})["passed"] is passed


def test_thousands_separators_are_not_part_of_the_number():
    probe = {"name": "w", "prompt": "How many boxes are left at the end of the week in total?",
             "expect": {"number": 1290}}
    for content in ("1,290 boxes", "1 290", "There are 1290 boxes.", "Final: 1\u202f290"):
        assert ap.judge(probe, {"content": content})["passed"], content


def test_exact_is_the_whole_answer_whatever_its_case_quotes_or_trailing_period():
    probe = {"name": "only-word", "prompt": "Reply with only the word BLUEBERRY in capital letters, nothing else.",
             "expect": {"exact": "BLUEBERRY"}}
    for content in ("BLUEBERRY", "blueberry.", " \"Blueberry\" ", "**BLUEBERRY**"):
        assert ap.judge(probe, {"content": content})["passed"], content
    verdict = ap.judge(probe, {"content": "Sure! BLUEBERRY"})
    assert not verdict["passed"] and "not exactly 'BLUEBERRY'" in verdict["reason"]


def test_contains_and_any_of_name_what_is_missing():
    probe = {"name": "capital", "prompt": "What is the capital city of Australia? Answer in one sentence.",
             "expect": {"contains": ["canberra"]}}
    assert ap.judge(probe, {"content": "The capital of Australia is Canberra."})["passed"]
    verdict = ap.judge(probe, {"content": "The capital of Australia is Sydney."})
    assert verdict["reason"] == "the answer lacks 'canberra'"
    assert verdict["expected"] == "all of 'canberra'" and verdict["answer"] == "The capital of Australia is Sydney."
    probe = {"name": "b", "prompt": "In one sentence, what does water turn into at 100 degrees?",
             "expect": {"any_of": ["steam", "vapour"]}, "min_words": 4}
    assert ap.judge(probe, {"content": "It turns into steam, a gas."})["passed"]
    assert "none of 'steam', 'vapour'" in ap.judge(probe, {"content": "It turns into ice cubes."})["reason"]
    assert "fewer than 4 words" in ap.judge(probe, {"content": "Steam."})["reason"]


# The degeneration check on outputs of each kind

@pytest.mark.parametrize("content,reason", [
    ("", "the answer is empty"),
    ("   \n", "the answer is empty"),
    ("Paris\ufffd\ufffd is", "U+FFFD"),
    ("<unk><unk><unk>", "control tokens"),
    ("the the the answer", "the word 'the' repeated 3 times"),
    ("1 1 1 1 1 1 1", "the token '1' repeated 7 times"),
    ("...?!...,,,", "only punctuation or symbols"),
    ("==========", "one character repeated 10 times"),
    ("I think so. " * 12, "repeats itself"),
    ("Sure, I can help with 天气 and travel plans.", "CJK characters the prompt does not use (天气)"),
], ids=["empty", "blank", "fffd", "unk", "word-run", "token-run", "punctuation", "char-run", "ngram-loop", "cjk"])
def test_a_degenerate_answer_fails_naming_the_fault(content, reason):
    verdict = ap.judge({"name": "d", "prompt": NEUTRAL_PROMPT}, {"content": content})
    assert not verdict["passed"] and reason in verdict["reason"], verdict


def test_a_loop_in_a_language_without_spaces_is_seen():
    prompt = "请用一句话介绍你自己，不要超过二十个字。"
    verdict = ap.judge({"name": "zh", "prompt": prompt}, {"content": "我是一个助手" * 20})
    assert not verdict["passed"] and "6-character sequences" in verdict["reason"]


def test_an_echoed_prompt_fails():
    prompt = "Compute 17 multiplied by 23 and reply with the number only."
    verdict = ap.judge({"name": "e", "prompt": prompt}, {"content": prompt + " Compute"})
    assert verdict["reason"] == "the answer echoes the prompt"


def test_chat_template_markers_name_the_template():
    verdict = ap.judge({"name": "t", "prompt": NEUTRAL_PROMPT}, {"content": "Hello!<|im_end|>\n<|im_start|>user"},
                       markers=["<|im_start|>", "<|im_end|>"])
    assert "chat template markers (<|im_start|>, <|im_end|>)" in verdict["reason"]


# Thinking models

SOUND_THINKING = (
    "Okay, the user wants 17 times 23. Let me work it out step by step so that I do not slip. Seventeen times "
    "twenty is three hundred and forty. Seventeen times three is fifty-one. Adding those two parts gives three "
    "hundred and ninety-one. Let me double-check another way: twenty-three times ten is two hundred and thirty, and "
    "twenty-three times seven is one hundred and sixty-one; together that is again three hundred and ninety-one. "
    "Both ways agree, so I am confident. The user asked for the number only, without any working, so I will reply "
    "with just the digits and nothing else.")


def test_a_long_sound_think_block_passes_inline_in_the_content_or_as_reasoning_content():
    inline = ap.judge(ARITH, {"content": "<think>\n%s\n</think>\n\n391" % SOUND_THINKING})
    split = ap.judge(ARITH, {"content": "391", "reasoning_content": SOUND_THINKING})
    for verdict in (inline, split):
        assert verdict["passed"] and verdict["answer"] == "391" and verdict["reasoning_chars"] > 500, verdict


def test_r1s_lone_closing_tag_splits_the_answer_off():
    # DeepSeek-R1's template opens <think> in the prompt: the reply holds only the closing tag.
    verdict = ap.judge(ARITH, {"content": SOUND_THINKING + "\n</think>\n\n391"})
    assert verdict["passed"] and verdict["answer"] == "391"


def test_the_expectation_is_judged_on_the_final_answer_not_the_thinking():
    verdict = ap.judge(ARITH, {"content": "<think>17 x 23 = 391</think>\n\nI cannot compute that."})
    assert not verdict["passed"] and "391 is not in the answer" in verdict["reason"]


def test_a_looping_think_block_fails_and_so_does_one_that_never_closes():
    looping = ap.judge(ARITH, {"content": "391", "reasoning_content": "Wait, let me check again. " * 30})
    assert not looping["passed"] and looping["reason"].startswith("the think block is degenerate")
    unclosed = dict(ARITH, max_tokens=64)
    verdict = ap.judge(unclosed, {"content": "<think>\n" + SOUND_THINKING[:300]})
    assert not verdict["passed"] and "did not close within max_tokens 64" in verdict["reason"]


# The request

def test_the_request_is_greedy_seeded_and_carries_the_probes_own_settings():
    probe = {"name": "add", "prompt": "Add 48 and 76. /no_think", "system": "Be brief.", "max_tokens": 768,
             "chat_template_kwargs": {"enable_thinking": False}}
    body = ap.request_body(probe, "qwen3", seed=7, extra={"cache_prompt": False})
    assert body["temperature"] == 0 and body["top_k"] == 1 and body["seed"] == 7 and body["max_tokens"] == 768
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Add 48 and 76. /no_think"}]
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["cache_prompt"] is False
    assert body["stream"] is False and body["model"] == "qwen3"
    plain = ap.request_body({"prompt": "x"}, "m")
    assert plain["seed"] == ap.DEFAULT_SEED and plain["max_tokens"] == ap.DEFAULT_MAX_TOKENS
    assert "chat_template_kwargs" not in plain and "cache_prompt" not in plain


@pytest.mark.parametrize("status,body,reason", [
    (0, {"error": "connection refused"}, "no HTTP answer (connection refused)"),
    (401, {"error": {"message": "Invalid API Key"}}, "the API key was refused (HTTP 401)"),
    (503, {"error": {"message": "Loading model"}}, "HTTP 503"),
    (200, {"content": "a /completion reply"}, "no choices[0].message"),
])
def test_a_reply_that_is_not_a_chat_completion_is_named(status, body, reason):
    message, why = ap.reply_message(status, body)
    assert message is None and reason in why


# The probe sets as data

def words(text):
    return len(text.split())


@pytest.mark.parametrize("family", ["deepseek", "qwen3", "glm", "gpt-oss", "minimax", "gemma3"])
def test_each_family_has_three_to_five_probes_of_16_tokens_or_more_and_one_of_64_or_more(family):
    fam = PROBES["families"][family]
    probes = fam["probes"]
    assert 3 <= len(probes) <= 5 and fam["meaningful"] is True and fam["markers"]
    assert len({p["name"] for p in probes}) == len(probes)
    # English runs at about 1.3 tokens a word: 13 words is 16 tokens, 50 words 64.
    assert all(words(p["prompt"]) >= 13 for p in probes), [p["name"] for p in probes if words(p["prompt"]) < 13]
    assert any(words(p["prompt"]) >= 50 for p in probes)
    for probe in probes:
        assert probe["expect"] and set(probe["expect"]) <= {"exact", "number", "contains", "any_of"}, probe["name"]
        # Room to think, except for gemma3's small base model, whose answers are capped short (see its comment).
        assert probe["max_tokens"] >= (16 if family == "gemma3" else 256), probe["name"]
        # The prompt alone must not pass its own probe (an echo would): the expectation is in the answer.
        assert not ap.judge(probe, {"content": probe["prompt"]}, fam["markers"])["passed"], probe["name"]


def test_the_catalogs_generated_models_run_no_probe_and_the_real_ones_do():
    tiny = {name: entry for name, entry in CATALOG.items() if "generator" in entry}
    assert tiny and all(name.startswith("tiny-") for name in tiny)
    for name, entry in tiny.items():
        assert ap.probe_set(PROBES, entry) == ("none", []), name
        # The user's probes do not reach them either: their weights are random.
        assert ap.probe_set(PROBES, entry, [{"name": "mine", "prompt": "x"}]) == ("none", []), name
    families = {name: ap.probe_set(PROBES, entry)[0] for name, entry in CATALOG.items() if "generator" not in entry}
    assert families["deepseek-r1-671b-iq4_xs"] == "deepseek" and families["qwen3-235b-a22b-q4_k_m"] == "qwen3"
    assert families["gemma3-270m-q4_k_m"] == "gemma3"
    for name, entry in CATALOG.items():
        if "generator" not in entry:
            assert ap.probe_set(PROBES, entry)[1], name


def test_the_users_probes_replace_by_name_append_otherwise_and_respect_families():
    entry = CATALOG["qwen3-235b-a22b-q4_k_m"]
    extra = [{"name": "red-planet", "prompt": "Mine: which planet is red? Answer in a sentence.",
              "expect": {"contains": ["mars"]}},
             {"name": "house-fact", "prompt": "Our own fact.", "expect": {"contains": ["x"]}},
             {"name": "r1-only", "families": ["deepseek"], "prompt": "R1 only.", "expect": {"number": 1}}]
    family, probes = ap.probe_set(PROBES, entry, extra)
    names = [p["name"] for p in probes]
    builtin = [p["name"] for p in PROBES["families"]["qwen3"]["probes"]]
    assert family == "qwen3" and names == builtin + ["house-fact"]
    assert probes[names.index("red-planet")]["prompt"].startswith("Mine:")
    assert "r1-only" in [p["name"] for p in ap.probe_set(PROBES, CATALOG["deepseek-r1-671b-q4_k_m"], extra)[1]]
    # An entry names its family outright, e.g. a small real model added by the user.
    assert ap.probe_set(PROBES, {"answer_probes": "qwen3", "gguf": {"architecture": "gemma3"}})[0] == "qwen3"
    assert ap.probe_set(PROBES, {"gguf": {"architecture": "gemma3"}}) == ("none", [])


# The module against a real HTTP server

KEY = "probe-test-key-0123456789abcdef"


class ChatServer:
    """llama-server's /v1/chat/completions on 127.0.0.1: the reply for each prompt comes from `answers`
    (a message dict, or an int: that HTTP status). Records every request's headers and body."""

    def __init__(self, answers, require_key=None):
        self.answers, self.require_key, self.requests = answers, require_key, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if outer.require_key and self.headers.get("Authorization") != "Bearer " + outer.require_key:
                    return self.reply(401, {"error": {"code": 401, "message": "Invalid API Key",
                                                      "type": "authentication_error"}})
                answer = outer.answers[body["prompt"] if "prompt" in body else body["messages"][-1]["content"]]
                if isinstance(answer, int):
                    return self.reply(answer, {"error": {"code": answer, "message": "Loading model",
                                                         "type": "unavailable_error"}})
                message = dict({"role": "assistant"}, **answer)
                # /v1/completions answers with the text of the continuation, as llama-server's does.
                choice = ({"text": message["content"], "index": 0, "logprobs": None, "finish_reason": "stop"}
                          if self.path == "/v1/completions" else
                          {"finish_reason": "stop", "index": 0, "message": message})
                self.reply(200, {
                    "choices": [choice],
                    "created": 1755270471, "model": body["model"], "object": "chat.completion",
                    "id": "chatcmpl-NoGZgwcGTg738xJiR2ne05HAx53rcSVG",
                    "usage": {"completion_tokens": 3, "prompt_tokens": 24, "total_tokens": 27},
                    "timings": {"prompt_n": 24, "prompt_ms": 120.5, "predicted_n": 3, "predicted_ms": 300.1}})

            def reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/v1/chat/completions" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def deepseek_probes():
    return PROBES["families"]["deepseek"]["probes"]


def right_answers():
    """What a working DeepSeek-R1 would say to the kit's probes: thinking first, in either shape."""
    answers = {"multiply": {"content": "<think>\n17 x 20 = 340, 17 x 3 = 51, so 391.\n</think>\n\n391"},
               "capital": {"content": "Okay, Australia's capital is not Sydney.\n</think>\n\nThe capital of "
                                      "Australia is Canberra."},
               "only-word": {"content": "BLUEBERRY", "reasoning_content": "The user wants one word in capitals."},
               "warehouse": {"content": "1250 + 340 - 125 = 1465\n1465 + 410 - 600 = 1275\n1275 - 75 = 1200\n"
                                        "1200 + 90 = 1290\n\n**1,290**",
                             "reasoning_content": "Let me track the stock day by day."},
               "sky": {"content": "The sky looks blue because air molecules scatter short blue wavelengths of "
                                  "sunlight far more than red ones (Rayleigh scattering)."}}
    return {p["prompt"]: answers[p["name"]] for p in deepseek_probes()}


def module_args(server, **extra):
    args = {"url": server.url, "model": "deepseek-r1", "probes": deepseek_probes(),
            "markers": PROBES["families"]["deepseek"]["markers"], "timeout": 30}
    args.update(extra)
    return args


def test_the_module_passes_a_working_model_and_sends_greedy_requests_with_the_key_from_a_file(tmp_path):
    keyfile = tmp_path / "api-key"
    keyfile.write_text(KEY + "\n")
    with ChatServer(right_answers(), require_key=KEY) as server:
        out = run_module("hmk_answer_probe", tmp_path,
                         module_args(server, api_key_file=str(keyfile), extra_body={"cache_prompt": False}))
    assert out.get("failed") is not True and out["passed"] is True, out
    assert [v["name"] for v in out["verdicts"]] == [p["name"] for p in deepseek_probes()]
    assert all(v["passed"] and v["status"] == 200 for v in out["verdicts"])
    assert len(server.requests) == len(deepseek_probes())
    for request in server.requests:
        assert request["path"] == "/v1/chat/completions"
        assert request["headers"]["Authorization"] == "Bearer " + KEY
        assert request["body"]["temperature"] == 0 and request["body"]["seed"] == 1234
        assert request["body"]["cache_prompt"] is False and request["body"]["max_tokens"] == 1024
    assert KEY not in json.dumps(out)


def test_the_module_fails_a_garbage_answer_naming_the_prompt_the_answer_and_the_expectation(tmp_path):
    answers = right_answers()
    warehouse = next(p for p in deepseek_probes() if p["name"] == "warehouse")
    answers[warehouse["prompt"]] = {"content": "GGGGGGGGGGGGGGGGGGGGGGGGGGGGGGG"}
    with ChatServer(answers, require_key=KEY) as server:
        out = run_module("hmk_answer_probe", tmp_path, module_args(server, api_key=KEY))
    assert out["failed"] is True and out["passed"] is False and out["failed_probes"] == ["warehouse"]
    assert "1 of 5 answer probes failed" in out["msg"] and "probe warehouse failed" in out["msg"]
    assert "one letter repeated 31 times" in out["msg"] and "GGGGGGGGGGGGGGGGGGGGGGGGGGGGGGG" in out["msg"]
    assert "the number 1290" in out["msg"] and "A small warehouse" in out["msg"]
    assert KEY not in json.dumps(out)


def test_a_refused_key_a_loading_engine_and_no_server_are_named(tmp_path):
    answers = right_answers()
    first = deepseek_probes()[0]
    answers[first["prompt"]] = 503
    with ChatServer(answers, require_key=KEY) as server:
        wrong_key = run_module("hmk_answer_probe", tmp_path, module_args(server, api_key="not-" + KEY))
        loading = run_module("hmk_answer_probe", tmp_path, module_args(server, api_key=KEY))
        url = server.url
    assert wrong_key["failed"] and all("the API key was refused (HTTP 401)" == v["reason"]
                                       for v in wrong_key["verdicts"])
    assert loading["failed_probes"] == [first["name"]] and "HTTP 503" in loading["verdicts"][0]["reason"]
    gone = run_module("hmk_answer_probe", tmp_path, {"url": url, "model": "m", "probes": deepseek_probes()[:1],
                                                     "timeout": 5})
    assert gone["failed"] and gone["verdicts"][0]["status"] == 0
    assert gone["verdicts"][0]["reason"].startswith("no HTTP answer")


def test_no_probes_pass_without_a_request_and_a_probe_without_a_prompt_is_refused(tmp_path):
    with ChatServer({}) as server:
        out = run_module("hmk_answer_probe", tmp_path, module_args(server, probes=[]))
        refused = run_module("hmk_answer_probe", tmp_path, module_args(server, probes=[{"name": "x", "prompt": " "}]))
    assert out["passed"] is True and out["verdicts"] == [] and not server.requests
    assert refused["failed"] and "probes[0] (x) has no prompt" in refused["msg"]


# Base models: the probe as raw text to /v1/completions

def gemma_probes():
    return ap.probe_set(PROBES, CATALOG["gemma3-270m-q4_k_m"])[1]


def test_the_gemma3_base_model_is_probed_as_raw_text_with_a_stop_at_the_end_of_the_line():
    probes = gemma_probes()
    assert probes and all(p["endpoint"] == "completions" and p["stop"] == ["\n"] for p in probes)
    body = ap.request_body(probes[0], "gemma")
    assert "messages" not in body and body["prompt"] == probes[0]["prompt"] and body["stop"] == ["\n"]
    assert body["temperature"] == 0 and body["top_k"] == 1 and body["seed"] == ap.DEFAULT_SEED
    # Each prompt ends where the answer starts, after one worked example a base model can follow.
    assert all(p["prompt"].rstrip().endswith(("Answer:", "is called")) for p in probes)
    # A user's probe for the family goes the same way unless it says otherwise; chat families keep chat.
    mine = ap.probe_set(PROBES, CATALOG["gemma3-270m-q4_k_m"],
                        [{"name": "mine", "prompt": "Question: 1+1?\nAnswer:", "expect": {"number": 2}}])[1]
    assert mine[-1]["endpoint"] == "completions"
    assert {p["endpoint"] for p in ap.probe_set(PROBES, CATALOG["qwen3-235b-a22b-q4_k_m"])[1]} == {"chat"}
    assert ap.probe_url("http://127.0.0.1:8080/v1/chat/completions", probes[0]) == \
        "http://127.0.0.1:8080/v1/completions"
    assert ap.probe_url("http://127.0.0.1:8080/v1/chat/completions", {"prompt": "x"}) == \
        "http://127.0.0.1:8080/v1/chat/completions"


def test_a_text_completion_is_judged_on_its_text():
    message, why = ap.reply_message(200, {"choices": [{"text": " Paris", "index": 0, "finish_reason": "stop"}]})
    assert why is None and message == {"content": " Paris"}
    capital = next(p for p in gemma_probes() if p["name"] == "capital")
    assert ap.judge(capital, message, PROBES["families"]["gemma3"]["markers"])["passed"] is True
    # A wrong chat template shows as its markers in the text; a base model rambling on is a loop.
    wrong = ap.judge(capital, {"content": " Paris<end_of_turn>"}, PROBES["families"]["gemma3"]["markers"])
    assert not wrong["passed"] and "chat template markers (<end_of_turn>)" in wrong["reason"]
    assert not ap.judge(capital, {"content": " the the the"})["passed"]


def test_the_module_sends_a_base_models_probes_to_v1_completions(tmp_path):
    answers = {p["prompt"]: {"content": {"capital": " Paris", "add": " 4", "dog-name": " Rex."}[p["name"]]}
               for p in gemma_probes()}
    with ChatServer(answers) as server:
        out = run_module("hmk_answer_probe", tmp_path, {"url": server.url, "model": "gemma", "probes": gemma_probes(),
                                                        "markers": PROBES["families"]["gemma3"]["markers"],
                                                        "timeout": 30})
        answers[gemma_probes()[1]["prompt"]] = {"content": " 5"}
        bad = run_module("hmk_answer_probe", tmp_path, {"url": server.url, "model": "gemma", "probes": gemma_probes(),
                                                        "timeout": 30})
    assert out["passed"] is True, out
    assert {r["path"] for r in server.requests} == {"/v1/completions"}
    assert all(r["body"]["stop"] == ["\n"] and "messages" not in r["body"] for r in server.requests)
    assert bad["failed"] and bad["failed_probes"] == ["add"] and "the number 4 is not in the answer" in bad["msg"]
    assert "Answer: '5'" in bad["msg"] and "What is 2 + 2?" in bad["msg"]


# Which probes the gate runs for the served file (plan)

def test_the_plan_follows_the_catalog_entry_that_lists_the_served_file():
    gemma = ap.plan(PROBES, CATALOG, "/srv/models/gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf")
    assert gemma["family"] == "gemma3" and gemma["model_id"] == "gemma3-270m-q4_k_m"
    assert [p["name"] for p in gemma["probes"]] == ["capital", "add", "dog-name"]
    assert gemma["markers"] == PROBES["families"]["gemma3"]["markers"] and "3 probes" in gemma["reason"]
    # The molecule twins' tiny models: the catalog's split files, and the files no entry lists.
    tiny = ap.plan(PROBES, CATALOG, "/srv/models/tiny-deepseek2/tiny-deepseek2-00001-of-00002.gguf")
    assert tiny["family"] == "none" and tiny["probes"] == [] and "random" in tiny["reason"]
    assert "no answer probe runs" in tiny["reason"]
    for path in ("/srv/models/tiny-deepseek2/tiny-deepseek2.gguf", "/srv/models/tiny/tiny.gguf",
                 "/srv/models/r1/R1-00001-of-00010.gguf"):
        unlisted = ap.plan(PROBES, CATALOG, path)
        assert unlisted["probes"] == [] and "no catalog entry lists" in unlisted["reason"], path
        assert "inference_service_answer_probe_family" in unlisted["reason"]


def test_a_named_family_probes_an_unlisted_file_and_none_switches_a_listed_one_off():
    mine = ap.plan(PROBES, CATALOG, "/srv/models/my-qwen3/my-qwen3-q4.gguf", "qwen3",
                   [{"name": "house", "prompt": "Our fact?", "expect": {"contains": ["x"]}}])
    assert mine["family"] == "qwen3" and mine["model_id"] is None and mine["probes"][-1]["name"] == "house"
    off = ap.plan(PROBES, CATALOG, "/srv/models/gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf", "none")
    assert off["probes"] == [] and off["family"] == "none"
    with pytest.raises(ValueError, match="not one of"):
        ap.plan(PROBES, CATALOG, "/srv/models/x.gguf", "llama")


def test_the_roles_family_choices_are_the_families_of_the_data():
    specs = yaml.safe_load(open(os.path.join(ROOT, "roles", "inference_service", "meta", "argument_specs.yml"),
                                encoding="utf-8"))
    option = specs["argument_specs"]["main"]["options"]["inference_service_answer_probe_family"]
    assert sorted(option["choices"]) == sorted(["auto"] + list(PROBES["families"]))
    rules = open(os.path.join(ROOT, "roles", "inference_service", "vars", "main.yml"), encoding="utf-8").read()
    assert "choices: [%s]}" % ", ".join(option["choices"]) in rules


@pytest.mark.parametrize("probe,problem", [
    ({"name": "ok", "prompt": "2+2?", "expect": {"number": 4}}, None),
    ({"name": "ok", "prompt": "2+2?", "endpoint": "completions", "stop": ["\n"], "max_tokens": 8,
      "families": ["gemma3"], "expect": {"any_of": ["4", "four"]}}, None),
    ({"name": "x", "prompt": "2+2?", "expect": {"number": float("nan")}}, "expect.number is a finite number"),
    ({"name": "x", "prompt": "2+2?", "expect": {"number": True}}, "expect.number is a finite number"),
    ({"name": "x", "prompt": "2+2?", "min_words": True, "expect": {"number": 4}}, "min_words is an integer"),
    ({"name": "x", "prompt": "2+2?", "stop": "\n", "expect": {"number": 4}}, "stop is a list"),
    ({"name": "x", "prompt": "2+2?", "expect": {"exact": " "}}, "expect.exact is a non-empty string"),
    ("a string", "a probe is a mapping"),
])
def test_a_users_probe_is_checked_as_data(probe, problem):
    found = ap.probe_problem(probe)
    assert (found is None) if problem is None else (problem in found), found


# The role's wiring: the plan the gate renders, in process with Ansible's templar on the role's own variables

def _render_plan(model_path, **overrides):
    variables = role_vars("inference_service", dict(
        {"inference_service_model_path": model_path,
         "role_path": os.path.join(ROOT, "roles", "inference_service")}, **overrides))
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(variables["__inference_service_answer_plan"]), \
        templar.template(variables["__inference_service_deployment"]["answer_probe"])


def test_the_role_renders_the_plan_for_the_served_file_and_records_it_for_validate():
    plan, recorded = _render_plan("/srv/models/gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf")
    assert plan["family"] == "gemma3" and len(plan["probes"]) == 3 and recorded == plan
    # The lab twins' tiny model: no probe, with the reason the gate prints.
    tiny, recorded = _render_plan("/srv/models/tiny-deepseek2/tiny-deepseek2-00001-of-00002.gguf")
    assert tiny["probes"] == [] and recorded["probes"] == [] and "no answer probe runs" in tiny["reason"]
    off, recorded = _render_plan("/srv/models/gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf",
                                 inference_service_answer_probe=False)
    assert off["probes"] and recorded["probes"] == []
    assert recorded["reason"] == "inference_service_answer_probe is false"
    # The inventory's own catalog entries count, and the user's probes are merged in.
    mine, _unused = _render_plan("/srv/models/mine/mine-q4.gguf", model_sync_catalog={"mine": {
        "answer_probes": "qwen3", "files": [{"name": "mine-q4.gguf", "size": 1, "sha256": "0" * 64}]}},
        inference_service_answer_probes=[{"name": "house", "prompt": "Our fact?", "expect": {"contains": ["x"]}}])
    assert mine["family"] == "qwen3" and mine["model_id"] == "mine" and mine["probes"][-1]["name"] == "house"


def test_the_gate_runs_the_probe_inside_the_block_that_rolls_back_and_says_when_none_runs():
    gate = yaml.safe_load(open(os.path.join(ROOT, "roles", "inference_service", "tasks", "gate.yml"), encoding="utf-8"))
    probe = next(t for t in gate if "hmk.moe_kit.hmk_answer_probe" in t)
    args = probe["hmk.moe_kit.hmk_answer_probe"]
    assert args["probes"] == "{{ __inference_service_answer_run.probes }}"
    assert "__inference_service_answer_run.probes | length > 0" in probe["when"]
    # Chosen once per gate, by the gate's first task, from the role's plan.
    chosen = gate[0]["ansible.builtin.set_fact"]["__inference_service_answer_run"]
    assert chosen == "{{ __inference_service_answer_plan }}"
    assert "not ansible_check_mode" in probe["when"] and "failed_when" not in probe
    said = next(t for t in gate if "ansible.builtin.debug" in t and "answer_run.reason" in str(t))
    assert "__inference_service_answer_run.probes | length == 0" in str(said["when"])
    # After the smoke completion, before the placement proof.
    names = [next(iter(k for k in t if k.startswith(("hmk.", "ansible.")))) for t in gate]
    assert names.index("hmk.moe_kit.hmk_answer_probe") > names.index("ansible.builtin.assert")
    service = open(os.path.join(ROOT, "roles", "inference_service", "tasks", "service.yml"), encoding="utf-8").read()
    assert "include_tasks: gate.yml" in service.split("rescue:")[0] and "rollback.yml" in service.split("rescue:")[1]
    rollback = yaml.safe_load(open(os.path.join(ROOT, "roles", "inference_service", "tasks", "rollback.yml"),
                                   encoding="utf-8"))
    restored = next(t for t in rollback if "block" in t and "rescue" in t)["block"]
    regate = next(t for t in restored if t.get("ansible.builtin.include_tasks") == "gate.yml")
    assert "last_good_manifest" in regate["vars"]["__inference_service_answer_model"]
