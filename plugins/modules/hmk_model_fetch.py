#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_model_fetch
short_description: Fetch one model's files resumably, verify sha256 and GGUF metadata, publish atomically
description:
  - Plans per file - already verified (size + mtime stamp, or a full re-hash), or missing bytes to fetch.
  - Fails before the first byte when the missing bytes plus the margin do not fit in the free space.
  - Downloads into C(<staging_dir>/<model>/<name>.partial) over HTTP/HTTPS (received in the module, ranged resume), with rsync (SSH, --append-verify), or
    copies from a local/NFS path; hashes the bytes while they stream, resumes a partial after hashing it.
  - With source_kind huggingface the files are the lock's (repo, commit, path, size, sha256) and come from the Hub's
    resolve/ URLs, redirects to its storage followed; before the first byte one HEAD per file checks that the token
    is accepted and that the Hub still serves the locked commit, size and sha256.
  - Checks sha256 and size, then the GGUF header against the catalog, then renames into place. A file that
    fails goes to the quarantine directory; the published copy is never replaced by a bad one.
  - Writes progress lines to C(log_path) while it runs. Supports check mode (reports what it would fetch).
  - >-
    One model at a time per node: a run (not check mode) holds C(<state_dir>/.sync.lock), so that jobs started side by
    side for several models (async, one per model) fetch one after the other and each run's free-space check stays
    true; a run that has to wait writes a C(waiting) line to C(log_path) first.
  - >-
    M(hmk.moe_kit.hmk_job_progress) with its O(hmk.moe_kit.hmk_job_progress#module:model) option reads these lines
    back and reports bytes, rate and time left on the control machine.
options:
  model:
    description: Catalog name of the model (used in paths under state_dir and quarantine_dir, and in messages).
    type: str
    required: true
  dest:
    description: Directory the model's files are published in.
    type: path
    required: true
  state_dir:
    description: Directory for the verified-hash stamps (one JSON file per model file).
    type: path
    required: true
  quarantine_dir:
    description: Where files that failed verification are moved.
    type: path
    required: true
  staging_dir:
    description:
      - Where partial downloads wait (one directory per model), on the same filesystem as C(dest). Nothing is written
        outside it, C(dest), C(state_dir) and C(quarantine_dir); the next run resumes a partial left there.
      - Defaults to C(.staging) beside C(dest).
    type: path
  files:
    description:
      - Files to sync, each with name, size (bytes), sha256, and optionally source (path relative to the source).
      - For source_kind huggingface also repo, commit and path (the file in the repository), as the lock has them.
    type: list
    elements: dict
    required: true
  gguf_expect:
    description: Expected GGUF metadata (architecture, expert_count, block_count, split_count, rope_*...).
    type: dict
    default: {}
  source_kind:
    description: Transport.
    type: str
    choices: [http, rsync, local, huggingface]
    required: true
  source_location:
    description:
      - Base URL (http), rsync source C(user@host:/path) (rsync) or directory (local) of this model.
      - For huggingface the Hub endpoint, e.g. https://huggingface.co.
    type: str
    required: true
  http_token:
    description: Bearer token for HTTP and the Hub; sent only in the request header to the first URL's host (not after a redirect
      to another host), never on a command line, never logged.
    type: str
  http_follow_redirects:
    description: Follow up to 5 redirects, never from https to http; off keeps every request on the configured host.
    type: bool
    default: false
  rsync_ssh_options:
    description: Extra ssh options for rsync, e.g. [-i, /root/.ssh/model_store, -p, "2222"].
    type: list
    elements: str
    default: []
  parallel:
    description: Files fetched at once.
    type: int
    default: 2
  retries:
    description: Extra attempts per file after a failed transfer; each resumes from the partial.
    type: int
    default: 3
  retry_delay:
    description: Seconds before the first retry (grows linearly, at most 60).
    type: float
    default: 5
  stall_seconds:
    description: A transfer slower than 1 KiB/s for this long is aborted (and retried).
    type: int
    default: 120
  rehash:
    description: Re-hash every published file instead of trusting the size + mtime stamp.
    type: bool
    default: false
  free_space_margin:
    description: Bytes that must stay free after the missing bytes are fetched.
    type: int
    default: 0
  log_path:
    description: Progress log on the node (tail -f it); empty disables.
    type: path
    default: /var/log/hmk-model-sync.log
  progress_interval:
    description: Seconds between progress lines.
    type: int
    default: 10
  owner:
    description: Owner of the published files.
    type: str
    default: root
  group:
    description: Group of the published files.
    type: str
    default: root
  mode:
    description: Mode of the published files (octal string).
    type: str
    default: "0644"
