"""model_sync's huggingface source: the Hub stand-in checked against the real huggingface_hub client, the lock logic,
the node-side transfer through the Hub's redirect, and the peer server. Everything runs for real on 127.0.0.1 (the
stand-in in place of the Hub, which these machines cannot reach)."""
import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub import errors as hf_errors

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_hub
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_sync as hmk
from conftest_model_sync import ROOT, catalog, free_port

FILES = os.path.join(ROOT, "molecule", "model_sync_hub", "files")
sys.path.insert(0, FILES)
import stage_hub  # noqa: E402  (the scenario's own staging code, imported from its directory)

TOKEN = "hub-unit-token-0123456789"
FORBIDDEN = "hub-unit-token-without-access"
PEER = os.path.join(ROOT, "roles", "model_sync", "files", "hmk-model-peer")
QWEN, DS = "tiny-qwen3moe", "tiny-deepseek2"


def wait_port(port, proc=None):
    deadline = time.time() + 15
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("the server exited with %s before port %d opened" % (proc.returncode, port))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("port %d never opened" % port)


class StandIn:
    def __init__(self, repos, workdir):
        self.port, self.storage_port = free_port(), free_port()
        self.stats_path = os.path.join(workdir, "stats.json")
        self.control_path = os.path.join(workdir, "control.json")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(FILES, "hub_standin.py"), "--repos", repos, "--port", str(self.port),
             "--storage-port", str(self.storage_port), "--token", TOKEN, "--forbidden-token", FORBIDDEN,
             "--stats", self.stats_path, "--control", self.control_path, "--lifetime", "600"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        wait_port(self.storage_port)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def stats(self):
        with open(self.stats_path) as handle:
            return json.load(handle)

    def storage_bytes(self):
        return sum(e["bytes"] for e in self.stats()["storage"].values())

    def corrupt(self, sha256s):
        with open(self.control_path, "w") as handle:
            json.dump({"corrupt": list(sha256s)}, handle)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("hub")
    commits = stage_hub.stage(ROOT, str(workdir / "repos"))
    server = StandIn(str(workdir / "repos"), str(workdir))
    server.commits, server.repos = commits, str(workdir / "repos")
    yield server
    server.proc.terminate()
    server.proc.wait(timeout=10)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def entry(name):
    return catalog()[name]


# ------------------------------------------------------------------------- the stand-in against huggingface_hub

def test_the_catalog_pins_the_commit_the_stand_in_serves(hub):
    pinned = entry(QWEN)["huggingface"]
    assert hub.commits[pinned["repo"]] == pinned["revision"]
    assert hmk_hub.COMMIT_RE.match(pinned["revision"])
    assert entry(DS)["huggingface"]["revision"] == "main"


def test_huggingface_hub_reads_revision_paths_info_and_tree_from_the_stand_in(hub):
    api = HfApi(endpoint=hub.url, token=TOKEN)
    repo = entry(QWEN)["huggingface"]["repo"]
    commit = hub.commits[repo]
    info = api.model_info(repo, revision="main")
    assert info.sha == commit and info.id == repo and "config.json" in [s.rfilename for s in info.siblings]
    first = entry(QWEN)["files"][0]
    paths = api.get_paths_info(repo, ["Q8_0/" + first["name"], "config.json", "Q8_0", "absent.json"], revision=commit)
    by_path = dict((p.path, p) for p in paths)
    assert sorted(by_path) == ["Q8_0", "Q8_0/" + first["name"], "config.json"]
    gguf = by_path["Q8_0/" + first["name"]]
    assert (gguf.size, gguf.lfs.size, gguf.lfs.sha256) == (first["size"], first["size"], first["sha256"])
    local = os.path.join(hub.repos, repo, commit, "config.json")
    assert by_path["config.json"].lfs is None and by_path["config.json"].blob_id == hmk_hub.git_blob_id(local)
    # the blob id is git's: compare with git itself where it is installed
    if subprocess.run(["which", "git"], stdout=subprocess.DEVNULL, check=False).returncode == 0:
        assert subprocess.check_output(["git", "hash-object", local]).decode().strip() == hmk_hub.git_blob_id(local)
    tree = [f.path for f in api.list_repo_tree(entry(DS)["huggingface"]["repo"], path_in_repo="Q8_0", revision="main")]
    assert tree == ["Q8_0/" + f["name"] for f in entry(DS)["files"]]


