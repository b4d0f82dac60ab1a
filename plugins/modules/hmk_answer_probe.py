#!/usr/bin/python
# -*- coding: utf-8 -*-
"""The answer probe: greedy completions of fixed prompts, judged on the answer, so a node that serves garbage at
full speed fails instead of passing on any non-empty reply."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_answer_probe
short_description: Check that an inference endpoint answers fixed prompts correctly, not only that it answers
description:
  - Posts each probe to an OpenAI-compatible C(/v1/chat/completions) URL as a greedy completion (temperature 0,
    top_k 1, a fixed I(seed), the probe's C(max_tokens)) and judges the answer with
    plugins/module_utils/hmk_answer_probe.py.
  - A probe with C(endpoint=completions) is sent as raw text to the same server's C(/v1/completions) instead, with
    its C(stop) strings, and C(choices[0].text) is judged, since a pretrained base model continues text and has no
    chat turn to answer.
  - A probe passes when its final answer (after any C(<think>) block or C(reasoning_content)) holds what the probe
    expects (C(exact), C(number), C(contains), C(any_of), compared after normalising case, whitespace, thousands
    separators and a trailing period) and is not degenerate. Degenerate is an empty answer, fewer words than the
    probe's C(min_words), no letter or digit, U+FFFD replacement characters, control tokens (C(<unk>), C(<pad>)) or
    chat template markers printed as text, one letter repeated 5 times or a symbol 10 times in a row, a word
    repeated 3 times or a token 6 times in a row, a text whose word 4-grams or character 6-grams are mostly
    repeats, the prompt echoed, or CJK characters in the answer to a prompt that has none.
  - A think block is judged only on the checks that mean garbage at any length (loops, U+FFFD, control tokens); a
    think block that never closes within C(max_tokens) fails as "no final answer".
  - Fails when any probe fails, with each failed probe's name, prompt, answer, what was expected and why; the
    verdicts come back either way. Never changes anything; runs the same in check mode.
options:
  url:
    description: The chat completions URL, e.g. C(http://127.0.0.1:8080/v1/chat/completions).
    type: str
    required: true
  model:
    description: The model name sent in each request (the engine's alias).
    type: str
    required: true
  probes:
    description:
      - The probes, each with C(name), C(prompt), optional C(endpoint) (C(chat), the default, or C(completions)),
        C(stop), C(system), C(max_tokens), C(min_words), C(chat_template_kwargs) and C(expect)
        (roles/inference_service/vars/answer_probes.yml describes them).
      - An empty list probes nothing and passes (the kit's generated test models have no meaningful answers).
    type: list
    elements: dict
    required: true
  markers:
    description: Chat template tokens of the model's family that must never appear in an answer.
    type: list
    elements: str
    default: []
  api_key_file:
    description: A file holding the API key (sent as a Bearer token); preferred over I(api_key), since the key then
      never passes through a task's arguments. Read on the host the module runs on.
    type: path
  api_key:
    description: The API key itself; empty sends none. Never logged, never returned.
    type: str
    default: ""
  seed:
    description: The seed sent with every probe.
    type: int
    default: 1234
  timeout:
    description: Seconds one probe's completion may take (a thinking model on CPU experts needs minutes).
    type: int
    default: 600
  extra_body:
    description: "Keys added to every request body, for engine-specific options (llama-server's
      C(cache_prompt: false) makes a re-run process the prompt again rather than reuse the cache)."
    type: dict
    default: {}
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The model answers the probes of its family correctly
  hmk.moe_kit.hmk_answer_probe:
    url: http://127.0.0.1:8080/v1/chat/completions
    model: qwen3-235b-a22b
    probes: "{{ __inference_service_answer_probes.families.qwen3.probes }}"
    markers: "{{ __inference_service_answer_probes.families.qwen3.markers }}"
    api_key_file: /etc/hmk/hmk-inference.api-key
    extra_body: {cache_prompt: false}
  register: answers
"""

