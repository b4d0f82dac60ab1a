"""After converge, idempotence and the side effects: what an operator would check on both twins and on the control
machine (the lock, the stand-in's counters)."""
import json
import os

import pytest
import yaml

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY",
                         os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
STATE = os.path.join(os.environ.get("HMK_STATE", "/var/tmp/hybrid-moe-kit"), "model_sync_hub")
MODELS = ["tiny-qwen3moe", "tiny-deepseek2"]
PEER_TOKEN = "hmk-hub-peer-token-not-a-secret"
HUB_TOKEN = "hmk-hub-test-token-not-a-secret"

with open(os.path.join(PROJECT, "roles", "model_sync", "vars", "catalog.yml")) as _handle:
    CATALOG = yaml.safe_load(_handle)["__model_sync_catalog_builtin"]


def files_of(model):
    return CATALOG[model]["files"] + CATALOG[model]["hf_files"]


@pytest.mark.parametrize("model", MODELS)
def test_both_twins_hold_every_file_with_the_hubs_sha256(host, model):
    for item in files_of(model):
        published = host.file("/srv/models/%s/%s" % (model, item["name"]))
        assert published.is_file and published.size == item["size"]
        assert published.sha256sum == item["sha256"]
        assert (published.user, published.group, published.mode) == ("root", "root", 0o644)
        assert not host.file(published.path + ".partial").exists
        stamp = json.loads(host.file("/srv/models/.hmk-sync/%s/%s.json" % (model, item["name"])).content_string)
        assert stamp["sha256"] == item["sha256"]


def test_the_progress_log_never_holds_a_token(host):
    log = host.file("/var/log/hmk-model-sync.log").content_string
    assert "verified (sha256" in log
    assert HUB_TOKEN not in log and PEER_TOKEN not in log


def test_hub_a_serves_its_models_and_hub_b_fetched_every_file_from_it(host):
    if host.backend.get_hostname() != "hub-a":
        assert not host.file("/etc/systemd/system/hmk-model-peer.service").exists
        return
    service = host.service("hmk-model-peer")
    assert service.is_running and service.is_enabled
    token = host.file("/etc/hmk/model-peer.token")
    assert (token.user, token.mode) == ("root", 0o600)
    assert PEER_TOKEN not in host.run("systemctl show -p ExecStart hmk-model-peer").stdout
    journal = host.run("journalctl -u hmk-model-peer --no-pager -o cat").stdout
    for model in MODELS:
        for item in files_of(model):
            assert '"GET /%s/%s HTTP/1.1" 200' % (model, item["name"]) in journal, item["name"]
    assert PEER_TOKEN not in journal


def test_the_peer_refuses_a_request_without_its_token(host):
    name = CATALOG["tiny-qwen3moe"]["files"][0]["name"]
    url = "http://127.0.0.1:18583/tiny-qwen3moe/%s" % name
    assert host.run("curl -s -o /dev/null -w '%%{http_code}' %s" % url).stdout == "401"
    assert host.run("curl -s -o /dev/null -w '%%{http_code}' %s/../../etc/hmk/model-peer.token" % url).stdout in (
        "401", "404")


def test_the_stand_in_sent_no_byte_for_the_refused_inputs(host):
    with open(os.path.join(STATE, "stats-bad-input.json")) as handle:
        stats = json.load(handle)
    corrupt = CATALOG["tiny-qwen3moe"]["files"][1]
    # after the restart only the corrupt case reached the storage, and only for the files it lacked
    assert set(stats["storage"]) <= {f["sha256"] for f in CATALOG["tiny-qwen3moe"]["files"]}
    assert stats["storage"][corrupt["sha256"]]["bytes"] == corrupt["size"]
    assert any(k.startswith("401 Invalid credentials") for k in stats["refused"])
    assert any(k.startswith("404 RevisionNotFound") for k in stats["refused"])


def test_the_lock_is_yaml_the_operator_can_keep_with_the_inventory(host):
    with open(os.path.join(STATE, "models.lock.yml")) as handle:
        text = handle.read()
    assert text.startswith("# Written by hmk.moe_kit model_sync")
    lock = yaml.safe_load(text)
    assert sorted(lock["models"]) == sorted(MODELS)
    assert HUB_TOKEN not in text
