"""After converge, idempotence and the side effects: what an operator would check on the node and on the store."""
import json
import os

import pytest
import yaml

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY",
                         os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
STATE = os.path.join(os.environ.get("HMK_STATE", "/var/tmp/hybrid-moe-kit"), "model_sync_transfer")

with open(os.path.join(PROJECT, "roles", "model_sync", "vars", "catalog.yml")) as _handle:
    CATALOG = yaml.safe_load(_handle)["__model_sync_catalog_builtin"]


def files_of(model):
    return CATALOG[model]["files"] + CATALOG[model]["hf_files"]


@pytest.mark.parametrize("model", ["tiny-qwen3moe", "tiny-deepseek2"])
def test_every_file_is_published_with_the_catalog_hash_root_owned_and_read_only(host, model):
    for item in files_of(model):
        published = host.file("/srv/models/%s/%s" % (model, item["name"]))
        assert published.is_file and published.size == item["size"]
        assert published.sha256sum == item["sha256"]
        assert (published.user, published.group, published.mode) == ("root", "root", 0o644)
        assert not host.file(published.path + ".partial").exists
        stamp = json.loads(host.file("/srv/models/.hmk-sync/%s/%s.json" % (model, item["name"])).content_string)
        assert stamp["sha256"] == item["sha256"] and stamp["size"] == item["size"]


def test_the_service_user_reads_the_models_but_cannot_change_them(host):
    user = host.user("moe")
    assert user.exists and user.uid < 1000 and user.shell == "/usr/sbin/nologin"
    path = "/srv/models/tiny-qwen3moe/" + CATALOG["tiny-qwen3moe"]["files"][0]["name"]
    assert host.run("runuser -u moe -- head -c 4 %s" % path).stdout == "GGUF"
    assert host.run("runuser -u moe -- test -w %s" % path).rc != 0
    assert host.run("runuser -u moe -- touch /srv/models/tiny-qwen3moe/x").rc != 0
    quarantine = host.file("/srv/models/.quarantine")
    assert quarantine.mode == 0o700 and quarantine.user == "root"


def test_the_progress_log_tells_the_story_of_the_sync(host):
    log = host.file("/var/log/hmk-model-sync.log").content_string
    cut = CATALOG["tiny-deepseek2"]["files"][1]["name"]
    assert "tiny-deepseek2 %s: resuming at byte 4000000" % cut in log
    assert "tiny-deepseek2 %s: verified (sha256 %s) and published" % (cut, CATALOG["tiny-deepseek2"]["files"][1]["sha256"]) in log
    assert "ERROR %s failed verification" % CATALOG["tiny-qwen3moe"]["files"][1]["name"] in log
    assert "hmk-transfer-test-token" not in log


def test_the_store_sent_each_byte_once_apart_from_the_rejected_update(host):
    with open(os.path.join(STATE, "stats.json")) as handle:
        stats = json.load(handle)
    with open(os.path.join(STATE, "v2.json")) as handle:
        v2 = json.load(handle)
    for model in ("tiny-qwen3moe", "tiny-deepseek2"):
        for item in files_of(model):
            assert stats["/%s/%s" % (model, item["name"])]["bytes"] == item["size"], item["name"]
    assert stats["/%s/%s" % (v2["source_dir"], v2["name"])]["bytes"] == v2["size"]
    assert len(stats) == len(files_of("tiny-qwen3moe")) + len(files_of("tiny-deepseek2")) + 1
    assert not any(p.startswith("/srv/small") for p in stats)


def test_the_too_small_disk_received_nothing(host):
    assert host.run("find /srv/small -name '*.partial' -o -name '*.gguf'").stdout.strip() == ""
