# -*- coding: utf-8 -*-
"""The Hugging Face source of model_sync: catalog entries pinned to a repository revision, a lock file that records
what the Hub said about every file (commit, size, sha256), and the node side of the download.

Controller side (the hmk_hub_lock action): `resolve_model` reads the Hub's metadata for a revision with
huggingface_hub (imported there only, so nodes never need it); `lock_problems` compares a lock entry with the
catalog; `load_lock` / `dump_lock` read and write the lock. With a lock entry that agrees with the catalog nothing
asks the Hub again.

Node side (hmk_model_fetch with source_kind huggingface): `node_files` turns locked files into resolve/ paths and
`HubSource` is the http source (received in-module, resumable, hashed as it arrives) that follows the Hub's redirect to its storage
and, before its first byte, asks the Hub (HEAD, no redirect) whether the token is accepted and each file is still
what the lock says (X-Repo-Commit, X-Linked-Size, X-Linked-Etag), so a bad token or a moved file stops the model
before anything is written.
"""
from __future__ import absolute_import, division, print_function

import fnmatch
import hashlib
import os
import re
import tempfile
import threading

from urllib.parse import quote

from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_model_sync import Source, SyncError, http_head

__metaclass__ = type

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
LOCK_VERSION = 1
LOCK_HEADER = """\
# Written by hmk.moe_kit model_sync (hmk_hub_lock): what the Hugging Face Hub said about each file of the
# catalog's huggingface models at a pinned commit. Nodes verify the bytes they fetch (from the Hub or from a peer)
# against these sizes and sha256. Keep it with the inventory; a run with this file needs no Hub access for them.
# To follow a branch again or after changing a model's catalog entry, delete that model's entry here.
"""
GROUPS = (("files", "repo", "revision"), ("hf_files", "hf_files_repo", "hf_files_revision"))


class HubError(Exception):
    """A refusal the operator must act on; the message names the model, the value and what to do."""


# ---------------------------------------------------------------------------------------------------- catalog

def hub_requests(model, entry):
    """What the catalog asks of the Hub for one model: one request per group of files (the GGUFs; the HF files,
    which may live in another repository). Raises HubError on an entry that cannot be asked."""
    hub = entry.get("huggingface")
    if not isinstance(hub, dict):
        raise HubError("model %s has no huggingface block (repo, revision, subfolder...) in the catalog; add one or "
                       "use another model_sync_source" % model)
    requests = []
    for group, repo_key, revision_key in GROUPS:
        items = entry.get(group)
        if group == "hf_files" and not items:
            continue
        repo = hub.get(repo_key) or hub.get("repo")
        revision = str(hub.get(revision_key) or hub.get("revision") or "")
        if not isinstance(repo, str) or not REPO_RE.match(repo):
            raise HubError("model %s: huggingface.%s is %r; it must name a repository as owner/name"
                           % (model, repo_key, repo))
        if not revision or revision.startswith("-") or ".." in revision:
            raise HubError("model %s: huggingface.%s is %r; pin a full commit id (40 hex digits), or name a branch "
                           "or tag that the lock resolves once" % (model, revision_key, revision))
        request = {"group": group, "repo": repo, "revision": revision, "subfolder": "", "include": "",
                   "files": [dict(f) for f in items or []]}
        if group == "files":
            request["subfolder"] = str(hub.get("subfolder") or "").strip("/")
            request["include"] = str(hub.get("include") or "")
            if not request["files"] and not request["include"]:
                raise HubError("model %s lists no files and no huggingface.include pattern" % model)
        for item in request["files"]:
            item["path"] = "/".join(filter(None, [request["subfolder"], item["name"]]))
        requests.append(request)
    return requests


# ------------------------------------------------------------------------------------------------------- lock

def load_lock(path):
    """The lock file's content ({"version": 1, "models": {...}}); an empty lock when the file does not exist."""
    import yaml  # controller only: the lock is read where the inventory is

    if not os.path.exists(path):
        return {"version": LOCK_VERSION, "models": {}}
    with open(path) as handle:
        try:
            data = yaml.safe_load(handle) or {}
        except yaml.YAMLError as exc:
            raise HubError("the lock %s is not valid YAML: %s" % (path, exc))
    if not isinstance(data, dict) or data.get("version") != LOCK_VERSION or not isinstance(data.get("models"), dict):
        raise HubError("the lock %s is not a version %d model lock (a mapping with version and models)"
                       % (path, LOCK_VERSION))
    return data


