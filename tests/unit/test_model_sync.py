"""model_sync's Python core: the GGUF reader (against gguf-py's GGUFReader), the catalog rules, the free-space
arithmetic, and the resumable, verified fetch run for real (curl against a ranged HTTP server on 127.0.0.1,
a local source, rsync when installed)."""
import hashlib
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import os
import shutil
import struct
import subprocess
import sys
import threading

import pytest
from gguf import GGUFReader

from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_gguf
from ansible_collections.hmk.moe_kit.plugins.module_utils import hmk_model_integrity as integrity
from conftest_model_sync import RangedServer, catalog, generate, load_module_utils

hmk = load_module_utils()
MODEL = "tiny-qwen3moe"


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A model store with the catalog's tiny models, generated as the catalog says."""
    root = tmp_path_factory.mktemp("store")
    for name, entry in catalog().items():
        if "generator" in entry:
            out = root / entry["source_dir"]
            out.mkdir()
            generate(str(out), entry["generator"], name)
    return root


def entry_files(name=MODEL):
    entry = catalog()[name]
    return [dict(f) for f in entry["files"] + entry.get("hf_files", [])]


def syncer(dest_root, source, files=None, model=MODEL, **kw):
    entry = catalog()[model]
    log = hmk.ProgressLog(str(dest_root / "sync.log"), model, 0)
    return hmk.Syncer(model, str(dest_root / model), str(dest_root / ".hmk-sync"), str(dest_root / ".quarantine"),
                      files or entry_files(model), source, gguf_expect=entry["gguf"], log=log, **kw)


def http(server, model=MODEL, **kw):
    kw.setdefault("retries", 0)
    kw.setdefault("retry_delay", 0.01)
    return hmk.Source("http", server.url + "/" + catalog()[model]["source_dir"], **kw)


# ------------------------------------------------------------------------------------------- GGUF reader

@pytest.mark.parametrize("model", ["tiny-qwen3moe", "tiny-deepseek2"])
def test_reader_matches_gguf_py_on_every_key(store, model):
    entry = catalog()[model]
    for item in entry["files"]:
        path = str(store / entry["source_dir"] / item["name"])
        ours = hmk_gguf.read_gguf(path, array_limit=None)
        theirs = GGUFReader(path)
        assert ours["tensor_count"] == len(theirs.tensors)
        fields = {k: v for k, v in theirs.fields.items() if not k.startswith("GGUF.")}
        assert set(ours["metadata"]) == set(fields)
        for key, field in fields.items():
            expected = field.contents()
            if isinstance(expected, float):
                assert ours["metadata"][key] == pytest.approx(expected), key
            elif isinstance(expected, list) and expected and isinstance(expected[0], float):
                assert ours["metadata"][key] == pytest.approx(expected), key
            else:
                assert ours["metadata"][key] == expected, key


def test_reader_summarises_long_arrays_and_keeps_scalars(store):
    path = str(store / "tiny-qwen3moe" / "tiny-qwen3moe-00001-of-00003.gguf")
    meta = hmk_gguf.read_gguf(path)
    assert meta["metadata"]["tokenizer.ggml.tokens"] == {"type": "array", "length": 512}
    assert meta["metadata"]["general.architecture"] == "qwen3moe"
    assert meta["metadata"]["qwen3moe.expert_count"] == 16
    assert meta["version"] == 3


def test_reader_rejects_non_gguf_and_truncated_files(tmp_path, store):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"<html>not found</html>")
    with pytest.raises(hmk_gguf.GGUFError, match="not a GGUF file"):
        hmk_gguf.read_gguf(str(bad))
    src = store / "tiny-qwen3moe" / "tiny-qwen3moe-00001-of-00003.gguf"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:2000])
    with pytest.raises(hmk_gguf.GGUFError, match="truncated"):
        hmk_gguf.read_gguf(str(cut))


def test_reader_handles_big_endian_headers(tmp_path):
    def s(text):
        return struct.pack(">Q", len(text)) + text.encode()
    body = b"GGUF" + struct.pack(">IQQ", 3, 0, 2)
    body += s("general.architecture") + struct.pack(">I", 8) + s("qwen3moe")
    body += s("qwen3moe.expert_count") + struct.pack(">II", 4, 128)
    path = tmp_path / "be.gguf"
    path.write_bytes(body)
    meta = hmk_gguf.read_gguf(str(path))
    assert meta["metadata"] == {"general.architecture": "qwen3moe", "qwen3moe.expert_count": 128}


