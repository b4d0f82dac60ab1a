#!/usr/bin/python
# -*- coding: utf-8 -*-
"""The service's health gate after a (re)start: ready, or failed with the reason and the engine's last words."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_inference_gate
short_description: Wait until a restarted inference service is ready, or fail early with the reason
description:
  - Polls the unit every second and the engine's own C(/health) until it answers 200 (llama.cpp-family engines
    answer 503 while the model loads; sglang-kt's runs one token first).
  - Fails as soon as the unit has failed, or systemd restarted the engine (it exited), instead of waiting out the
    timeout; fails when the timeout passes. The message carries the unit's result and the engine's last journal
    lines since C(since), and names each CUDA error those lines show by class (no_kernel_image, cublas,
    illegal_memory_access, out_of_memory, init_failure, cuda_error) with its line and what to try.
  - Once ready, sends the short chat completion of I(smoke) in the same visit and returns its HTTP status and
    JSON body for the caller to judge (a failed completion does not fail this module).
  - Only reads; the caller restarts the unit.
options:
  unit:
    description: The systemd unit.
    type: str
    required: true
  url:
    description: The health URL.
    type: str
    required: true
  timeout:
    description: Seconds the engine may take to become ready.
    type: int
    default: 600
  since:
    description: Journal lines from this time (seconds since the epoch) on go into a failure's message.
    type: float
    default: 0
  journal_lines:
    description: How many of the engine's last journal lines a failure carries (CUDA errors are looked for in up to
      2000 lines, since a crash's backtrace can push them out of the last few).
    type: int
    default: 25
  smoke:
    description: A chat completion to send once the engine is ready (OpenAI-compatible C(/v1/chat/completions)).
    type: dict
    suboptions:
      url: {description: The completions URL., type: str, required: true}
      model: {description: The model name sent., type: str, required: true}
      prompt: {description: The user message., type: str, required: true}
      max_tokens: {description: Tokens asked for., type: int, default: 8}
      timeout: {description: Seconds the completion may take., type: int, default: 300}
  smoke_api_key:
    description:
      - Bearer token of the I(smoke) completion; empty sends none; never logged.
      - An option of its own, not inside I(smoke), so the node's log of the invocation shows it as not logged. A
        nested option is logged as part of its parent's text, where a backslash or quote in the key is escaped and
        no longer matches the value Ansible masks.
    type: str
    default: ""
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: The engine answers /health and a one-line chat completion
  hmk.moe_kit.hmk_inference_gate:
    unit: hmk-inference.service
    url: http://127.0.0.1:8080/health
    timeout: 1800
    since: "{{ engine_state.now }}"
    smoke:
      url: http://127.0.0.1:8080/v1/chat/completions
      model: qwen3-235b-a22b
      prompt: Say OK.
    smoke_api_key: "{{ vault_inference_api_key }}"
"""