author: hybrid-moe-kit developers (@hybrid-moe-kit)
"""

EXAMPLES = r"""
- name: DeepSeek-R1 IQ4_XS is on the model disk, verified
  hmk_model_fetch:
    model: deepseek-r1-671b-iq4_xs
    dest: /srv/models/deepseek-r1-671b-iq4_xs
    state_dir: /srv/models/.hmk-sync
    quarantine_dir: /srv/models/.quarantine
    files: "{{ catalog['deepseek-r1-671b-iq4_xs'].files }}"
    gguf_expect: "{{ catalog['deepseek-r1-671b-iq4_xs'].gguf }}"
    source_kind: http
    source_location: http://models.lab:8080/DeepSeek-R1-IQ4_XS
"""

RETURN = r"""
plan:
  description: Per file - name, size, sha256, action (ok, stamp, fetch), reason, partial and missing bytes.
  type: list
  returned: always
bytes_needed:
  description: Bytes that were (or in check mode would be) fetched.
  type: int
  returned: always
free_bytes:
  description: Free bytes at the destination before the sync.
  type: int
  returned: always
bytes_received:
  description: Bytes received over the transport in this run.
  type: int
  returned: always
fetched:
  description: Files fetched, verified and published in this run.
  type: list
  returned: always
quarantined:
  description: Paths of files that failed verification and were moved aside.
  type: list
  returned: always
"""

import grp
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_hub import hub_source
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_model_sync import (
    ProgressLog, Source, SyncError, Syncer, one_sync_at_a_time, validate_catalog)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model=dict(type="str", required=True),
            dest=dict(type="path", required=True),
            state_dir=dict(type="path", required=True),
            quarantine_dir=dict(type="path", required=True),
            staging_dir=dict(type="path"),
            files=dict(type="list", elements="dict", required=True),
            gguf_expect=dict(type="dict", default={}),
            source_kind=dict(type="str", required=True, choices=["http", "rsync", "local", "huggingface"]),
            source_location=dict(type="str", required=True),
            http_token=dict(type="str", no_log=True),
            http_follow_redirects=dict(type="bool", default=False),
            rsync_ssh_options=dict(type="list", elements="str", default=[]),
            parallel=dict(type="int", default=2),
            retries=dict(type="int", default=3),
            retry_delay=dict(type="float", default=5),
            stall_seconds=dict(type="int", default=120),
            rehash=dict(type="bool", default=False),
            free_space_margin=dict(type="int", default=0),
            log_path=dict(type="path", default="/var/log/hmk-model-sync.log"),
            progress_interval=dict(type="int", default=10),
            owner=dict(type="str", default="root"),
            group=dict(type="str", default="root"),
            mode=dict(type="str", default="0644"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problems = validate_catalog({p["model"]: {"files": p["files"]}}, [p["model"]])
    if problems:
        module.fail_json(msg="; ".join(problems))
    try:
        owner, group = pwd.getpwnam(p["owner"]).pw_uid, grp.getgrnam(p["group"]).gr_gid
    except KeyError as exc:
        module.fail_json(msg="owner %s or group %s does not exist on the node: %s" % (p["owner"], p["group"], exc))
    files = p["files"]
    if p["source_kind"] == "huggingface":
        missing = [f.get("name") for f in files if not all(f.get(k) for k in ("repo", "commit", "path"))]
        if missing:
            module.fail_json(msg="%s: files %s lack repo, commit or path (the lock's entries)" % (p["model"], missing))
        source, files = hub_source(p["source_location"], files, token=p["http_token"], retries=p["retries"],
                                   retry_delay=p["retry_delay"], stall_seconds=p["stall_seconds"])
    else:
        source = Source(p["source_kind"], p["source_location"], token=p["http_token"],
                        follow_redirects=p["http_follow_redirects"], ssh_options=p["rsync_ssh_options"],
                        retries=p["retries"], retry_delay=p["retry_delay"], stall_seconds=p["stall_seconds"])
    log = ProgressLog(None if module.check_mode else p["log_path"], p["model"], p["progress_interval"])
    try:
        syncer = Syncer(p["model"], p["dest"], p["state_dir"], p["quarantine_dir"], files, source,
                        gguf_expect=p["gguf_expect"], parallel=p["parallel"], rehash=p["rehash"],
                        margin=p["free_space_margin"], log=log, owner=owner, group=group, mode=int(p["mode"], 8),
                        check_mode=module.check_mode, staging_dir=p["staging_dir"])
        if module.check_mode:
            result = syncer.run()
        else:
            with one_sync_at_a_time(p["state_dir"], log):
                result = syncer.run()
    except SyncError as exc:
        module.fail_json(msg="%s: %s" % (p["model"], exc), bytes_received=0)
    except (IOError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (p["model"], exc), bytes_received=0)
    errors = result.pop("errors")
    if errors:
        module.fail_json(msg="%s: %d file(s) failed: %s" % (p["model"], len(errors), " | ".join(errors)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
