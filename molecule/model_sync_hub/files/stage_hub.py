"""Lay out the STAND-IN Hub's repositories (hub_standin.py --repos DIR) from the catalog: every tiny model whose
`huggingface.repo` is in the stand-in's namespace (hmk-lab/) becomes one repository with one commit, generated with
the entry's generator arguments: the GGUF splits under `huggingface.subfolder`, the HF config files and a README at
the root, `refs.json` pointing `main` at the commit.

The commit id is a pure function of the content (sha1 over the sorted paths and their sha256), so the catalog can
pin it as a user pins a real repository's commit; tests check that the catalog's pin and this id agree.

  stage_hub.py --project /work/main --out /var/tmp/hybrid-moe-kit/model_sync_hub/repos
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

NAMESPACE = "hmk-lab/"


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def commit_id(tree):
    """The stand-in's commit id of a tree given as {path in repo: local file}."""
    lines = "".join("%s\0%s\n" % (path, sha256_of(tree[path])) for path in sorted(tree))
    return hashlib.sha1(lines.encode()).hexdigest()


def repo_tree(name, entry, workdir, project):
    """{path in repo: generated file} for one catalog entry."""
    out = os.path.join(workdir, name)
    subprocess.run([sys.executable, os.path.join(project, "scripts", "make-tiny-moe-gguf"), "-o",
                    os.path.join(out, name + ".gguf"), "--hf-dir", out] + entry["generator"],
                   check=True, stdout=subprocess.DEVNULL)
    readme = os.path.join(out, "README.md")
    with open(readme, "w") as handle:
        handle.write("# %s\n\nRandom-weight test model served by the hybrid-moe-kit Hub STAND-IN (not a real "
                     "Hugging Face repository).\n" % entry["huggingface"]["repo"])
    subfolder = entry["huggingface"].get("subfolder", "")
    tree = {"README.md": readme}
    for item in entry["files"]:
        tree["/".join(filter(None, [subfolder, item["name"]]))] = os.path.join(out, item["name"])
    for item in entry.get("hf_files", []):
        tree[item["name"]] = os.path.join(out, item["name"])
    return tree


def stage(project, out):
    with open(os.path.join(project, "roles", "model_sync", "vars", "catalog.yml")) as handle:
        catalog = yaml.safe_load(handle)["__model_sync_catalog_builtin"]
    shutil.rmtree(out, ignore_errors=True)
    commits = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name, entry in sorted(catalog.items()):
            hub = entry.get("huggingface") or {}
            if "generator" not in entry or not hub.get("repo", "").startswith(NAMESPACE):
                continue
            tree = repo_tree(name, entry, workdir, project)
            commit = commit_id(tree)
            base = os.path.join(out, hub["repo"])
            for path, local in tree.items():
                os.makedirs(os.path.dirname(os.path.join(base, commit, path)), exist_ok=True)
                shutil.copyfile(local, os.path.join(base, commit, path))
            with open(os.path.join(base, "refs.json"), "w") as handle:
                json.dump({"main": commit}, handle)
            commits[hub["repo"]] = commit
    return commits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    print(json.dumps(stage(args.project, args.out), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