def test_resolve_headers_are_what_get_hf_file_metadata_reads(hub):
    repo = entry(QWEN)["huggingface"]["repo"]
    first = entry(QWEN)["files"][0]
    lfs = get_hf_file_metadata(hf_hub_url(repo, "Q8_0/" + first["name"], revision="main", endpoint=hub.url),
                               token=TOKEN, endpoint=hub.url)
    assert (lfs.commit_hash, lfs.etag, lfs.size) == (hub.commits[repo], first["sha256"], first["size"])
    assert lfs.location.startswith("http://127.0.0.1:%d/" % hub.storage_port) and "X-Amz-Signature=" in lfs.location
    config = next(f for f in entry(QWEN)["hf_files"] if f["name"] == "config.json")
    git = get_hf_file_metadata(hf_hub_url(repo, "config.json", revision="main", endpoint=hub.url), token=TOKEN,
                               endpoint=hub.url)
    assert git.size == config["size"] and git.etag == hmk_hub.git_blob_id(
        os.path.join(hub.repos, repo, hub.commits[repo], "config.json"))


def test_hf_hub_download_follows_the_redirect_to_the_storage(hub, tmp_path):
    repo = entry(QWEN)["huggingface"]["repo"]
    last = entry(QWEN)["files"][-1]
    path = hf_hub_download(repo, "Q8_0/" + last["name"], revision=hub.commits[repo], endpoint=hub.url, token=TOKEN,
                           cache_dir=str(tmp_path))
    assert sha256(path) == last["sha256"]


@pytest.mark.parametrize("token, revision, error", [
    (TOKEN, "0" * 40, hf_errors.RevisionNotFoundError),
    (False, "main", hf_errors.RepositoryNotFoundError),
    (FORBIDDEN, "main", hf_errors.GatedRepoError),
    ("wrong-token", "main", hf_errors.HfHubHTTPError),
])
def test_the_stand_in_refuses_as_the_hub_does(hub, token, revision, error):
    with pytest.raises(error) as raised:
        HfApi(endpoint=hub.url, token=token).model_info(entry(QWEN)["huggingface"]["repo"], revision=revision)
    assert raised.value.response.status_code in (401, 403, 404)
    with pytest.raises(hf_errors.RemoteEntryNotFoundError):
        get_hf_file_metadata(hf_hub_url(entry(QWEN)["huggingface"]["repo"], "absent.gguf", endpoint=hub.url),
                             token=TOKEN, endpoint=hub.url)


def test_the_storage_refuses_an_authorization_header_and_a_bad_signature(hub):
    repo = entry(QWEN)["huggingface"]["repo"]
    meta = get_hf_file_metadata(hf_hub_url(repo, "Q8_0/" + entry(QWEN)["files"][0]["name"], endpoint=hub.url),
                                token=TOKEN, endpoint=hub.url)
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(urllib.request.Request(meta.location, headers={"Authorization": "Bearer " + TOKEN}))
    assert raised.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(meta.location.replace("X-Amz-Signature=", "X-Amz-Signature=0"))
    assert raised.value.code == 403
    ranged = urllib.request.urlopen(urllib.request.Request(meta.location, headers={"Range": "bytes=4-"}))
    assert ranged.status == 206 and len(ranged.read()) == meta.size - 4


# ------------------------------------------------------------------------------------------ resolving, the lock