RETURN = r"""
waited:
  description: Seconds until ready (or until the failure).
  type: float
  returned: always
main_pid:
  description: The engine's main PID when it became ready.
  type: int
  returned: success
smoke:
  description: The completion's C(status) (0 when no HTTP answer came, with C(error)) and C(json) body.
  type: dict
  returned: success, when I(smoke) is given
cuda_errors:
  description: The CUDA errors in the engine's journal since I(since), each with C(class), C(line), C(function),
    C(location), C(hint) (plugins/module_utils/hmk_engine_log.py).
  type: list
  elements: dict
  returned: failure
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.error import HTTPError
from ansible.module_utils.urls import open_url
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_engine_log import cuda_errors
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import check_all

PROPS = "ActiveState,SubState,MainPID,NRestarts,Result,ExecMainCode,ExecMainStatus"


def unit_state(module, unit):
    _rc, out, _err = module.run_command(["systemctl", "show", unit, "--property=" + PROPS])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def verdict(first, now):
    """Why the start failed, judged from two `systemctl show` readings, or None while it may still come up."""
    if now.get("ActiveState") == "failed" or (now.get("ActiveState") == "inactive" and now.get("Result") not in
                                              (None, "", "success")):
        return "the unit failed (result %s, exit status %s)" % (now.get("Result"), now.get("ExecMainStatus"))
    if int(now.get("NRestarts") or 0) > int(first.get("NRestarts") or 0) or now.get("SubState") == "auto-restart":
        return "the engine exited and systemd is restarting it (exit status %s)" % now.get("ExecMainStatus")
    return None


def failure(unit, reason, lines, tail):
    """The failure message and the CUDA errors in the engine's lines: each named by class, line and what to try,
    before the last `tail` lines."""
    errors = cuda_errors(lines)
    named = "".join(" CUDA error %s: %s Try: %s" % (e["class"], e["line"], e["hint"]) for e in errors)
    return "%s: %s.%s Its last journal lines: %s" % (unit, reason, named, " / ".join(lines[-tail:])), errors


def ready(url):
    try:
        return open_url(url, timeout=5, validate_certs=False, follow_redirects="none").getcode() == 200
    except Exception:  # pylint: disable=broad-except  # 503 while loading, refused before the bind: not ready yet
        return False


def completion(smoke, api_key=""):
    """{status, json[, error]} of one short chat completion; never raises."""
    body = json.dumps({"model": smoke["model"], "messages": [{"role": "user", "content": smoke["prompt"]}],
                       "max_tokens": smoke["max_tokens"]})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    try:
        response = open_url(smoke["url"], data=body, headers=headers, method="POST", timeout=smoke["timeout"],
                            validate_certs=False, follow_redirects="none")
        status, raw = response.getcode(), response.read()
    except HTTPError as exc:
        status, raw = exc.code, exc.read() if hasattr(exc, "read") else b""
    except Exception as exc:  # pylint: disable=broad-except  # refused, reset, timed out: judged by the caller
        return {"status": 0, "json": {}, "error": str(exc)}
    try:
        answer = json.loads(raw.decode("utf-8", "replace") or "{}")
    except ValueError:
        answer = {"body": raw.decode("utf-8", "replace")[:400]}
    return {"status": status, "json": answer if isinstance(answer, dict) else {"body": answer}}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            url=dict(type="str", required=True),
            timeout=dict(type="int", default=600),
            since=dict(type="float", default=0),
            journal_lines=dict(type="int", default=25),
            smoke=dict(type="dict", options=dict(
                url=dict(type="str", required=True),
                model=dict(type="str", required=True),
                prompt=dict(type="str", required=True),
                max_tokens=dict(type="int", default=8, no_log=False),
                timeout=dict(type="int", default=300),
            )),
            smoke_api_key=dict(type="str", default="", no_log=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    # What the loop and the journal call can take: a NaN or infinite `since` is no time (int() raises on it).
    smoke = p["smoke"] or {}
    refusals = check_all([
        {"var": "timeout", "value": p["timeout"], "rule": "int", "min": 1, "max": 31536000},
        {"var": "since", "value": p["since"], "rule": "number", "min": 0},
        {"var": "journal_lines", "value": p["journal_lines"], "rule": "int", "min": 1, "max": 100000},
        {"var": "unit", "value": p["unit"], "rule": "unit_name"},
        {"var": "url", "value": p["url"], "rule": "url"},
        {"var": "smoke.url", "value": smoke.get("url", "http://127.0.0.1/"), "rule": "url"},
        {"var": "smoke.max_tokens", "value": smoke.get("max_tokens", 8), "rule": "int", "min": 1, "max": 1048576},
        {"var": "smoke.timeout", "value": smoke.get("timeout", 300), "rule": "int", "min": 1, "max": 86400}])
    if refusals:
        module.fail_json(msg="refused: " + " | ".join(refusals), refusals=refusals)
    start = time.time()
    first = unit_state(module, p["unit"])
    reason = None
    while True:
        now = unit_state(module, p["unit"])
        reason = verdict(first, now)
        if reason:
            break
        if now.get("ActiveState") == "active" and ready(p["url"]):
            result = {"waited": round(time.time() - start, 1), "main_pid": int(now.get("MainPID") or 0)}
            if p["smoke"]:
                result["smoke"] = completion(p["smoke"], p["smoke_api_key"])
            module.exit_json(changed=False, **result)
        if time.time() - start > p["timeout"]:
            reason = "not ready after %d s (%s/%s)" % (p["timeout"], now.get("ActiveState"), now.get("SubState"))
            break
        time.sleep(1)
    argv = ["journalctl", "--no-pager", "--quiet", "--output=cat", "--unit", p["unit"],
            "--lines", str(max(p["journal_lines"], 2000))]
    if p["since"]:
        argv += ["--since", "@%d" % int(p["since"])]
    _rc, journal, _err = module.run_command(argv)
    lines = journal.strip().splitlines()
    msg, errors = failure(p["unit"], reason, lines, p["journal_lines"])
    module.fail_json(msg=msg, reason=reason, journal=lines[-p["journal_lines"]:], cuda_errors=errors,
                     waited=round(time.time() - start, 1))


if __name__ == "__main__":
    main()