def test_check_gguf_accepts_the_catalog_and_names_each_mismatch(store):
    entry = catalog()["tiny-deepseek2"]
    names = [f["name"] for f in entry["files"]]
    metas = [hmk_gguf.read_gguf(str(store / "tiny-deepseek2" / n)) for n in names]
    assert [hmk.check_gguf(m, entry["gguf"], i, 2) for i, m in enumerate(metas)] == [[], []]
    wrong = dict(entry["gguf"], expert_count=256, rope_freq_base=50000.0, rope_scaling_type="yarn")
    problems = hmk.check_gguf(metas[0], wrong, 0, 2)
    assert "deepseek2.expert_count is 16, the catalog expects 256" in problems
    assert any(p.startswith("deepseek2.rope.freq_base is 10000.0") for p in problems)
    assert "deepseek2.rope.scaling.type is missing (the catalog expects 'yarn')" in problems
    assert hmk.check_gguf(metas[1], entry["gguf"], 0, 2)[0] == "split.no is 1, expected 0 for this file"
    assert "split.count is 2, the catalog says 3" in hmk.check_gguf(metas[0], entry["gguf"], 0, 3)


# ---------------------------------------------------------------------------------------------- catalog

def test_catalog_tiny_models_are_complete_and_big_ones_demand_hashes():
    cat = catalog()
    assert hmk.validate_catalog(cat, ["tiny-qwen3moe", "tiny-deepseek2"]) == []
    problems = hmk.validate_catalog(cat, ["deepseek-r1-671b-q4_k_m"])
    assert any("DeepSeek-R1-Q4_K_M-00001-of-00009.gguf has no sha256" in p and "manifest" in p for p in problems)
    # Qwen's splits carry the pinned revision's hashes; its HF files still wait for the lock
    problems = hmk.validate_catalog(cat, ["qwen3-235b-a22b-q4_k_m"])
    assert not any(".gguf" in p for p in problems)
    assert any("tokenizer.json has no size" in p for p in problems)
    assert hmk.validate_catalog(cat, ["qwen3-235b-a22b-q4_k_m"], require_hashes=False) == []


def test_catalog_real_models_carry_their_layout():
    cat = catalog()
    r1 = cat["deepseek-r1-671b-q4_k_m"]
    assert r1["gguf"]["split_count"] == len(r1["files"]) == 9
    assert r1["files"][0]["name"] == "DeepSeek-R1-Q4_K_M-00001-of-00009.gguf"
    assert (r1["gguf"]["architecture"], r1["gguf"]["expert_count"], r1["gguf"]["block_count"]) == ("deepseek2", 256, 61)
    assert cat["deepseek-r1-671b-iq4_xs"]["gguf"]["split_count"] == 10
    assert cat["qwen3-235b-a22b-q4_k_m"]["gguf"]["architecture"] == "qwen3moe"
    for entry in cat.values():
        # KTransformers reads the HF config files; a model it does not serve (e.g. the bed's gemma3) may lack them.
        if str((entry.get("engines") or {}).get("ktransformers", "")).startswith("not served") and \
                "hf_files" not in entry:
            continue
        names = {f["name"] for f in entry.get("hf_files", [])}
        assert {"config.json", "generation_config.json", "tokenizer_config.json"} <= names


def test_catalog_rules_catch_unknown_models_duplicates_and_split_counts():
    cat = catalog()
    assert "is not in the catalog" in hmk.validate_catalog(cat, ["nope"])[0]
    broken = {"m": {"gguf": {"split_count": 2, "experts": 3},
                    "files": [{"name": "a.gguf", "size": 1, "sha256": "0" * 64},
                              {"name": "a.gguf", "size": 1, "sha256": "0" * 64},
                              {"name": "../x", "size": 1, "sha256": "0" * 64}]}}
    problems = " | ".join(hmk.validate_catalog(broken, ["m"]))
    assert "unknown gguf keys experts" in problems
    assert "a.gguf is listed twice" in problems
    assert "'../x' must be a plain file name" in problems
    short = {"m": {"gguf": {"split_count": 3}, "files": [{"name": "a.gguf", "size": 1, "sha256": "0" * 64}]}}
    assert hmk.validate_catalog(short, ["m"]) == ["model 'm': gguf.split_count is 3 but 1 .gguf files are listed"]


# ------------------------------------------------------------------------------------------- free space

def test_missing_bytes_counts_only_what_a_usable_partial_lacks():
    assert hmk.missing_bytes(100, 0) == 100
    assert hmk.missing_bytes(100, 40) == 60
    assert hmk.missing_bytes(100, 100) == 0
    assert hmk.missing_bytes(100, 150) == 100