def test_resolve_model_pins_the_hubs_sizes_and_sha256(hub):
    for name in (QWEN, DS):
        locked = hmk_hub.resolve_model(name, entry(name), hub.url, TOKEN)
        repo = entry(name)["huggingface"]["repo"]
        assert [s["commit"] for s in locked["sources"]] == [hub.commits[repo]] * len(locked["sources"])
        for group in ("files", "hf_files"):
            assert [(f["name"], f["size"], f["sha256"]) for f in locked[group]] == \
                [(f["name"], f["size"], f["sha256"]) for f in entry(name)[group]]
        assert all(f["lfs"] for f in locked["files"]) and not any(f["lfs"] for f in locked["hf_files"])
        assert locked["files"][0]["path"] == "Q8_0/" + entry(name)["files"][0]["name"]
    # the branch was resolved once: the source records what was asked and what it pointed at
    assert locked["sources"][0]["revision"] == "main" and hmk_hub.COMMIT_RE.match(locked["sources"][0]["commit"])


def test_an_include_pattern_alone_fills_the_file_list(hub):
    bare = dict(entry(DS))
    bare.pop("files")
    locked = hmk_hub.resolve_model(DS, bare, hub.url, TOKEN)
    assert [f["name"] for f in locked["files"]] == [f["name"] for f in entry(DS)["files"]]


def changed(name, **hub_changes):
    copy = json.loads(json.dumps(entry(name)))
    copy["huggingface"].update(hub_changes)
    return copy


@pytest.mark.parametrize("case, expected", [
    ("revision", "revision %s does not exist in hmk-lab/tiny-qwen3moe-GGUF" % ("0" * 40)),
    ("missing file", "Q8_0/tiny-qwen3moe-00004-of-00003.gguf not in hmk-lab/tiny-qwen3moe-GGUF"),
    ("wrong token", "the Hub refused model_sync_hub_token for hmk-lab/tiny-qwen3moe-GGUF (HTTP 401"),
    ("no token", "repository hmk-lab/tiny-qwen3moe-GGUF not found"),
    ("forbidden token", "refused access to hmk-lab/tiny-qwen3moe-GGUF (HTTP 403"),
    ("catalog sha256", "the catalog says " + "f" * 64),
    ("split count", "gguf.split_count is 4 but the Hub has 3 .gguf files"),
    ("include", "huggingface.include 'nothing-*.gguf' matches no file"),
])
def test_bad_input_fails_naming_the_value_and_never_the_token(hub, case, expected):
    token, model = TOKEN, entry(QWEN)
    if case == "revision":
        model = changed(QWEN, revision="0" * 40)
    elif case == "missing file":
        model = json.loads(json.dumps(model))
        model["files"][2]["name"] = "tiny-qwen3moe-00004-of-00003.gguf"
    elif case == "wrong token":
        token = "wrong-token-0123456789"
    elif case == "no token":
        token = ""
    elif case == "forbidden token":
        token = FORBIDDEN
    elif case == "catalog sha256":
        model = json.loads(json.dumps(model))
        model["files"][1]["sha256"] = "f" * 64
    elif case == "split count":
        model = json.loads(json.dumps(model))
        model["gguf"]["split_count"] = 4
    elif case == "include":
        model = changed(QWEN, include="nothing-*.gguf")
        model.pop("files")
    with pytest.raises(hmk_hub.HubError) as raised:
        hmk_hub.resolve_model(QWEN, model, hub.url, token)
    assert expected in str(raised.value)
    assert TOKEN not in str(raised.value) and "wrong-token" not in str(raised.value)