def dump_lock(lock):
    import yaml

    class Dumper(yaml.SafeDumper):
        """Indents sequences under their key, as yamllint's default expects."""

        def increase_indent(self, flow=False, indentless=False):
            return super(Dumper, self).increase_indent(flow, False)

    body = yaml.dump({"version": LOCK_VERSION, "models": lock.get("models", {})}, Dumper=Dumper,
                     default_flow_style=False, sort_keys=True, width=1000)
    return LOCK_HEADER + "---\n" + body


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


# What each part of a lock entry must be: key -> (test, what it must be)
_SOURCE_SHAPE = {
    "group": (lambda v: v in ("files", "hf_files"), "files or hf_files"),
    "repo": (lambda v: isinstance(v, str) and REPO_RE.match(v), "a repository as owner/name"),
    "revision": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "commit": (lambda v: isinstance(v, str) and COMMIT_RE.match(v), "a commit id (40 lowercase hex digits)"),
}
_FILE_SHAPE = {
    "name": (lambda v: isinstance(v, str) and v != "", "a file name"),
    "repo": (lambda v: isinstance(v, str) and REPO_RE.match(v), "a repository as owner/name"),
    "commit": (lambda v: isinstance(v, str) and COMMIT_RE.match(v), "a commit id (40 lowercase hex digits)"),
    "path": (lambda v: isinstance(v, str) and v != "" and not v.startswith("/") and ".." not in v.split("/"),
             "a relative path in the repository"),
    "size": (lambda v: _is_int(v) and v >= 0, "a size in bytes (an integer, 0 or more)"),
    "sha256": (lambda v: isinstance(v, str) and SHA256_RE.match(v), "a sha256 (64 lowercase hex digits)"),
}


def lock_entry_problems(model, locked):
    """Sentences naming each malformed part of one model's lock entry (missing key, wrong type, bad sha256, negative
    size...): a lock edited by hand or damaged is refused by name before anything reads it, never with a traceback."""
    where = "%s: the lock entry is malformed:" % model
    if not isinstance(locked, dict):
        return ["%s it is %s, not a mapping with sources and files" % (where, type(locked).__name__)]
    problems = []
    sources = locked.get("sources")
    if not isinstance(sources, list) or not sources:
        problems.append("%s sources is %r, not a list of the repositories it pins" % (where, sources))
        sources = []
    for index, source in enumerate(sources):
        if not isinstance(source, dict):
            problems.append("%s sources[%d] is %r, not a mapping" % (where, index, source))
            continue
        for key, (test, must) in sorted(_SOURCE_SHAPE.items()):
            if key not in source:
                problems.append("%s sources[%d] has no %s" % (where, index, key))
            elif not test(source[key]):
                problems.append("%s sources[%d].%s is %r, it must be %s" % (where, index, key, source[key], must))
        for key in ("subfolder", "include"):
            if not isinstance(source.get(key, ""), str):
                problems.append("%s sources[%d].%s is %r, it must be a string" % (where, index, key, source[key]))
    for group in ("files", "hf_files"):
        items = locked.get(group, [] if group == "hf_files" else None)
        if not isinstance(items, list):
            problems.append("%s %s is %r, not a list of files" % (where, group, items))
            continue
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                problems.append("%s %s[%d] is %r, not a mapping" % (where, group, index, item))
                continue
            label = item.get("name") if isinstance(item.get("name"), str) and item.get("name") else "%s[%d]" % (
                group, index)
            for key, (test, must) in sorted(_FILE_SHAPE.items()):
                if key not in item:
                    problems.append("%s %s has no %s" % (where, label, key))
                elif not test(item[key]):
                    problems.append("%s %s has %s %r, it must be %s" % (where, label, key, item[key], must))
    return problems