def test_space_problem_names_needed_free_and_path():
    gib = 1 << 30
    assert hmk.space_problem("/srv/models", 10 * gib, 30 * gib, 10 * gib) is None
    assert hmk.space_problem("/srv/models", 0, 0, 10 * gib) is None
    msg = hmk.space_problem("/srv/models", 20 * gib, 25 * gib, 10 * gib)
    assert msg.startswith("not enough free space at /srv/models")
    assert "%d bytes (20.00 GiB)" % (20 * gib) in msg and "%d bytes (25.00 GiB) are free" % (25 * gib) in msg
    assert "= %d bytes" % (30 * gib) in msg


def test_free_bytes_measures_the_nearest_existing_directory(tmp_path):
    stat = os.statvfs(str(tmp_path))
    assert abs(hmk.free_bytes(str(tmp_path / "a" / "b")) - stat.f_bavail * stat.f_frsize) < 64 << 20


# ------------------------------------------------------------------------------------ fetch over HTTP

def test_fresh_sync_publishes_verified_files_and_a_rerun_fetches_nothing(store, tmp_path):
    with RangedServer(str(store), str(tmp_path)) as server:
        result = syncer(tmp_path, http(server)).run()
        assert result["changed"] and result["errors"] == []
        for item in entry_files():
            published = tmp_path / MODEL / item["name"]
            assert sha256(str(published)) == item["sha256"]
            assert oct(published.stat().st_mode & 0o777) == "0o644"
            assert (tmp_path / ".hmk-sync" / MODEL / (item["name"] + ".json")).exists()
            assert not (tmp_path / MODEL / (item["name"] + ".partial")).exists()
        total = sum(f["size"] for f in entry_files())
        assert server.bytes_served() == total == result["bytes_received"]

        again = syncer(tmp_path, http(server)).run()
        assert not again["changed"] and again["bytes_needed"] == 0
        assert {e["action"] for e in again["plan"]} == {"ok"}
        assert server.bytes_served() == total
    log = (tmp_path / "sync.log").read_text()
    assert "verified (sha256 %s) and published" % entry_files()[0]["sha256"] in log


def test_check_mode_reports_the_missing_bytes_and_writes_nothing(store, tmp_path):
    with RangedServer(str(store), str(tmp_path)) as server:
        result = syncer(tmp_path, http(server), check_mode=True).run()
        assert result["changed"] and result["bytes_needed"] == sum(f["size"] for f in entry_files())
        assert server.bytes_served() == 0
    assert not (tmp_path / MODEL).exists()