def test_the_lock_round_trips_and_reports_every_disagreement_with_the_catalog(hub, tmp_path):
    locked = hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN)
    path = tmp_path / "models.lock.yml"
    path.write_text(hmk_hub.dump_lock({"models": {QWEN: locked}}))
    loaded = hmk_hub.load_lock(str(path))
    assert loaded["models"][QWEN] == locked and loaded["version"] == hmk_hub.LOCK_VERSION
    assert path.read_text().startswith("# Written by hmk.moe_kit model_sync")
    assert hmk_hub.lock_problems(QWEN, entry(QWEN), locked) == []
    other = "1" * 40
    assert "the catalog now asks for revision %s" % other in " ".join(
        hmk_hub.lock_problems(QWEN, changed(QWEN, revision=other), locked))
    assert "the catalog asks for hmk-lab/other" in " ".join(
        hmk_hub.lock_problems(QWEN, changed(QWEN, repo="hmk-lab/other", hf_files_repo="hmk-lab/other"), locked))
    assert "huggingface.subfolder 'Q8_0', the catalog says 'Q4'" in " ".join(
        hmk_hub.lock_problems(QWEN, changed(QWEN, subfolder="Q4"), locked))
    renamed = json.loads(json.dumps(entry(QWEN)))
    renamed["files"] = renamed["files"][:2]
    assert "the catalog lists" in " ".join(hmk_hub.lock_problems(QWEN, renamed, locked))
    tampered = json.loads(json.dumps(locked))
    tampered["files"][0]["sha256"] = "e" * 64
    assert "has sha256 %s in the lock and %s in the catalog" % ("e" * 64, entry(QWEN)["files"][0]["sha256"]) in \
        " ".join(hmk_hub.lock_problems(QWEN, entry(QWEN), tampered))
    # a branch pinned in the lock also accepts its resolved commit written into the catalog
    branch = hmk_hub.resolve_model(DS, entry(DS), hub.url, TOKEN)
    assert hmk_hub.lock_problems(DS, changed(DS, revision=branch["sources"][0]["commit"]), branch) == []


def test_the_lock_and_the_catalog_are_compared_file_by_file_and_field_by_field(hub):
    locked = hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN)
    first, second, third = (f["name"] for f in locked["files"])
    tampered = json.loads(json.dumps(locked))
    tampered["files"][0]["repo"] = "hmk-lab/elsewhere"
    tampered["files"][1]["commit"] = "2" * 40
    tampered["files"][2]["path"] = "Q4/" + third
    tampered["sources"][0]["commit"] = "3" * 40  # the catalog pins a commit: the lock must pin that one
    problems = hmk_hub.lock_problems(QWEN, entry(QWEN), tampered)
    pinned = entry(QWEN)["huggingface"]["revision"]
    assert "%s: %s has repo hmk-lab/elsewhere in the lock, the catalog says %s" % (
        QWEN, first, entry(QWEN)["huggingface"]["repo"]) in problems
    assert "%s: %s has commit %s in the lock, the catalog says %s" % (QWEN, second, "2" * 40, pinned) in problems
    assert "%s: %s has path Q4/%s in the lock, the catalog says Q8_0/%s" % (QWEN, third, third, third) in problems
    assert "%s: the lock pins files at commit %s, the catalog pins commit %s" % (QWEN, "3" * 40, pinned) in problems
    # a branch: each file's commit must be the commit the lock resolved the branch to
    branch = hmk_hub.resolve_model(DS, entry(DS), hub.url, TOKEN)
    moved = json.loads(json.dumps(branch))
    moved["files"][0]["commit"] = "4" * 40
    assert hmk_hub.lock_problems(DS, entry(DS), moved) == [
        "%s: %s has commit %s in the lock, the catalog says %s" % (DS, moved["files"][0]["name"], "4" * 40,
                                                                   branch["sources"][0]["commit"])]


def _break(path, value):
    def apply(locked):
        target = locked
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return locked
    return apply