RETURN = r"""
passed:
  description: Whether every probe passed.
  type: bool
  returned: always
verdicts:
  description: One per probe, in order, each with C(name), C(passed), C(reason) (a short message naming what
    failed), C(prompt), C(answer) (the final answer, after any think block), C(expected), C(reasoning_chars) (the
    think block's length), C(status) (the HTTP status, 0 when none came) and C(seconds).
  type: list
  elements: dict
  returned: always
failed_probes:
  description: The names of the probes that failed.
  type: list
  elements: str
  returned: always
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.six.moves.urllib.error import HTTPError
from ansible.module_utils.urls import open_url
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_answer_probe as judge_lib
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import check_all


HINT = ("The model loads and answers, but not correctly: what that means and the engine issues and flags to try are "
        "in the operator's guide (docs/docsite/rst/operator_guide.rst), section 'The answer probe'.")


def post(url, body, api_key, timeout):
    """(status, parsed JSON or {"error"/"body": ...}) of one completion; never raises. status 0: no HTTP answer."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    try:
        response = open_url(url, data=json.dumps(body), headers=headers, method="POST", timeout=timeout,
                            validate_certs=False, follow_redirects="none")
        status, raw = response.getcode(), response.read()
    except HTTPError as exc:
        status, raw = exc.code, exc.read() if hasattr(exc, "read") else b""
    except Exception as exc:  # pylint: disable=broad-except  # refused, reset, timed out: a failed probe, named
        return 0, {"error": to_text(exc)}
    text = raw.decode("utf-8", "replace")
    try:
        answer = json.loads(text or "{}")
    except ValueError:
        return status, {"body": text[:400]}
    return status, answer if isinstance(answer, dict) else {"body": answer}


def run_probe(probe, params, api_key):
    body = judge_lib.request_body(probe, params["model"], params["seed"], params["extra_body"])
    start = time.time()
    status, answer = post(judge_lib.probe_url(params["url"], probe), body, api_key, params["timeout"])
    message, why = judge_lib.reply_message(status, answer)
    if message is None:
        verdict = {"name": probe.get("name", ""), "passed": False, "reason": why, "prompt": probe["prompt"],
                   "answer": "", "expected": judge_lib.expected_text(probe.get("expect") or {}),
                   "reasoning_chars": 0}
    else:
        verdict = judge_lib.judge(probe, message, params["markers"])
    verdict["status"] = status
    verdict["seconds"] = round(time.time() - start, 1)
    if api_key:
        # An engine that echoes the request (an error body) must not carry the key into the result.
        for key in ("reason", "answer"):
            verdict[key] = verdict[key].replace(api_key, "********")
    return verdict


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            probes=dict(type="list", elements="dict", required=True),
            markers=dict(type="list", elements="str", default=[], no_log=False),
            api_key_file=dict(type="path", no_log=False),
            api_key=dict(type="str", default="", no_log=True),
            seed=dict(type="int", default=1234),
            timeout=dict(type="int", default=600),
            extra_body=dict(type="dict", default={}),
        ),
        mutually_exclusive=[("api_key", "api_key_file")],
        supports_check_mode=True,
    )
    p = module.params
    refusals = check_all([
        {"var": "url", "value": p["url"], "rule": "url"},
        {"var": "timeout", "value": p["timeout"], "rule": "int", "min": 1, "max": 86400}])
    for i, probe in enumerate(p["probes"]):
        if not isinstance(probe.get("prompt"), str) or not probe["prompt"].strip():
            refusals.append("probes[%d] (%s) has no prompt" % (i, probe.get("name", "")))
        if judge_lib.endpoint(probe) not in judge_lib.ENDPOINTS:
            refusals.append("probes[%d] (%s): endpoint is chat or completions, not %r"
                            % (i, probe.get("name", ""), probe.get("endpoint")))
        if not isinstance(probe.get("expect") or {}, dict):
            refusals.append("probes[%d] (%s): expect is not a mapping" % (i, probe.get("name", "")))
    if refusals:
        module.fail_json(msg="refused: " + " | ".join(refusals), refusals=refusals)
    api_key = p["api_key"]
    if p["api_key_file"]:
        try:
            with open(p["api_key_file"], "r") as handle:
                api_key = handle.read().strip()
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read api_key_file %s: %s" % (p["api_key_file"], exc.strerror))
        module.no_log_values.add(api_key)
    verdicts = [run_probe(probe, p, api_key) for probe in p["probes"]]
    failed = [v for v in verdicts if not v["passed"]]
    result = {"changed": False, "passed": not failed, "verdicts": verdicts, "failed_probes": [v["name"] for v in failed]}
    if failed:
        lines = ["probe %s failed: %s. Prompt: %r. Answer: %r. Expected: %s." % (
            v["name"], v["reason"], v["prompt"], v["answer"][:400], v["expected"]) for v in failed]
        message = "%d of %d answer probes failed. %s %s" % (len(failed), len(verdicts), " ".join(lines), HINT)
        module.fail_json(msg=message, **result)
    module.exit_json(msg="%d answer probes passed" % len(verdicts), **result)


if __name__ == "__main__":
    main()
