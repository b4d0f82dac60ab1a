"""Lay out the scenario's model store: the catalog's tiny models, generated with the catalog's generator
arguments, plus tiny-qwen3moe-v2/ where split 2 is a new version (seed 4321) that the store serves corrupted
(one byte flipped). v2.json records the new version's true size and sha256 and the corrupted copy's sha256.

  stage_sources.py --project /work/main --out /var/tmp/hybrid-moe-kit/model_sync_transfer/www
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

import yaml


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    generator = os.path.join(args.project, "scripts", "make-tiny-moe-gguf")
    with open(os.path.join(args.project, "roles", "model_sync", "vars", "catalog.yml")) as handle:
        catalog = yaml.safe_load(handle)["__model_sync_catalog_builtin"]
    shutil.rmtree(args.out, ignore_errors=True)
    for name, entry in sorted(catalog.items()):
        if "generator" not in entry:
            continue
        out = os.path.join(args.out, entry["source_dir"])
        subprocess.run([sys.executable, generator, "-o", os.path.join(out, name + ".gguf"), "--hf-dir", out]
                       + entry["generator"], check=True, stdout=subprocess.DEVNULL)

    v1 = catalog["tiny-qwen3moe"]
    v1_dir = os.path.join(args.out, v1["source_dir"])
    v2_dir = os.path.join(args.out, "tiny-qwen3moe-v2")
    staging = os.path.join(args.out, ".v2-staging")
    subprocess.run([sys.executable, generator, "-o", os.path.join(staging, "tiny-qwen3moe.gguf"), "--seed", "4321"]
                   + [a for a in v1["generator"] if a not in ("--seed", "1234")], check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(v1_dir, v2_dir)
    name = v1["files"][1]["name"]
    good = os.path.join(staging, name)
    with open(good, "rb") as handle:
        data = bytearray(handle.read())
    data[len(data) // 2] ^= 0xFF
    with open(os.path.join(v2_dir, name), "wb") as handle:
        handle.write(bytes(data))
    manifest = {"name": name, "size": os.path.getsize(good), "sha256": sha256(good),
                "corrupt_sha256": sha256(os.path.join(v2_dir, name)), "source_dir": "tiny-qwen3moe-v2"}
    shutil.rmtree(staging)
    with open(os.path.join(os.path.dirname(os.path.abspath(args.out)), "v2.json"), "w") as handle:
        json.dump(manifest, handle, indent=1)
    print(json.dumps(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