def test_a_transfer_killed_half_way_resumes_and_fetches_only_the_rest(store, tmp_path):
    name = "tiny-qwen3moe-00003-of-00003.gguf"
    path = "/tiny-qwen3moe/" + name
    size = next(f["size"] for f in entry_files() if f["name"] == name)
    with RangedServer(str(store), str(tmp_path)) as server:
        server.die_after(path, size // 2)
        first = syncer(tmp_path, http(server)).run()
        assert len(first["errors"]) == 1 and name in first["errors"][0] and "closed with" in first["errors"][0]
        # The partial waits in staging, and only there, for the next run.
        assert (tmp_path / ".staging" / MODEL / (name + ".partial")).stat().st_size == size // 2
        assert [p for p in tmp_path.rglob("*.partial") if ".staging" not in p.parts] == []
        assert not (tmp_path / MODEL / name).exists()

        second = syncer(tmp_path, http(server)).run()
        assert second["errors"] == [] and second["fetched"] == [name]
        assert [e["partial"] for e in second["plan"] if e["name"] == name] == [size // 2]
        assert server.bytes_served(path) == size
        assert server.served()[path]["ranges"] == ["0-", "%d-" % (size // 2)]
    assert sha256(str(tmp_path / MODEL / name)) == next(f["sha256"] for f in entry_files() if f["name"] == name)
    assert "resuming at byte %d" % (size // 2) in (tmp_path / "sync.log").read_text()
    assert not (tmp_path / ".staging" / MODEL).exists()  # a complete model leaves no staging behind


def test_a_cut_transfer_is_retried_within_the_run_from_where_it_stopped(store, tmp_path):
    name = "tiny-qwen3moe-00001-of-00003.gguf"
    path = "/tiny-qwen3moe/" + name
    size = next(f["size"] for f in entry_files() if f["name"] == name)
    with RangedServer(str(store), str(tmp_path)) as server:
        server.die_after(path, 1000000)
        result = syncer(tmp_path, http(server, retries=2)).run()
        assert result["errors"] == []
        assert server.bytes_served(path) == size and server.served()[path]["requests"] == 2


def test_a_corrupt_download_is_quarantined_and_the_good_copy_stays(store, tmp_path):
    with RangedServer(str(store), str(tmp_path)) as server:
        assert syncer(tmp_path, http(server)).run()["errors"] == []
        name = "tiny-qwen3moe-00002-of-00003.gguf"
        published = tmp_path / MODEL / name
        before = sha256(str(published))
        mirror = tmp_path / "mirror" / "tiny-qwen3moe"
        shutil.copytree(str(store / "tiny-qwen3moe"), str(mirror))
        data = bytearray((mirror / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (mirror / name).write_bytes(bytes(data))
        corrupt_sha = hashlib.sha256(bytes(data)).hexdigest()
        files = entry_files()
        wanted = "ab" * 32  # "upstream published a new version", which the mirror serves corrupted
        for item in files:
            if item["name"] == name:
                item["sha256"] = wanted
        source = hmk.Source("http", server.url + "/mirror/tiny-qwen3moe", retries=0)
    with RangedServer(str(tmp_path), str(tmp_path / "mirror")) as mirror_server:
        source.location = mirror_server.url + "/mirror/tiny-qwen3moe"
        result = syncer(tmp_path, source, files=files).run()
    assert len(result["errors"]) == 1
    error = result["errors"][0]
    assert name in error and wanted in error and corrupt_sha in error
    assert sha256(str(published)) == before
    bad = result["quarantined"][0]
    assert os.path.dirname(bad) == str(tmp_path / ".quarantine" / MODEL) and sha256(bad) == corrupt_sha
    assert not (tmp_path / MODEL / (name + ".partial")).exists()


def test_gguf_metadata_that_disagrees_with_the_catalog_is_not_published(store, tmp_path):
    entry = catalog()[MODEL]
    with RangedServer(str(store), str(tmp_path)) as server:
        log = hmk.ProgressLog(None, MODEL, 0)
        sync = hmk.Syncer(MODEL, str(tmp_path / MODEL), str(tmp_path / "s"), str(tmp_path / "q"), entry_files(),
                          http(server), gguf_expect=dict(entry["gguf"], expert_count=128), log=log)
        result = sync.run()
    assert len(result["errors"]) == 1
    assert "qwen3moe.expert_count is 16, the catalog expects 128" in result["errors"][0]
    assert not (tmp_path / MODEL / entry["files"][0]["name"]).exists()
    assert (tmp_path / MODEL / entry["files"][1]["name"]).exists()


def test_not_enough_space_fails_before_the_first_byte(store, tmp_path):
    with RangedServer(str(store), str(tmp_path)) as server:
        sync = syncer(tmp_path, http(server), margin=1 << 60)
        with pytest.raises(hmk.SyncError, match="not enough free space at %s" % tmp_path):
            sync.run()
        assert server.served() == {}


def test_the_bearer_token_opens_the_store_and_a_wrong_one_is_refused_by_status(store, tmp_path):
    with RangedServer(str(store), str(tmp_path), token="s3cret") as server:
        refused = syncer(tmp_path / "a", http(server, token="wrong")).run()
        assert refused["errors"] and "HTTP 401" in refused["errors"][0] and "wrong" not in refused["errors"][0]
        accepted = syncer(tmp_path / "b", http(server, token="s3cret")).run()
        assert accepted["errors"] == []


class _Recorder(BaseHTTPRequestHandler):
    """Two origins for redirect tests: /a answers 302 to the other server's /b (or to `target`), /b serves BODY
    (ignoring Range on /norange); every request's path and Authorization header are recorded."""

    BODY = bytes(range(256)) * 64

    def do_GET(self):
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/a"):
            self.send_response(302)
            self.send_header("Location", self.server.target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        ranged = self.headers.get("Range")
        if ranged and self.path != "/norange":
            start = int(ranged.split("=")[1].rstrip("-"))
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(self.BODY) - 1, len(self.BODY)))
        self.send_header("Content-Length", str(len(self.BODY) - start))
        self.end_headers()
        self.wfile.write(self.BODY[start:])

    def do_HEAD(self):
        self.server.seen.append(("HEAD " + self.path, self.headers.get("Authorization")))
        self.send_response(302)
        self.send_header("Location", self.server.target)
        self.send_header("X-Linked-Size", str(len(self.BODY)))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def origins():
    servers = []
    for _unused in range(2):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        server.seen, server.target = [], ""
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    first, second = servers
    first.target = "http://127.0.0.1:%d/b?X-Amz-Signature=secret-signature" % second.server_address[1]
    yield first, second
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_redirect_to_another_origin_carries_no_token_and_the_bytes_arrive(origins, tmp_path):
    first, second = origins
    source = hmk.Source("http", "http://127.0.0.1:%d" % first.server_address[1], token="s3cret",
                        follow_redirects=True, retries=0)
    partial = tmp_path / "x.partial"
    partial.write_bytes(_Recorder.BODY[:5000])  # resumed: the Range survives the redirect
    digest, received = source.fetch("a", str(partial), len(_Recorder.BODY), hashlib.sha256(_Recorder.BODY[:5000]))
    assert received == len(_Recorder.BODY) - 5000 and partial.read_bytes() == _Recorder.BODY
    assert digest.hexdigest() == hashlib.sha256(_Recorder.BODY).hexdigest()
    assert first.seen == [("/a", "Bearer s3cret")]
    assert second.seen == [("/b?X-Amz-Signature=secret-signature", None)]


def test_a_redirect_is_refused_where_the_source_does_not_follow_them(origins, tmp_path):
    first, second = origins
    source = hmk.Source("http", "http://127.0.0.1:%d" % first.server_address[1], retries=2, retry_delay=0)
    with pytest.raises(hmk.SyncError, match="does not follow redirects") as failed:
        source.fetch("a", str(tmp_path / "y.partial"), len(_Recorder.BODY), hashlib.sha256())
    assert "secret-signature" not in str(failed.value)  # a signed URL's query is a credential
    assert len(first.seen) == 1 and second.seen == []  # refused at once, not retried


def test_a_head_returns_the_redirect_unfollowed_with_lower_cased_headers_and_the_token(origins):
    first, second = origins
    status, headers = hmk.http_head("http://127.0.0.1:%d/a" % first.server_address[1], "s3cret")
    assert status == 302 and headers["location"] == first.target and headers["x-linked-size"] == str(len(_Recorder.BODY))
    assert first.seen == [("HEAD /a", "Bearer s3cret")] and second.seen == []


@pytest.mark.parametrize("value", ["\n", "\r", "\x00", "\x1b", "\x7f", "\x85", "\u2028"])
def test_a_request_with_a_control_character_in_the_url_or_the_token_is_refused_before_connecting(origins, value):
    first, _unused = origins
    url = "http://127.0.0.1:%d/" % first.server_address[1]
    for call in (lambda: hmk.http_head(url + "a" + value, None), lambda: hmk.http_head(url + "a", "tok" + value),
                 lambda: hmk.open_http(url + "b" + value, 0, None, False),
                 lambda: hmk.open_http(url + "b", 0, "tok" + value, False)):
        with pytest.raises(hmk.SyncError, match="control character"):
            call()
    assert first.seen == []


def test_a_server_that_ignores_the_range_is_refused_and_not_retried(origins, tmp_path):
    _unused, second = origins
    partial = tmp_path / "z.partial"
    partial.write_bytes(_Recorder.BODY[:100])
    source = hmk.Source("http", "http://127.0.0.1:%d" % second.server_address[1], retries=2, retry_delay=0)
    with pytest.raises(hmk.SyncError, match="answered HTTP 200 to a request from byte 100"):
        source.fetch("norange", str(partial), len(_Recorder.BODY), hashlib.sha256(_Recorder.BODY[:100]))
    assert len(second.seen) == 1 and partial.read_bytes() == _Recorder.BODY[:100]


def test_a_transfer_under_1_kib_per_second_for_the_stall_window_is_ended():
    now = [0.0]
    guarded = hmk.speed_guard(lambda view: 10, 120, clock=lambda: now[0])
    for second in range(1, 200):  # 10 bytes each second: alive, but far under 1 KiB/s
        now[0] = float(second)
        if second < 120:
            assert guarded(None) == 10
        else:
            with pytest.raises(TimeoutError, match="under 1024 bytes/s for 120 s"):
                guarded(None)
            break
    fast = hmk.speed_guard(lambda view: 1 << 20, 120, clock=lambda: now[0])
    for second in range(300, 700, 30):
        now[0] = float(second)
        assert fast(None) == 1 << 20


def test_redirect_rules_allow_https_and_http_and_never_downgrade():
    assert hmk.redirect_problem("https://hub/x", "https://cdn/y", True) is None
    assert hmk.redirect_problem("http://mirror/x", "https://cdn/y", True) is None
    assert hmk.redirect_problem("http://mirror/x", "http://other/y", True) is None
    assert "from https to http is refused" in hmk.redirect_problem("https://hub/x", "http://cdn/y", True)
    assert "only http and https" in hmk.redirect_problem("https://hub/x", "file:///etc/passwd", True)
    assert "does not follow redirects" in hmk.redirect_problem("http://store/x", "http://store/y", False)


def _supports_direct_io(directory):
    probe = os.path.join(str(directory), "direct.probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        if os.path.exists(probe):
            os.unlink(probe)


def _writer_process(pieces, size):
    """A process that writes `pieces` blocks of `size` bytes to stdout in small bursts, as curl does to a pipe."""
    return subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        "for i in range(%d):\n"
        "    os.write(1, bytes([65 + i %% 26]) * %d)\n"
        "    time.sleep(0.002)\n" % (pieces, size))], stdout=subprocess.PIPE)


def test_each_piece_from_a_pipe_is_hashed_in_the_buffer_it_arrives_in(tmp_path):
    partial = tmp_path / "x.partial"
    partial.write_bytes(b"head:")  # a resumed partial whose end is not aligned for direct I/O
    digest = hashlib.sha256(b"head:")
    writer = _writer_process(40, 997)
    pipe = writer.stdout.fileno()
    total, appender = hmk.append_hashed(lambda view: os.readv(pipe, [view]), str(partial), digest, block=8192)
    assert writer.wait() == 0
    assert total == 40 * 997 and partial.stat().st_size == 5 + total
    assert digest.hexdigest() == hashlib.sha256(partial.read_bytes()).hexdigest()
    assert appender.direct_bytes + appender.buffered_bytes == total
    if _supports_direct_io(tmp_path):
        # the head up to the next 4 KiB boundary and the tail go buffered, every whole block in between direct
        assert appender.direct_bytes == (total - (hmk.ALIGN - 5)) // hmk.ALIGN * hmk.ALIGN
    else:
        assert appender.direct_bytes == 0


def test_without_direct_io_every_byte_is_written_through_the_page_cache(tmp_path):
    partial = tmp_path / "y.partial"
    digest = hashlib.sha256()
    writer = _writer_process(12, 4096)
    pipe = writer.stdout.fileno()
    total, appender = hmk.append_hashed(lambda view: os.readv(pipe, [view]), str(partial), digest, direct=False,
                                        block=8192)
    assert writer.wait() == 0
    assert (total, appender.direct_bytes, appender.buffered_bytes) == (12 * 4096, 0, 12 * 4096)
    assert digest.hexdigest() == hashlib.sha256(partial.read_bytes()).hexdigest()


def test_a_direct_write_the_filesystem_refuses_falls_back_to_buffered_writes(tmp_path):
    partial = tmp_path / "z.partial"
    appender = hmk._Appender(str(partial))
    opened_direct = appender.direct_fd is not None
    data = bytearray(b"q" * (3 * hmk.ALIGN + 1))
    appender.write(memoryview(data)[1:])  # memory one byte off any alignment: a direct write gets EINVAL
    appender.close()
    assert partial.read_bytes() == b"q" * (3 * hmk.ALIGN)
    assert (appender.direct_fd, appender.direct_bytes, appender.buffered_bytes) == (None, 0, 3 * hmk.ALIGN)
    assert opened_direct == _supports_direct_io(tmp_path)


def test_a_write_that_fails_stops_the_append_and_names_the_file():
    pieces = [b"z" * 100000]

    def fill(view):
        if not pieces:
            return 0
        piece = pieces.pop()
        view[:len(piece)] = piece
        return len(piece)
    with pytest.raises(hmk.SyncError, match=r"writing /dev/full failed at byte 0: .*No space left on device"):
        hmk.append_hashed(fill, "/dev/full", hashlib.sha256())


# ----------------------------------------------------------------------------- stamps, rehash, partials

def test_the_stamp_is_trusted_until_rehash_is_asked(store, tmp_path):
    source = hmk.Source("local", str(store / "tiny-qwen3moe"))
    assert syncer(tmp_path, source).run()["errors"] == []
    name = "tiny-qwen3moe-00003-of-00003.gguf"
    published = tmp_path / MODEL / name
    stat = published.stat()
    data = bytearray(published.read_bytes())
    data[100] ^= 1
    os.chmod(str(published), 0o644)
    published.write_bytes(bytes(data))
    os.utime(str(published), ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert not syncer(tmp_path, source).run()["changed"]
    healed = syncer(tmp_path, source, rehash=True).run()
    assert healed["fetched"] == [name] and healed["errors"] == []
    assert sha256(str(published)) == next(f["sha256"] for f in entry_files() if f["name"] == name)


def test_an_adopted_copy_is_verified_once_then_trusted(store, tmp_path):
    (tmp_path / MODEL).mkdir()
    for item in entry_files():
        shutil.copy(str(store / "tiny-qwen3moe" / item["name"]), str(tmp_path / MODEL / item["name"]))
    source = hmk.Source("local", str(tmp_path / "nowhere"))
    first = syncer(tmp_path, source).run()
    assert first["changed"] and first["fetched"] == [] and {e["action"] for e in first["plan"]} == {"stamp"}
    assert not syncer(tmp_path, source).run()["changed"]


def test_a_partial_longer_than_the_file_is_started_over(store, tmp_path):
    name = "tiny-qwen3moe-00001-of-00003.gguf"
    (tmp_path / MODEL).mkdir()
    (tmp_path / MODEL / (name + ".partial")).write_bytes(b"x" * 5000000)
    result = syncer(tmp_path, hmk.Source("local", str(store / "tiny-qwen3moe"))).run()
    assert result["errors"] == []
    assert sha256(str(tmp_path / MODEL / name)) == entry_files()[0]["sha256"]


def test_a_local_source_resumes_a_partial_copy(store, tmp_path):
    name = "tiny-qwen3moe-00002-of-00003.gguf"
    (tmp_path / MODEL).mkdir()
    head = (store / "tiny-qwen3moe" / name).read_bytes()[:123457]
    (tmp_path / MODEL / (name + ".partial")).write_bytes(head)
    result = syncer(tmp_path, hmk.Source("local", str(store / "tiny-qwen3moe"))).run()
    assert result["errors"] == []
    size = next(f["size"] for f in entry_files() if f["name"] == name)
    assert next(e for e in result["plan"] if e["name"] == name)["missing"] == size - 123457


def test_rsync_appends_to_a_partial_and_the_result_is_hashed(store, tmp_path):
    name = "tiny-qwen3moe-00002-of-00003.gguf"
    (tmp_path / MODEL).mkdir()
    (tmp_path / MODEL / (name + ".partial")).write_bytes((store / "tiny-qwen3moe" / name).read_bytes()[:99999])
    result = syncer(tmp_path, hmk.Source("rsync", str(store / "tiny-qwen3moe"))).run()
    assert result["errors"] == []
    assert sha256(str(tmp_path / MODEL / name)) == entry_files()[1]["sha256"]


# ------------------------------------------------------------------------------ bounded bytes (issue 27)

class _Flood(BaseHTTPRequestHandler):
    """Answers every GET with 64 times the file's size: with Content-Length (`/announced/...`), or without it, the
    body ended by closing the connection (`/unannounced/...`). Counts the bytes it managed to send."""
    protocol_version = "HTTP/1.0"
    SIZE = 1 << 20

    def do_GET(self):
        body = self.server.body * 64
        self.send_response(200)
        if self.path.startswith("/announced"):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for start in range(0, len(body), 1 << 20):
                self.wfile.write(body[start:start + (1 << 20)])
                self.server.sent += 1 << 20
        except OSError:
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def flood():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flood)
    server.body, server.sent = os.urandom(_Flood.SIZE), 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _tree_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _unused, files in os.walk(str(root)) for f in files)


@pytest.mark.parametrize("how", ["announced", "unannounced"])
def test_a_server_sending_64_times_the_size_is_cut_at_the_size_and_nothing_piles_up(flood, tmp_path, how):
    item = {"name": "big.bin", "size": _Flood.SIZE, "sha256": hashlib.sha256(flood.body).hexdigest()}
    source = hmk.Source("http", "http://127.0.0.1:%d/%s" % (flood.server_address[1], how), retries=2, retry_delay=0)
    for _unused in range(3):  # each run refuses again, and the disk holds no more after the third than after the first
        result = hmk.Syncer(MODEL, str(tmp_path / MODEL), str(tmp_path / ".s"), str(tmp_path / ".q"), [item],
                            source).run()
        assert len(result["errors"]) == 1 and "oversize refused" in result["errors"][0]
        assert not (tmp_path / MODEL / "big.bin").exists()
        assert result["bytes_received"] <= _Flood.SIZE and result["quarantined"] == []
        assert _tree_bytes(tmp_path) == 0, "bytes of a refused oversize answer were kept"
    assert "%d bytes" % _Flood.SIZE in result["errors"][0]


def test_a_range_answer_for_a_file_of_another_size_is_refused(origins, tmp_path):
    _unused, second = origins
    partial = tmp_path / "r.partial"
    partial.write_bytes(_Recorder.BODY[:100])
    source = hmk.Source("http", "http://127.0.0.1:%d" % second.server_address[1], retries=2, retry_delay=0)
    size = len(_Recorder.BODY) + 100  # Content-Length fits in what is missing; the total it names does not
    with pytest.raises(hmk.SyncError, match="oversize refused: .* announced a %d-byte file in Content-Range, the "
                                            "file's size is %d bytes" % (len(_Recorder.BODY), size)):
        source.fetch("b", str(partial), size, hashlib.sha256(_Recorder.BODY[:100]))
    assert len(second.seen) == 1 and not partial.exists()


def test_quarantine_keeps_one_copy_per_file_across_runs(store, tmp_path):
    name = "tiny-qwen3moe-00002-of-00003.gguf"
    files = entry_files()
    for item in files:
        if item["name"] == name:
            item["sha256"] = "ab" * 32  # every run receives bytes that fail verification
    earlier = tmp_path / ".quarantine" / MODEL / ("%s.20250101T000000Z.bad" % name)
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"x" * 1000)  # what an earlier run left
    other = tmp_path / ".quarantine" / MODEL / "notes.txt"
    other.write_text("kept")
    with RangedServer(str(store), str(tmp_path)) as server:
        result = syncer(tmp_path, http(server), files=files).run()
    assert len(result["errors"]) == 1 and len(result["quarantined"]) == 1
    assert sorted(os.listdir(str(earlier.parent))) == sorted([os.path.basename(result["quarantined"][0]), "notes.txt"])


def _publish(root, data):
    """What model_sync does when a model update lands: the verified file renamed over the old one, then its stamp."""
    final, stamp = root / "m" / "x.gguf", root / ".hmk-sync" / "m" / "x.gguf.json"
    fresh = root / ".staging-x"
    fresh.write_bytes(data)
    os.replace(str(fresh), str(final))
    stat = os.stat(str(final))
    stamp.write_text(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "size": stat.st_size,
                                 "mtime_ns": stat.st_mtime_ns}))


