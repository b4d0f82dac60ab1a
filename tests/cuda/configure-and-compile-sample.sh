#!/usr/bin/env bash
# Compile check of ik_llama.cpp's CUDA path on a machine without a GPU (CI): the full CUDA build
# takes 1-2 h on 2 cores, so this configures the tree with the flags the llama_build role derives
# (its filter plugin renders them, so the kit's own code is exercised) for an RTX 4090 node
# (sm_89), then compiles a few small CUDA objects and checks they exist. About 2-5 min warm.
#
# What the host lacks and where it comes from (all cached by hash under $HMK_CACHE):
#   cuBLAS         PyPI wheel nvidia-cublas==13.0.2.14, overlaid on a copy of the CUDA toolkit
#   cmake >= 3.28  PyPI wheel cmake==4.4.5 (Debian's 3.25 does not know the CUDA20 dialect ik uses)
#   libcuda stub   none: -DGGML_CUDA_NO_VMM=ON drops the direct libcuda link
# Env: HMK_CACHE (default /var/cache/hybrid-moe-kit), CUDA_SRC (default /usr/local/cuda-13.0),
#      PYTHON (default python3), SAMPLE_OBJECTS (space-separated .cu names under ggml/src/ggml-cuda/).
set -euo pipefail

CACHE=${HMK_CACHE:-/var/cache/hybrid-moe-kit}
CUDA_SRC=${CUDA_SRC:-/usr/local/cuda-13.0}
PYTHON=${PYTHON:-python3}
SAMPLE_OBJECTS=${SAMPLE_OBJECTS:-"acc.cu arange.cu clamp.cu"}
CUBLAS_WHEEL=nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl
CUBLAS_SPEC=nvidia-cublas==13.0.2.14
CUBLAS_SHA256=0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c
CMAKE_WHEEL=cmake-4.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
CMAKE_SPEC=cmake==4.4.5
CMAKE_SHA256=85625a9b6d5e88ff99c7eb79123d85570844e77ac076366cf75c609cc0b1b579
HERE=$(cd "$(dirname "$0")" && pwd)
KIT=$(cd "$HERE/../.." && pwd)

log() { echo "cuda-sample: $*" >&2; }
t_start=$(date +%s)
stamp() { echo "TIMING $1 $(( $(date +%s) - $2 ))s"; }

# A wheel from PyPI, verified and cached by its sha256.
wheel() {  # spec file sha256 -> path
  local spec=$1 file=$2 sha=$3 dir="$CACHE/wheels/$3"
  if ! echo "$sha  $dir/$file" | sha256sum --check --status 2>/dev/null; then
    log "downloading $spec"
    mkdir -p "$dir"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary :all: "$spec" -d "$dir.tmp" >&2
    echo "$sha  $dir.tmp/$file" | sha256sum --check --status || { log "sha256 mismatch for $file"; exit 1; }
    mv "$dir.tmp/$file" "$dir/$file"
    rm -rf "$dir.tmp"
  fi
  echo "$dir/$file"
}