def _file_problems(model, request, source, files):
    """Sentences naming each locked file whose repository, commit or path is not the one its source and the catalog
    say (the lock and the catalog compared file by file, field by field)."""
    problems = []
    subfolder = request["subfolder"]
    wanted = dict((f["name"], f) for f in request["files"])
    for pinned in files:
        name = pinned["name"]
        expected = {"repo": request["repo"], "commit": source["commit"]}
        if name in wanted:
            expected["path"] = wanted[name]["path"]
        elif request["include"]:
            expected["path"] = "/".join(filter(None, [subfolder, name]))
        if COMMIT_RE.match(request["revision"]):
            expected["commit"] = request["revision"]
        for key in ("repo", "commit", "path"):
            if key in expected and pinned[key] != expected[key]:
                problems.append("%s: %s has %s %s in the lock, the catalog says %s" % (model, name, key, pinned[key],
                                                                                       expected[key]))
    return problems


def lock_problems(model, entry, locked):
    """Sentences saying where a lock entry disagrees with the model's catalog entry ([] when it agrees): the
    repository, revision and commit of each source, then each file's name, repository, commit, path, size and
    sha256; a malformed entry is named part by part (lock_entry_problems) before anything is compared."""
    problems = lock_entry_problems(model, locked)
    if problems:
        return problems
    for request in hub_requests(model, entry):
        group = request["group"]
        source = next((s for s in locked.get("sources", []) if s.get("group") == group), None)
        files = locked.get(group) or []
        if source is None:
            problems.append("the lock has no %s source for %s" % (group, model))
            continue
        asked = request["revision"]
        if source.get("repo") != request["repo"]:
            problems.append("%s: the lock pins %s from repository %s, the catalog asks for %s"
                            % (model, group, source.get("repo"), request["repo"]))
        elif asked not in (source.get("revision"), source.get("commit")):
            problems.append("%s: the lock resolved %s revision %s to commit %s, the catalog now asks for revision %s"
                            % (model, request["repo"], source.get("revision"), source.get("commit"), asked))
        elif COMMIT_RE.match(asked) and source.get("commit") != asked:
            problems.append("%s: the lock pins %s at commit %s, the catalog pins commit %s"
                            % (model, group, source.get("commit"), asked))
        problems.extend(_file_problems(model, request, source, files))
        for key in ("subfolder", "include"):
            if source.get(key, "") != request[key]:
                problems.append("%s: the lock was made with huggingface.%s %r, the catalog says %r"
                                % (model, key, source.get(key, ""), request[key]))
        if request["files"]:
            wanted = [f["name"] for f in request["files"]]
            have = [f.get("name") for f in files]
            if wanted != have:
                problems.append("%s: the lock lists %s %s, the catalog lists %s" % (model, group, have, wanted))
                continue
            for item, pinned in zip(request["files"], files):
                for key in ("size", "sha256"):
                    if item.get(key) is not None and item[key] != pinned.get(key):
                        problems.append("%s: %s has %s %s in the lock and %s in the catalog"
                                        % (model, item["name"], key, pinned.get(key), item[key]))
    return problems


def node_files(locked, with_hf_files):
    """The locked files in the shape hmk_model_fetch takes (name, size, sha256, repo, commit, path)."""
    keep = ("name", "size", "sha256", "repo", "commit", "path")
    groups = ["files"] + (["hf_files"] if with_hf_files else [])
    return [dict((k, item[k]) for k in keep) for group in groups for item in locked.get(group) or []]


# --------------------------------------------------------------------------------- the Hub (controller side)

def _hub_message(exc, model, request, endpoint):
    """A sentence for an error huggingface_hub raised; never the token."""
    from huggingface_hub import errors

    repo, revision = request["repo"], request["revision"]
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    server = ""
    if response is not None:
        server = response.headers.get("X-Error-Message") or ""
    if isinstance(exc, errors.RevisionNotFoundError):
        return ("%s: revision %s does not exist in %s on %s (HTTP %s); pin an existing commit id or branch"
                % (model, revision, repo, endpoint, status))
    if isinstance(exc, errors.GatedRepoError):
        return ("%s: the Hub refused access to %s (HTTP %s, gated: %s); accept the repository's conditions with the "
                "account of model_sync_hub_token, or use another token" % (model, repo, status, server))
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ("%s: repository %s not found on %s (HTTP %s): it does not exist, or it is private or gated and "
                "model_sync_hub_token is empty or has no access" % (model, repo, endpoint, status))
    if status in (401, 403):
        return ("%s: the Hub refused model_sync_hub_token for %s (HTTP %s: %s); set a valid token (read access)"
                % (model, repo, status, server or "unauthorized"))
    if status is not None:
        return "%s: the Hub at %s answered HTTP %s for %s at %s: %s" % (model, endpoint, status, repo, revision,
                                                                      server or exc)
    return "%s: the Hub at %s could not be read for %s at %s: %s" % (model, endpoint, repo, revision, exc)


