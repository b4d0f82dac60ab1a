"""scripts/make-tiny-moe-gguf: reproducible bytes (the catalog's sha256), the split layout, the vocabulary trap
(bytes 0x80-0xFF UNUSED), the ChatML template and DeepSeek's real MLA dimensions."""
import hashlib
import os

import pytest
from gguf import GGUFReader, TokenType

from conftest_model_sync import catalog, generate


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("model", ["tiny-qwen3moe", "tiny-deepseek2"])
def test_generator_reproduces_the_catalog_sizes_and_hashes(tmp_path, model):
    entry = catalog()[model]
    paths = generate(str(tmp_path), entry["generator"], model)
    assert [os.path.basename(p) for p in paths] == [f["name"] for f in entry["files"] + entry["hf_files"]]
    for item in entry["files"] + entry["hf_files"]:
        path = str(tmp_path / item["name"])
        assert (os.path.getsize(path), sha256(path)) == (item["size"], item["sha256"]), item["name"]


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = generate(str(tmp_path / "a"), ["--arch", "qwen3moe", "--seed", "7"], "m", hf=False)
    b = generate(str(tmp_path / "b"), ["--arch", "qwen3moe", "--seed", "7"], "m", hf=False)
    c = generate(str(tmp_path / "c"), ["--arch", "qwen3moe", "--seed", "8"], "m", hf=False)
    assert sha256(a[0]) == sha256(b[0]) != sha256(c[0])
    assert os.path.basename(a[0]) == "m.gguf"


def field(reader, key):
    return reader.fields[key].contents()


def test_split_files_carry_split_metadata_and_the_model_keys_live_in_the_first(tmp_path):
    paths = generate(str(tmp_path), ["--arch", "qwen3moe", "--split", "3"], "q", hf=False)
    assert [os.path.basename(p) for p in paths] == ["q-%05d-of-00003.gguf" % i for i in (1, 2, 3)]
    readers = [GGUFReader(p) for p in paths]
    assert [field(r, "split.no") for r in readers] == [0, 1, 2]
    assert {field(r, "split.count") for r in readers} == {3}
    assert sum(len(r.tensors) for r in readers) == field(readers[0], "split.tensors.count") == 3 + 12 * 4
    assert field(readers[0], "general.architecture") == "qwen3moe"
    assert "qwen3moe.expert_count" not in readers[1].fields


def test_vocabulary_types_high_bytes_unused_and_has_a_chatml_template(tmp_path):
    reader = GGUFReader(generate(str(tmp_path), ["--arch", "qwen3moe"], "q", hf=False)[0])
    tokens, types = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == 512 and field(reader, "tokenizer.ggml.model") == "llama"
    byte_types = {tokens[i]: types[i] for i in range(len(tokens)) if tokens[i].startswith("<0x")}
    assert len(byte_types) == 256
    assert all(byte_types["<0x%02X>" % b] == TokenType.BYTE for b in range(0x80))
    assert all(byte_types["<0x%02X>" % b] == TokenType.UNUSED for b in range(0x80, 0x100))
    assert "<|im_start|>" in field(reader, "tokenizer.chat_template")
    names = [t.name for t in reader.tensors]
    assert "blk.3.ffn_gate_exps.weight" in names and "blk.0.ffn_down_exps.weight" in names


def test_deepseek2_has_real_mla_dimensions_and_shared_experts(tmp_path):
    reader = GGUFReader(generate(str(tmp_path), ["--arch", "deepseek2"], "d", hf=False)[0])
    assert field(reader, "deepseek2.attention.kv_lora_rank") == 512
    assert field(reader, "deepseek2.rope.dimension_count") == 64
    assert field(reader, "deepseek2.attention.key_length") == 192
    assert field(reader, "deepseek2.attention.value_length") == 128
    assert field(reader, "deepseek2.expert_shared_count") == 1
    assert field(reader, "deepseek2.leading_dense_block_count") == 1
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors["blk.1.attn_kv_a_mqa.weight"].shape) == [256, 512 + 64]
    assert "blk.0.ffn_up.weight" in tensors and "blk.1.ffn_up_shexp.weight" in tensors
    assert "blk.0.ffn_up_exps.weight" not in tensors


def test_split_counts_that_cannot_be_met_are_refused(tmp_path):
    import subprocess
    import sys
    from conftest_model_sync import GENERATOR
    done = subprocess.run([sys.executable, GENERATOR, "--arch", "qwen3moe", "--split", "50", "-o",
                           str(tmp_path / "x.gguf")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    assert done.returncode != 0 and "cannot split 51 tensors into exactly 50 files" in done.stderr