[ -x "$CUDA_SRC/bin/nvcc" ] || { log "no CUDA toolkit at $CUDA_SRC"; exit 1; }
nvcc_release=$("$CUDA_SRC/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')

t=$(date +%s)
cublas=$(wheel "$CUBLAS_SPEC" "$CUBLAS_WHEEL" "$CUBLAS_SHA256")
cmake_whl=$(wheel "$CMAKE_SPEC" "$CMAKE_WHEEL" "$CMAKE_SHA256")
stamp downloads "$t"

# cmake 4 from its wheel, unpacked once (no pip install, no venv needed).
t=$(date +%s)
CMAKE_DIR="$CACHE/tools/cmake-$CMAKE_SHA256"
if [ ! -x "$CMAKE_DIR/cmake/data/bin/cmake" ]; then
  rm -rf "$CMAKE_DIR.tmp" && mkdir -p "$CMAKE_DIR.tmp"
  "$PYTHON" -m zipfile -e "$cmake_whl" "$CMAKE_DIR.tmp"
  chmod +x "$CMAKE_DIR.tmp"/cmake/data/bin/*
  rm -rf "$CMAKE_DIR" && mv "$CMAKE_DIR.tmp" "$CMAKE_DIR"
fi
CMAKE="$CMAKE_DIR/cmake/data/bin/cmake"

# The toolkit plus cuBLAS, as one tree (nvcc finds its headers relative to its own location).
CUDA_ROOT="$CACHE/cuda-overlay/$nvcc_release-$CUBLAS_SHA256"
if [ ! -f "$CUDA_ROOT/.complete" ]; then
  log "assembling $CUDA_ROOT"
  rm -rf "$CUDA_ROOT" && mkdir -p "$(dirname "$CUDA_ROOT")"
  cp -a "$CUDA_SRC" "$CUDA_ROOT"
  unpack=$(mktemp -d)
  "$PYTHON" -m zipfile -e "$cublas" "$unpack"
  cp -a "$unpack"/nvidia/cu13/include/. "$CUDA_ROOT/include/"
  cp -a "$unpack"/nvidia/cu13/lib/. "$CUDA_ROOT/lib/"
  rm -rf "$unpack"
  (cd "$CUDA_ROOT/lib" && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
  touch "$CUDA_ROOT/.complete"
fi
stamp tools "$t"

# The source: the fixture repository of the kit's default pin (its main: same tree as upstream 8337e4cd).
t=$(date +%s)
sha=$("$KIT/tests/fixtures/engines/make-ik-repo.sh")
WORK="$CACHE/cuda-sample"
if [ "$(git -C "$WORK/src" rev-parse HEAD 2>/dev/null)" != "$sha" ]; then
  rm -rf "$WORK/src" && mkdir -p "$WORK"
  git clone --quiet "$CACHE/fixtures/ik_llama.cpp.git" "$WORK/src"
  git -C "$WORK/src" checkout --quiet "$sha"
fi
stamp source "$t"

# The role's flag derivation, for the Genoa + RTX 4090 profile of the production inventory.
commit_date=$(git -C "$WORK/src" log -1 --format=%cs HEAD)
mapfile -t ARGS < <("$PYTHON" - "$KIT" "$nvcc_release" "$CUDA_ROOT" "$commit_date" <<'PY'
import importlib.util, sys, yaml
kit, cuda, cuda_home, commit_date = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, kit + "/.collections")  # the filter imports the collection's module_utils, as in the roles
spec = importlib.util.spec_from_file_location("lb", kit + "/plugins/filter/llama_build.py")
lb = importlib.util.module_from_spec(spec); spec.loader.exec_module(lb)
profile = yaml.safe_load(open(kit + "/inventories/production/group_vars/genoa_1gpu/hardware.yml"))["hmk_hardware"]
defaults = yaml.safe_load(open(kit + "/roles/llama_build/defaults/main.yml"))
flags = open("/proc/cpuinfo").read().split("\n\n")[0]
args = lb.cmake_args(profile, flags, "ik_llama.cpp", commit_date,
                     {"cuda": "auto", "cuda_version": cuda, "cuda_home": cuda_home,
                      "rules": defaults["llama_build_cmake_rules"]})
assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=89" in args, args
assert "-DCMAKE_CUDA_COMPILER=%s/bin/nvcc" % cuda_home in args and "-DCUDAToolkit_ROOT=%s" % cuda_home in args, args
print("\n".join(args))
PY
)
log "cmake args from the llama_build filter: ${ARGS[*]}"

t=$(date +%s)
BUILD="$WORK/build-sm89"
rm -rf "$BUILD"
export PATH="$CUDA_ROOT/bin:$PATH" CUDACXX="$CUDA_ROOT/bin/nvcc" CUDAToolkit_ROOT="$CUDA_ROOT"
"$CMAKE" -S "$WORK/src" -B "$BUILD" "${ARGS[@]}" -DGGML_CUDA_NO_VMM=ON -DGGML_CCACHE=OFF \
  > "$BUILD.configure.log" 2>&1 \
  || { tail -n 30 "$BUILD.configure.log"; log "configure failed, log: $BUILD.configure.log"; exit 1; }
grep -q '^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=89$' "$BUILD/CMakeCache.txt"
grep -q '^GGML_CUDA:BOOL=ON$' "$BUILD/CMakeCache.txt"
grep -q "^CMAKE_CUDA_COMPILER:[A-Z]*=$CUDA_ROOT/bin/nvcc\$" "$BUILD/CMakeCache.txt"
stamp configure "$t"

for cu in $SAMPLE_OBJECTS; do
  t=$(date +%s)
  obj="ggml-cuda/$cu.o"
  make -C "$BUILD/ggml/src" "$obj" > "$BUILD.$cu.log" 2>&1 \
    || { tail -n 30 "$BUILD.$cu.log"; log "compile of $cu failed, log: $BUILD.$cu.log"; exit 1; }
  out="$BUILD/ggml/src/CMakeFiles/ggml.dir/ggml-cuda/$cu.o"
  [ -s "$out" ] || { log "missing object $out"; exit 1; }
  grep -q -- '-arch=sm_89\|arch=compute_89\|sm_89' "$BUILD.$cu.log" "$BUILD/ggml/src/CMakeFiles/ggml.dir/flags.make" \
    || { log "$cu was not compiled for sm_89"; exit 1; }
  stamp "compile-$cu" "$t"
done
stamp total "$t_start"
echo "OK: ik_llama.cpp $sha configured with CUDA $nvcc_release for sm_89 and compiled: $SAMPLE_OBJECTS"
