"""The CUDA toolkit of an engine build (plugins/filter/llama_build.py with the toolkit filters of
plugins/filter/hmk_nvidia.py): the toolkit by series reaches cmake, nvcc's full version joins the
build key, and a toolkit newer than the installed driver is refused before anything is built."""
import importlib
import importlib.util
import io
import os
import sys

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))
nv = importlib.import_module("hmk_nvidia")

_spec = importlib.util.spec_from_file_location("llama_build_cuda", os.path.join(ROOT, "plugins/filter/llama_build.py"))
lb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lb)

SHA = "55d3c05bf7b377deaa5dc84d255d9740a345a206"
with io.open(os.path.join(ROOT, "inventories/production/group_vars/genoa_1gpu/hardware.yml"), encoding="utf-8") as _h:
    GENOA_4090 = yaml.safe_load(_h)["hmk_hardware"]
ZEN4 = "flags : fpu avx2 fma f16c avx512f avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"


def _args(**options):
    return lb.cmake_args(GENOA_4090, ZEN4, "ik_llama.cpp", "2026-04-13", dict({"cuda": "auto"}, **options))


def test_the_toolkit_by_series_is_what_cmake_compiles_and_links_with():
    args = _args(cuda_version="12.8", cuda_home="/usr/local/cuda-12.8/")
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.8/bin/nvcc" in args
    assert "-DCUDAToolkit_ROOT=/usr/local/cuda-12.8" in args
    assert not any("/usr/local/cuda/" in a or a.endswith("/usr/local/cuda") for a in args)
    # Without a home the arguments stay as they were (the CUDA sample script passes its own compiler).
    assert not any(a.startswith("-DCMAKE_CUDA_COMPILER") for a in _args(cuda_version="12.8"))


def test_nvccs_full_version_is_in_the_key_of_cuda_builds_only():
    args = _args(cuda_version="12.8", cuda_home="/usr/local/cuda-12.8")
    targets = ["llama-server", "llama-bench"]
    key_93 = lb.build_key(SHA, args, targets, "ik_llama.cpp", "12.8.93")
    key_61 = lb.build_key(SHA, args, targets, "ik_llama.cpp", "12.8.61")
    assert key_93 != key_61 and key_93.startswith(SHA[:12] + "-")
    cpu = lb.cmake_args(GENOA_4090, ZEN4, "ik_llama.cpp", "2026-04-13", {"cuda": "disabled"})
    assert lb.build_key(SHA, cpu, targets, "ik_llama.cpp", "") == lb.build_key(SHA, cpu, targets, "ik_llama.cpp")


def test_another_series_is_another_build():
    a = _args(cuda_version="12.8", cuda_home="/usr/local/cuda-12.8")
    b = _args(cuda_version="12.9", cuda_home="/usr/local/cuda-12.9")
    assert lb.build_key(SHA, a, ["llama-server"], "ik_llama.cpp", "12.8.93") != \
        lb.build_key(SHA, b, ["llama-server"], "ik_llama.cpp", "12.9.86")


def test_the_roles_probe_picks_the_series_and_refuses_a_driver_too_old_for_it():
    # The probe's parts as real nodes print them: this host's toolkit listing (CUDA 13.0 beside the
    # floating /usr/local/cuda link) and a node whose loaded driver is R565 (nixGL#186).
    def read(path):
        with io.open(os.path.join(ROOT, "tests", "fixtures", "nvidia", path), encoding="utf-8") as handle:
            return handle.read()
    probe = read("own/ls-cuda-toolkits--dev-host.txt") + read("proc-driver-nvidia-version--open-565-ubuntu2404--nixgl-186.txt")
    choice = nv.cuda_toolkit_choice(nv.cuda_toolkits(probe), "")
    assert choice == {"series": "13.0", "home": "/usr/local/cuda-13.0", "error": ""}
    driver = nv.installed_driver_version(probe)
    assert driver["version"] == "565.57.01"
    nvcc = read("own/nvcc-version--13.0-and-floating-link--dev-host.txt")
    errors = nv.toolkit_driver_errors(nv.nvcc_release(nvcc), driver["version"])
    assert len(errors) == 1 and "13.0" in errors[0] and "565.57.01" in errors[0] and "580.65.06" in errors[0]


def test_the_role_defaults_follow_the_driver_roles_toolkit():
    with io.open(os.path.join(ROOT, "roles/llama_build/defaults/main.yml"), encoding="utf-8") as h:
        defaults = yaml.safe_load(h)
    assert defaults["llama_build_cuda_home"] == ""
    assert "nvidia_driver_cuda_toolkit_version" in defaults["llama_build_cuda_version"]