@pytest.mark.parametrize("damage, expected", [
    (_break(["files", 0, "sha256"], KeyError), "has no sha256"),
    (_break(["files", 0, "size"], "1024"), "has size '1024', it must be a size in bytes"),
    (_break(["files", 0, "size"], -5), "has size -5, it must be a size in bytes"),
    (_break(["files", 0, "size"], True), "has size True, it must be a size in bytes"),
    (_break(["files", 0, "sha256"], "not-a-hash"), "has sha256 'not-a-hash', it must be a sha256"),
    (_break(["files", 1, "commit"], 12345), "has commit 12345, it must be a commit id"),
    (_break(["files", 1, "path"], "../../etc/passwd"), "has path '../../etc/passwd', it must be a relative path"),
    (_break(["files", 1], "a string"), "files[1] is 'a string', not a mapping"),
    (_break(["files"], {"a": 1}), "files is {'a': 1}, not a list of files"),
    (_break(["sources"], None), "sources is None, not a list"),
    (_break(["sources", 0, "commit"], KeyError), "sources[0] has no commit"),
    (_break(["sources", 0], ["x"]), "sources[0] is ['x'], not a mapping"),
    (lambda locked: "just a string", "it is str, not a mapping"),
])
def test_a_malformed_lock_entry_is_refused_by_name_not_with_a_traceback(hub, damage, expected):
    locked = damage(hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN))
    problems = hmk_hub.lock_problems(QWEN, entry(QWEN), locked)
    assert any(p.startswith("%s: the lock entry is malformed:" % QWEN) and expected in p for p in problems), problems


@pytest.mark.parametrize("text", ["", "version: 2\nmodels: {}\n", "- a\n- b\n", "models: [\n"])
def test_a_lock_that_is_not_a_lock_is_refused(tmp_path, text):
    path = tmp_path / "models.lock.yml"
    path.write_text(text)
    with pytest.raises(hmk_hub.HubError):
        hmk_hub.load_lock(str(path))
    assert hmk_hub.load_lock(str(tmp_path / "absent.yml")) == {"version": 1, "models": {}}


def test_the_written_lock_passes_yamllint(hub, tmp_path):
    path = tmp_path / "models.lock.yml"
    path.write_text(hmk_hub.dump_lock({"models": {QWEN: hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN)}}))
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "yamllint"), "--strict", "-c",
                           os.path.join(ROOT, ".yamllint"), str(path)], stdout=subprocess.PIPE, check=False)
    assert done.returncode == 0, done.stdout.decode()
    assert yaml.safe_load(path.read_text())["models"][QWEN]["files"][0]["size"] == entry(QWEN)["files"][0]["size"]


# --------------------------------------------------------------------------------------- the node's transfer

def node_sync(hub, dest, files, token=TOKEN, model=QWEN):
    source, shaped = hmk_hub.hub_source(hub.url, files, token=token, retries=0, retry_delay=0.01)
    return hmk.Syncer(model, str(dest / model), str(dest / ".hmk-sync"), str(dest / ".quarantine"), shaped, source,
                      gguf_expect=entry(model)["gguf"], log=hmk.ProgressLog(str(dest / "sync.log"), model, 0))


def test_the_node_fetches_through_the_redirect_verifies_and_publishes_once(hub, tmp_path):
    files = hmk_hub.node_files(hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN), True)
    before = hub.storage_bytes()
    result = node_sync(hub, tmp_path, files).run()
    assert result["errors"] == [] and sorted(result["fetched"]) == sorted(f["name"] for f in files)
    for item in files:
        assert sha256(str(tmp_path / QWEN / item["name"])) == item["sha256"]
    gguf_bytes = sum(f["size"] for f in files if f["name"].endswith(".gguf"))
    assert hub.storage_bytes() - before == gguf_bytes
    assert node_sync(hub, tmp_path, files).run()["bytes_received"] == 0
    log = (tmp_path / "sync.log").read_text()
    assert TOKEN not in log


def test_a_bad_token_on_the_node_stops_before_any_byte(hub, tmp_path):
    files = hmk_hub.node_files(hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN), True)
    before = hub.storage_bytes()
    result = node_sync(hub, tmp_path, files, token="wrong-token-0123456789").run()
    assert len(result["errors"]) == len(files) and result["fetched"] == []
    assert "HTTP 401" in result["errors"][0] and "model_sync_hub_token" in result["errors"][0]
    assert hub.storage_bytes() == before
    assert not list((tmp_path / QWEN).iterdir())


def test_a_lock_the_hub_no_longer_matches_stops_before_any_byte(hub, tmp_path):
    files = hmk_hub.node_files(hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN), True)
    files[0] = dict(files[0], sha256="d" * 64)
    result = node_sync(hub, tmp_path, files).run()
    assert result["fetched"] == [] and "the lock says %s" % ("d" * 64) in result["errors"][0]