@pytest.mark.parametrize("when", ["before hashing", "between hashing and judging"])
def test_a_model_update_landing_during_the_rehash_is_not_quarantined(tmp_path, monkeypatch, when):
    root = tmp_path / "models"
    (root / "m").mkdir(parents=True)
    (root / ".hmk-sync" / "m").mkdir(parents=True)
    _publish(root, b"old" * 1000)
    new = b"new version" * 2000
    hash_file = integrity._sha256

    def racing(path):  # the sync publishes while the timer reads
        if when == "before hashing":
            _publish(root, new)
            return hash_file(path)
        hashed = hash_file(path)
        _publish(root, new)
        return hashed
    monkeypatch.setattr(integrity, "_sha256", racing)
    record = integrity.rehash(str(root), str(root / ".hmk-sync"), str(root / ".quarantine"))
    assert record["ok"] and record["mismatches"] == [], record
    assert (root / "m" / "x.gguf").read_bytes() == new
    assert json.loads((root / ".hmk-sync" / "m" / "x.gguf.json").read_text())["sha256"] == hashlib.sha256(new).hexdigest()
    assert not (root / ".quarantine").exists()
    assert [c["file"] for c in record["changed_during_rehash"]] == ([] if when == "before hashing" else ["x.gguf"])
    monkeypatch.setattr(integrity, "_sha256", hash_file)
    again = integrity.rehash(str(root), str(root / ".hmk-sync"), str(root / ".quarantine"))
    assert again["ok"] and again["files_checked"] == 1 and again["changed_during_rehash"] == []


def test_a_local_source_file_longer_than_its_size_is_refused_and_nothing_is_kept(tmp_path):
    data = os.urandom(4096)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x.bin").write_bytes(data * 64)
    item = {"name": "x.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    source = hmk.Source("local", str(tmp_path / "src"))
    result = hmk.Syncer(MODEL, str(tmp_path / "d" / MODEL), str(tmp_path / "d" / ".s"), str(tmp_path / "d" / ".q"),
                        [item], source).run()
    assert len(result["errors"]) == 1 and "oversize refused" in result["errors"][0] and result["quarantined"] == []
    assert result["bytes_received"] <= len(data) and _tree_bytes(tmp_path / "d") == 0