def git_blob_id(path):
    """git's object id of a file (sha1 over "blob <size>\\0" and the bytes): what the Hub calls a file's oid."""
    digest = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sha256_path(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _resolve_request(api, endpoint, token, model, request):
    """(source, files) for one request, as the lock records them."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.hf_api import RepoFile

    repo = request["repo"]
    commit = api.model_info(repo, revision=request["revision"]).sha
    if not isinstance(commit, str) or not COMMIT_RE.match(commit):
        raise HubError("%s: the Hub at %s gave %r as the commit of %s at %s, not a commit id"
                       % (model, endpoint, commit, repo, request["revision"]))
    if request["include"]:
        listing = api.list_repo_tree(repo, path_in_repo=request["subfolder"] or None, revision=commit)
        found = sorted((f for f in listing if isinstance(f, RepoFile)
                        and fnmatch.fnmatchcase(f.path.rsplit("/", 1)[-1], request["include"])), key=lambda f: f.path)
        if not found:
            raise HubError("%s: huggingface.include %r matches no file in %s/%s at revision %s (commit %s)"
                           % (model, request["include"], repo, request["subfolder"], request["revision"], commit))
        names = [f.path.rsplit("/", 1)[-1] for f in found]
        if request["files"] and names != [f["name"] for f in request["files"]]:
            raise HubError("%s: huggingface.include %r matches %s in %s at commit %s, the catalog lists %s"
                           % (model, request["include"], names, repo, commit, [f["name"] for f in request["files"]]))
        wanted = request["files"] or [{"name": n, "path": f.path} for n, f in zip(names, found)]
        by_path = dict((f.path, f) for f in found)
    else:
        wanted = request["files"]
        infos = api.get_paths_info(repo, [f["path"] for f in wanted], revision=commit)
        by_path = dict((f.path, f) for f in infos if isinstance(f, RepoFile))
        missing = [f["path"] for f in wanted if f["path"] not in by_path]
        if missing:
            raise HubError("%s: %s not in %s at revision %s (commit %s); check the file names and "
                           "huggingface.subfolder in the catalog" % (model, ", ".join(missing), repo,
                                                                     request["revision"], commit))
    files = []
    for item in wanted:
        info = by_path[item["path"]]
        pinned = {"name": item["name"], "repo": repo, "commit": commit, "path": item["path"], "git_oid": info.blob_id}
        if info.lfs is not None:
            pinned.update(size=int(info.lfs.size), sha256=str(info.lfs.sha256), lfs=True)
        else:
            # A file kept in git itself has no sha256 in the Hub's metadata, only its git object id: read it once,
            # check the bytes against that id, and record their sha256.
            with tempfile.TemporaryDirectory(prefix="hmk-hub-") as cache:
                local = hf_hub_download(repo, item["path"], revision=commit, endpoint=endpoint, token=token or False,
                                        cache_dir=cache)
                oid = git_blob_id(local)
                if oid != info.blob_id:
                    raise HubError("%s: %s from %s at %s has git object id %s, the Hub's metadata says %s"
                                   % (model, item["path"], repo, commit, oid, info.blob_id))
                pinned.update(size=os.path.getsize(local), sha256=_sha256_path(local), lfs=False)
        if not SHA256_RE.match(pinned["sha256"]) or pinned["size"] != int(info.size):
            raise HubError("%s: the Hub's metadata for %s in %s at %s is inconsistent (size %s, LFS size %s, sha256 %r)"
                           % (model, item["path"], repo, commit, info.size, pinned["size"], pinned["sha256"]))
        for key in ("size", "sha256"):
            if item.get(key) is not None and item[key] != pinned[key]:
                raise HubError("%s: the Hub says %s %s for %s in %s at commit %s, the catalog says %s; fix the "
                               "catalog entry or its revision" % (model, key, pinned[key], item["path"], repo, commit,
                                                                  item[key]))
        files.append(pinned)
    source = {"group": request["group"], "repo": repo, "revision": request["revision"], "commit": commit,
              "subfolder": request["subfolder"], "include": request["include"]}
    return source, files


def resolve_model(model, entry, endpoint, token):
    """The lock entry of one model, from the Hub's metadata at its pinned revision (huggingface_hub)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint, token=token or False)
    locked = {"sources": []}
    for request in hub_requests(model, entry):
        try:
            source, files = _resolve_request(api, endpoint, token, model, request)
        except HubError:
            raise
        except HfHubHTTPError as exc:
            raise HubError(_hub_message(exc, model, request, endpoint))
        except Exception as exc:  # noqa: BLE001 -- connection, TLS, proxy or parse errors: one sentence, no traceback
            raise HubError(_hub_message(exc, model, request, endpoint))
        locked["sources"].append(source)
        locked[request["group"]] = files
    gguf = [f for f in locked["files"] if f["name"].endswith(".gguf")]
    split_count = (entry.get("gguf") or {}).get("split_count")
    if split_count is not None and split_count != len(gguf):
        raise HubError("%s: gguf.split_count is %s but the Hub has %d .gguf files for it: %s"
                       % (model, split_count, len(gguf), ", ".join(f["path"] for f in gguf)))
    return locked


# -------------------------------------------------------------------------------------------------- the node

def resolve_path(repo, commit, path):
    """The path of a file's resolve/ URL below the endpoint (the Hub redirects it to its storage)."""
    return "%s/resolve/%s/%s" % (repo, commit, quote(path))


class HubSource(Source):
    """The http source against the Hub's resolve/ URLs (redirects to the storage followed), checked once before the
    first byte: the token is accepted and every file still is what the lock says."""

    def __init__(self, endpoint, files, token=None, retries=3, retry_delay=5.0, stall_seconds=120):
        super(HubSource, self).__init__("http", endpoint, token=token, follow_redirects=True, retries=retries,
                                        retry_delay=retry_delay, stall_seconds=stall_seconds)
        self.files = files
        self._checked = None
        self._check_lock = threading.Lock()

    def fetch(self, relpath, partial, size, digest):
        with self._check_lock:
            if self._checked is None:
                self._checked = self.preflight()
        if self._checked:
            raise SyncError(self._checked)
        return super(HubSource, self).fetch(relpath, partial, size, digest)

    def head(self, relpath):
        """(status, {lower-cased header: value}) of a HEAD without following redirects (with the module's own HTTP
        client: the token reaches no command line)."""
        return http_head(self.describe(relpath), self.token, stall_seconds=self.stall_seconds)

    def preflight(self):
        """None when every file answers as locked, else the sentence to fail the model with."""
        for item in self.files:
            status, headers = self.head(item["source"])
            where = "%s at %s" % (item["path"], item["repo"])
            if status in (401, 403):
                return ("the Hub answered HTTP %d for %s: model_sync_hub_token is missing, wrong or has no access "
                        "(%s); nothing was fetched" % (status, where, headers.get("x-error-message", "")))
            if status == 404:
                return ("the Hub answered HTTP 404 (%s) for %s commit %s; nothing was fetched"
                        % (headers.get("x-error-code", "not found"), where, item["commit"]))
            if status not in (200, 302, 307):
                return "the Hub answered HTTP %s for %s; nothing was fetched" % (status, where)
            commit = headers.get("x-repo-commit")
            size = headers.get("x-linked-size") or (headers.get("content-length") if status == 200 else None)
            etag = (headers.get("x-linked-etag") or "").strip('"')
            if commit != item["commit"]:
                return ("the Hub serves %s from commit %s, the lock says %s; nothing was fetched"
                        % (where, commit, item["commit"]))
            if size is not None and (not size.isdigit() or int(size) != item["size"]):
                return ("the Hub says %s is %s bytes at commit %s, the lock says %d; nothing was fetched"
                        % (where, size, commit, item["size"]))
            if SHA256_RE.match(etag) and etag != item["sha256"]:
                return ("the Hub says %s has sha256 %s at commit %s, the lock says %s; nothing was fetched"
                        % (where, etag, commit, item["sha256"]))
        return ""


def hub_source(endpoint, files, token=None, **kw):
    """(HubSource, files with their resolve/ path as `source`) for hmk_model_fetch."""
    shaped = [dict(f, source=resolve_path(f["repo"], f["commit"], f["path"])) for f in files]
    return HubSource(endpoint.rstrip("/"), shaped, token=token, **kw), shaped