def test_bytes_that_do_not_match_the_hubs_sha256_are_quarantined_not_published(hub, tmp_path):
    files = hmk_hub.node_files(hmk_hub.resolve_model(QWEN, entry(QWEN), hub.url, TOKEN), False)
    bad = files[1]
    hub.corrupt([bad["sha256"]])
    try:
        result = node_sync(hub, tmp_path, files).run()
    finally:
        hub.corrupt([])
    assert any("%s failed verification: expected sha256 %s" % (bad["name"], bad["sha256"]) in e for e in result["errors"])
    assert not (tmp_path / QWEN / bad["name"]).exists()
    assert len(result["quarantined"]) == 1


# ------------------------------------------------------------------------------------------------ the peer

@pytest.fixture()
def peer(tmp_path):
    proc, url, root = start_peer(tmp_path)
    yield url, root
    proc.terminate()
    proc.wait(timeout=10)


def start_peer(tmp_path, *extra):
    """The peer server on 127.0.0.1 over a small models root: (process, URL, root)."""
    root = tmp_path / "models"
    (root / QWEN).mkdir(parents=True)
    (root / ".hmk-sync").mkdir()
    (root / QWEN / "a.bin").write_bytes(os.urandom(300000))
    (root / QWEN / "b.bin.partial").write_bytes(b"partial")
    (root / ".hmk-sync" / "stamp.json").write_text("{}")
    (tmp_path / "secret").write_text("outside")
    os.symlink(str(tmp_path / "secret"), str(root / QWEN / "link.bin"))
    token_file = tmp_path / "token"
    token_file.write_text("peer-token-0123456789\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, PEER, "--root", str(root), "--bind", "127.0.0.1", "--port", str(port),
                             "--token-file", str(token_file)] + list(extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        raise
    return proc, "http://127.0.0.1:%d" % port, root


@pytest.fixture()
def bounded_peer(tmp_path, request):
    proc, url, root = start_peer(tmp_path, *request.param)
    yield url, root
    proc.terminate()
    proc.wait(timeout=10)


def get(url, token="peer-token-0123456789", headers=None):
    request = urllib.request.Request(url, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        response = urllib.request.urlopen(request)
        return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_the_peer_serves_published_files_with_ranges_and_a_token_only(peer):
    url, root = peer
    data = (root / QWEN / "a.bin").read_bytes()
    assert get(url + "/%s/a.bin" % QWEN) == (200, data)
    assert get(url + "/%s/a.bin" % QWEN, headers={"Range": "bytes=1000-"}) == (206, data[1000:])
    assert get(url + "/%s/a.bin" % QWEN, token="")[0] == 401
    assert get(url + "/%s/a.bin" % QWEN, token="peer-token-wrong")[0] == 401
    for refused in ("/%s/b.bin.partial" % QWEN, "/.hmk-sync/stamp.json", "/%s/link.bin" % QWEN,
                    "/%s/../secret" % QWEN, "/%s/%%2e%%2e/secret" % QWEN, "/a.bin", "/%s/a.bin/x" % QWEN):
        assert get(url + refused)[0] == 404, refused


def test_a_node_fills_from_the_peer_with_the_same_verification(peer, tmp_path):
    url, root = peer
    data = (root / QWEN / "a.bin").read_bytes()
    item = {"name": "a.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    source = hmk.Source("http", "%s/%s" % (url, QWEN), token="peer-token-0123456789", retries=0)
    dest = tmp_path / "filler"
    result = hmk.Syncer(QWEN, str(dest / QWEN), str(dest / ".s"), str(dest / ".q"), [item], source).run()
    assert result["errors"] == [] and (dest / QWEN / "a.bin").read_bytes() == data
    wrong = dict(item, name="a.bin", sha256="c" * 64)
    result = hmk.Syncer(QWEN, str(dest / "again"), str(dest / ".s2"), str(dest / ".q2"), [wrong], source).run()
    assert "failed verification" in result["errors"][0]


def raw_get(url, path, headers=None, source="127.0.0.1", timeout=10):
    """(status, headers, body) of one GET from the `source` address; (None, None, None) when the server closed the
    connection without answering."""
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=dict({"Authorization": "Bearer peer-token-0123456789"}, **(headers or {})))
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        return None, None, None
    finally:
        conn.close()


def test_the_peer_answers_416_to_every_malformed_or_unsatisfiable_range(peer):
    url, root = peer
    size = (root / QWEN / "a.bin").stat().st_size
    path = "/%s/a.bin" % QWEN
    for wanted in ("bytes=1000-999", "bytes=10-5", "bytes=%d-" % size, "bytes=%d-%d" % (size + 5, size + 9),
                   "bytes=abc", "bytes=0-1,5-6", "bytes=-100", "items=0-10", "bytes=" + "9" * 30 + "-", ""):
        status, headers, body = raw_get(url, path, {"Range": wanted})
        assert (status, headers["Content-Range"], body) == (416, "bytes */%d" % size, b""), wanted
    data = (root / QWEN / "a.bin").read_bytes()
    assert raw_get(url, path, {"Range": "bytes=5-9"})[::2] == (206, data[5:10])
    assert raw_get(url, path, {"Range": "bytes=%d-%d" % (size - 2, size + 100)})[::2] == (206, data[-2:])


def _closed_within(sock, seconds):
    """Whether the server closed `sock` within `seconds` (what it sent before is read and dropped)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


@pytest.mark.parametrize("bounded_peer", [("--timeout", "1")], indirect=True)
def test_the_peer_drops_an_idle_and_a_slow_client_after_its_timeout(bounded_peer):
    url, _unused = bounded_peer
    port = int(url.rsplit(":", 1)[1])
    idle = socket.create_connection(("127.0.0.1", port))
    started = time.monotonic()
    assert _closed_within(idle, 5) and time.monotonic() - started < 4
    idle.close()
    slow = socket.create_connection(("127.0.0.1", port))  # a byte every 0.3 s: each read is in time, the whole is not
    started, cut = time.monotonic(), False
    for byte in b"GET /%s/a.bin HTTP/1.1\r\nHost: x\r\n" % QWEN.encode():
        try:
            slow.sendall(bytes([byte]))
        except OSError:
            cut = True
            break
        time.sleep(0.3)
        if time.monotonic() - started > 6:
            break
    assert cut or _closed_within(slow, 1), "a client sending its headers byte by byte was never dropped"
    assert time.monotonic() - started < 6
    slow.close()
    assert raw_get(url, "/%s/a.bin" % QWEN)[0] == 200


@pytest.mark.parametrize("bounded_peer", [("--max-connections", "2", "--timeout", "30")], indirect=True)
def test_the_peer_serves_its_connection_limit_and_answers_503_beyond_it(bounded_peer):
    url, _unused = bounded_peer
    port = int(url.rsplit(":", 1)[1])
    held = []
    deadline = time.monotonic() + 20
    while len(held) < 2 and time.monotonic() < deadline:  # a slot may still be taken by wait_port's probe for a moment
        sock = socket.create_connection(("127.0.0.1", port))
        if _closed_within(sock, 2.0):  # a 503 for a slot already taken can take a moment on a loaded machine
            sock.close()
        else:
            held.append(sock)
    assert len(held) == 2
    refused = [raw_get(url, "/%s/a.bin" % QWEN) for _unused in range(5)]
    assert [r[0] for r in refused] == [503] * 5 and refused[0][1]["Retry-After"] == "5"
    for sock in held:
        sock.close()
    # The slots are given back: five requests in a row are served. The server notices each closed connection on its
    # next read, one thread per connection, so on a loaded machine the second slot can come back after the first
    # request is served already: a 503 in between restarts the count, and only the deadline fails the test.
    deadline, streak, seen = time.monotonic() + 20, 0, []
    while streak < 5 and time.monotonic() < deadline:
        seen.append(raw_get(url, "/%s/a.bin" % QWEN)[0])
        streak = streak + 1 if seen[-1] == 200 else 0
        if seen[-1] != 200:
            time.sleep(0.2)
    assert streak == 5, "the slots were not given back: %s" % seen


@pytest.mark.parametrize("bounded_peer", [("--allow", "127.0.0.2", "--allow", "10.20.0.0/16")], indirect=True)
def test_only_clients_on_the_peers_allow_list_get_an_answer(bounded_peer):
    url, _unused = bounded_peer
    assert raw_get(url, "/%s/a.bin" % QWEN, source="127.0.0.2")[0] == 200
    assert raw_get(url, "/%s/a.bin" % QWEN, source="127.0.0.3") == (None, None, None)
    assert raw_get(url, "/%s/a.bin" % QWEN, source="127.0.0.1") == (None, None, None)


@pytest.mark.parametrize("bounded_peer", [("--allow", "localhost")], indirect=True)
def test_an_allow_list_entry_may_be_a_host_name_resolved_at_start(bounded_peer):
    url, _unused = bounded_peer
    assert raw_get(url, "/%s/a.bin" % QWEN, source="127.0.0.1")[0] == 200
    assert raw_get(url, "/%s/a.bin" % QWEN, source="127.0.0.2") == (None, None, None)


def test_every_catalog_entry_can_be_asked_of_the_hub():
    seeds = {"deepseek-r1-671b-iq4_xs": ("bartowski/DeepSeek-R1-GGUF", 10),
             "deepseek-r1-671b-q4_k_m": ("unsloth/DeepSeek-R1-GGUF", 9),
             "qwen3-235b-a22b-q4_k_m": ("Qwen/Qwen3-235B-A22B-GGUF", 5)}
    for name, model in catalog().items():
        requests = hmk_hub.hub_requests(name, model)
        # a model KTransformers does not serve may come without HF config files (the bed's gemma3): no second request
        assert [r["group"] for r in requests] == ["files", "hf_files"][:2 if model.get("hf_files") else 1]
        for item in requests[0]["files"]:
            # a repository with its GGUFs at the top level (ggml-org's gpt-oss) has no subfolder
            assert item["path"] == "/".join(filter(None, [model["huggingface"].get("subfolder"), item["name"]]))
        if name in seeds:
            repo, splits = seeds[name]
            assert requests[0]["repo"] == repo and len(requests[0]["files"]) == splits
            assert requests[0]["files"][0]["path"].endswith("-00001-of-%05d.gguf" % splits)
            assert requests[1]["repo"] in ("deepseek-ai/DeepSeek-R1", "Qwen/Qwen3-235B-A22B")
    qwen = catalog()["qwen3-235b-a22b-q4_k_m"]
    assert hmk_hub.COMMIT_RE.match(qwen["huggingface"]["revision"])
    # ~143 GB, as the brief says, from the pinned revision's published sizes
    assert 142e9 < sum(f["size"] for f in qwen["files"]) < 143e9


def test_an_entry_the_hub_cannot_be_asked_for_is_refused_by_name():
    for broken, expected in ((dict(entry(QWEN), huggingface=None), "has no huggingface block"),
                             (changed(QWEN, repo="no-slash"), "huggingface.repo is 'no-slash'"),
                             (changed(QWEN, revision=""), "huggingface.revision is ''")):
        with pytest.raises(hmk_hub.HubError) as raised:
            hmk_hub.hub_requests(QWEN, broken)
        assert expected in str(raised.value)


def test_a_hub_that_cannot_be_reached_fails_in_one_sentence():
    with pytest.raises(hmk_hub.HubError) as raised:
        hmk_hub.resolve_model(QWEN, entry(QWEN), "http://127.0.0.1:%d" % free_port(), TOKEN)
    assert str(raised.value).startswith("%s: the Hub at http://127.0.0.1:" % QWEN) and "could not be read" in str(
        raised.value)
