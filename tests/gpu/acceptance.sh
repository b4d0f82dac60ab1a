#!/usr/bin/env bash
# GPU acceptance of hybrid-moe-kit, for any Linux machine with an NVIDIA GPU and a CUDA toolkit, without internet:
# everything else comes from the bundle `make gpu-bundle` stages (scripts/make-gpu-bundle). The engine build takes
# most of the time (over 10 minutes untrimmed on 16 cores; tests/gpu/README.md). Run from a checkout of the
# repository, as root or as a user who may read /dev/nvidia*:
#
#   tests/gpu/acceptance.sh [BUNDLE_DIR] [RESULT_DIR]      (defaults: .cache/gpu-bundle, ./gpu-acceptance)
#
# Steps, each printed as PASS or FAIL with what it saw:
#   bundle    the bundle's files match their SHA256SUMS
#   gpu       nvidia-smi lists the GPUs (name, compute capability, memory, driver, PCI address)
#   pci       lspci (or sysfs when lspci is missing) shows the same NVIDIA devices, link width and speed from sysfs
#   devices   /proc/devices has the driver's names and nvidia-uvm, /dev/nvidia-uvm exists (what the unit's
#             DeviceAllow=char-nvidia* must admit; plugins/module_utils/hmk_nvidia_devices.py)
#   toolkit   nvcc exists and the driver is new enough for it (the nvidia_driver role's table)
#   build     ik_llama.cpp at the kit's pin, CUDA for this GPU's architecture only, the llama_build role's flags
#             plus the smallest kernel set: no FA kernels for other KV quant pairs, and the per-type matrix kernels
#             (MMQ, MMVQ) of the tiny model's types only, the others built as stubs that abort if called
#             (acceptance_helper.py trim-kernels); llama-server and llama-bench
#   serve     the tiny MLA model served with the inference_service role's planned expert placement (all MoE layers
#             but the last on CUDA0, the last in DRAM), /health 200 and a chat completion with tokens
#   proof     the health gate's proof on the engine's real log and nvidia-smi (hmk_engine_log.evaluate)
#   power     validate's GPU power reading: roles/validate/files/hmk-validate-bench around a llama-bench run
# The result: RESULT_DIR/result.json (one object per step), RESULT_DIR/result.txt, and the logs.
# Env: HMK_ACCEPTANCE_WORK (the build tree; default RESULT_DIR/work), HMK_ACCEPTANCE_BUILD_SECONDS (stop the build
# after that long and fail, naming how to resume: for machines lent in calls shorter than the build),
# HMK_ACCEPTANCE_JOBS (default nproc), HMK_ACCEPTANCE_PORT.
# Exit status 0 only when every step passes.
set -uo pipefail

KIT=$(cd "$(dirname "$0")/../.." && pwd)
BUNDLE=$(cd "${1:-$KIT/.cache/gpu-bundle}" 2>/dev/null && pwd) || BUNDLE=${1:-$KIT/.cache/gpu-bundle}
OUT=${2:-$PWD/gpu-acceptance}
PORT=${HMK_ACCEPTANCE_PORT:-18549}
JOBS=${HMK_ACCEPTANCE_JOBS:-$(nproc)}
HELPER="python3 $KIT/tests/gpu/acceptance_helper.py"
mkdir -p "$OUT"
: > "$OUT/result.jsonl"
: > "$OUT/result.txt"
FAILED=0
SERVER_PID=""
T0=$(date +%s)

cleanup() { if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null; fi; }
trap cleanup EXIT

# record STEP PASS|FAIL DETAIL...
record() {
  local step=$1 status=$2; shift 2
  local detail="$*"
  printf '%-8s %s  %s\n' "$step" "$status" "$detail" | tee -a "$OUT/result.txt"
  python3 -c 'import json,sys; print(json.dumps({"step": sys.argv[1], "status": sys.argv[2], "detail": sys.argv[3], "seconds_since_start": int(sys.argv[4])}))' \
    "$step" "$status" "$detail" "$(( $(date +%s) - T0 ))" >> "$OUT/result.jsonl"
  [ "$status" = PASS ] || FAILED=1
}

finish() {
  python3 - "$OUT" "$FAILED" "$(( $(date +%s) - T0 ))" <<'PY'
import json, sys
out, failed, seconds = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
steps = [json.loads(line) for line in open(out + "/result.jsonl") if line.strip()]
json.dump({"result": "FAIL" if failed else "PASS", "seconds": seconds, "steps": steps}, open(out + "/result.json", "w"), indent=1)
PY
  echo "RESULT $([ "$FAILED" = 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - T0 ))s: $OUT/result.json" | tee -a "$OUT/result.txt"
  exit "$FAILED"
}

# ------------------------------------------------------------------------------------------------ bundle
if [ -f "$BUNDLE/SHA256SUMS" ] && (cd "$BUNDLE" && sha256sum --check --status SHA256SUMS); then
  record bundle PASS "$BUNDLE: $(cut -d' ' -f3 "$BUNDLE/SHA256SUMS" | tr '\n' ' ')"
else
  record bundle FAIL "no complete bundle at $BUNDLE: run \`make gpu-bundle\` on a machine with internet and copy .cache/gpu-bundle here"
  finish
fi

# --------------------------------------------------------------------------------------------------- gpu
if ! command -v nvidia-smi >/dev/null 2>&1; then
  record gpu FAIL "nvidia-smi is not installed: this is not a machine with a working NVIDIA driver"
  finish
fi
if ! nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version,pci.bus_id,uuid \
     --format=csv,noheader,nounits > "$OUT/gpus.csv" 2> "$OUT/gpus.err" || [ ! -s "$OUT/gpus.csv" ]; then
  record gpu FAIL "nvidia-smi lists no GPU: $(head -c 300 "$OUT/gpus.err" "$OUT/gpus.csv" 2>/dev/null | tr '\n' ' ')"
  finish
fi
IFS=', ' read -r _ _ _ _ _ _ _ <<< ""
GPU_COUNT=$(grep -c . "$OUT/gpus.csv")
GPU0=$(head -n 1 "$OUT/gpus.csv")
CAP=$(echo "$GPU0" | awk -F', ' '{print $3}')
ARCH=${CAP/./}
VRAM_MIB=$(echo "$GPU0" | awk -F', ' '{print $4}')
DRIVER=$(echo "$GPU0" | awk -F', ' '{print $5}')
BDF=$(echo "$GPU0" | awk -F', ' '{print tolower($6)}' | sed 's/^0000\(....:\)/\1/')
record gpu PASS "$GPU_COUNT GPU(s); GPU0 $(echo "$GPU0" | awk -F', ' '{print $2}'), sm_$ARCH, $VRAM_MIB MiB, driver $DRIVER, $BDF"

# --------------------------------------------------------------------------------------------------- pci
sysfs_bdf=$(for d in /sys/bus/pci/devices/*; do
  [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && case "$(cat "$d/class" 2>/dev/null)" in 0x03*) basename "$d";; esac
done)
sysfs_count=$(echo "$sysfs_bdf" | grep -c .)
lspci_count=-
if command -v lspci >/dev/null 2>&1; then lspci_count=$(lspci -n -d 10de: | awk '$2 ~ /^03/' | grep -c .); fi
link=""
for b in $sysfs_bdf; do
  d=/sys/bus/pci/devices/$b
  link="$link $b x$(cat "$d/current_link_width" 2>/dev/null || echo ?)/x$(cat "$d/max_link_width" 2>/dev/null || echo ?) $({ tr -d ' ' < "$d/current_link_speed"; } 2>/dev/null || echo ?) numa $(cat "$d/numa_node" 2>/dev/null || echo ?);"
done
if [ "$sysfs_count" -ge "$GPU_COUNT" ] && { [ "$lspci_count" = - ] || [ "$lspci_count" -ge "$GPU_COUNT" ]; }; then
  record pci PASS "sysfs $sysfs_count, lspci $lspci_count NVIDIA display device(s):$link"
else
  record pci FAIL "nvidia-smi shows $GPU_COUNT GPU(s) but sysfs $sysfs_count and lspci $lspci_count (in a container without /sys/bus/pci the bus is not visible):$link"
fi

# ----------------------------------------------------------------------------------------------- devices
if [ ! -e /dev/nvidia-uvm ] && [ "$(id -u)" = 0 ] && command -v nvidia-modprobe >/dev/null 2>&1; then
  nvidia-modprobe -u -c=0 || true   # what hmk-nvidia-device-nodes.service does at boot on a kit node
fi
if $HELPER devices > "$OUT/devices.json" 2>&1; then
  record devices PASS "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["naming"], "-", ", ".join(d["names"]))' "$OUT/devices.json")"
else
  record devices FAIL "$(head -c 600 "$OUT/devices.json")"
fi

# ----------------------------------------------------------------------------------------------- toolkit
NVCC=""
for c in $(command -v nvcc 2>/dev/null) $(compgen -G '/usr/local/cuda-*/bin/nvcc' | sort -V -r) /usr/local/cuda/bin/nvcc; do
  [ -x "$c" ] && { NVCC=$c; break; }
done
if [ -z "$NVCC" ]; then
  record toolkit FAIL "no nvcc (PATH, /usr/local/cuda-X.Y/bin): install the CUDA toolkit (nvidia_driver_cuda_toolkit_version); the bundle cannot carry it"
  finish
fi
CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
CUDA_RELEASE=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
if $HELPER toolkit "$CUDA_RELEASE" "$DRIVER" > "$OUT/toolkit.json" 2>&1; then
  record toolkit PASS "CUDA $CUDA_RELEASE at $CUDA_HOME on driver $DRIVER ($(cat "$OUT/toolkit.json"))"
else
  record toolkit FAIL "CUDA $CUDA_RELEASE at $CUDA_HOME on driver $DRIVER: $(cat "$OUT/toolkit.json")"
  finish
fi

# ------------------------------------------------------------------------------------------------- build
t=$(date +%s)
# WORK outlives RESULT_DIR when HMK_ACCEPTANCE_WORK names it: a build cut short by HMK_ACCEPTANCE_BUILD_SECONDS is then
# resumed by running the same command again (configure and the kernel trim are not redone; make carries on).
WORK=${HMK_ACCEPTANCE_WORK:-$OUT/work}
BUILD_SECONDS=${HMK_ACCEPTANCE_BUILD_SECONDS:-0}
STAMP=$(sha256sum "$BUNDLE/SHA256SUMS" | cut -c1-16)
if [ -f "$WORK/.configured-$STAMP" ]; then
  resumed="resumed "
else
  resumed=""
  rm -rf "$WORK" && mkdir -p "$WORK/cmake"
  tar -C "$WORK" -xJf "$BUNDLE/ik_llama.cpp.tar.xz"
fi
CMAKE=""
if command -v cmake >/dev/null 2>&1 && [ "$(printf '%s\n3.28\n' "$(cmake --version | sed -n 's/cmake version \([0-9.]*\).*/\1/p')" | sort -V | head -n 1)" = 3.28 ]; then
  CMAKE=$(command -v cmake)
else
  [ -x "$WORK/cmake/bin/cmake" ] || tar -C "$WORK/cmake" -xJf "$BUNDLE/cmake.tar.xz"
  CMAKE=$WORK/cmake/bin/cmake
fi
if ! $HELPER cmake-args "$BUNDLE" "$ARCH" "$CUDA_RELEASE" > "$OUT/cmake-args.json" 2>&1; then
  record build FAIL "the llama_build role's flags refuse this GPU/toolkit: $(cat "$OUT/cmake-args.json")"
  finish
fi
mapfile -t CMAKE_ARGS < <(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["args"]))' "$OUT/cmake-args.json")
export PATH="$CUDA_HOME/bin:$PATH" CUDACXX="$NVCC"
if [ -z "$resumed" ]; then
  if ! $HELPER trim-kernels "$WORK/ik_llama.cpp" "$BUNDLE" > "$WORK/trim.json" 2>&1; then
    record build FAIL "the kernel trim failed: $(head -c 800 "$WORK/trim.json")"
    finish
  fi
  if ! "$CMAKE" -S "$WORK/ik_llama.cpp" -B "$WORK/build" "${CMAKE_ARGS[@]}" -DCMAKE_CUDA_COMPILER="$NVCC" \
       > "$WORK/configure.log" 2>&1; then
    record build FAIL "configure: $(tail -n 15 "$WORK/configure.log" | tr '\n' ' ' | tail -c 1200)"
    finish
  fi
  touch "$WORK/.configured-$STAMP"
fi
cp "$WORK/trim.json" "$WORK/configure.log" "$OUT/" 2>/dev/null
TRIM=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%d MMQ/MMVQ instance files for types the model lacks built as aborting stubs, compiled in full: %s" % (d["stubbed"], " ".join(d["compiled"])))' "$WORK/trim.json")
LIMIT=()
[ "$BUILD_SECONDS" -gt 0 ] && LIMIT=(timeout "$BUILD_SECONDS")
"${LIMIT[@]}" "$CMAKE" --build "$WORK/build" --config Release -j "$JOBS" --target llama-server llama-bench > "$OUT/build.log" 2>&1
rc=$?
if [ "$rc" = 124 ]; then
  record build FAIL "${resumed}build not finished in HMK_ACCEPTANCE_BUILD_SECONDS=$BUILD_SECONDS ($(grep -o '^\[ *[0-9]*%\]' "$OUT/build.log" | tail -n 1)): run the same command again to resume it in $WORK"
  finish
elif [ "$rc" = 0 ] && "$WORK/build/bin/llama-server" --version > "$OUT/version.txt" 2>&1; then
  record build PASS "${resumed}$(tr '\n' ' ' < "$OUT/version.txt" | head -c 200) in $(( $(date +%s) - t ))s with $JOBS jobs, cmake $("$CMAKE" --version | head -n 1 | awk '{print $3}'), ${CMAKE_ARGS[*]}; $TRIM"
else
  record build FAIL "${resumed}after $(( $(date +%s) - t ))s: $(tail -n 15 "$OUT/build.log" | tr '\n' ' ' | tail -c 1200)"
  finish
fi

# ------------------------------------------------------------------------------------------------- serve
MODEL=$BUNDLE/tiny-deepseek2.gguf
if ! $HELPER plan "$BUNDLE" "$MODEL" "$VRAM_MIB" "$PORT" "$OUT/plan.json" > "$OUT/plan-summary.json" 2>&1; then
  record serve FAIL "no placement plan: $(cat "$OUT/plan-summary.json")"
  finish
fi
mapfile -t ARGV < <(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["argv"]))' "$OUT/plan.json")
# The unit's environment on a GPU node: CUDA numbers GPUs in PCI order, as nvidia-smi does.
CUDA_DEVICE_ORDER=PCI_BUS_ID "$WORK/build/bin/llama-server" "${ARGV[@]}" > "$OUT/engine.log" 2>&1 &
SERVER_PID=$!
health=""
for _ in $(seq 120); do
  health=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" || true)
  [ "$health" = 200 ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 1
done
reply=$(curl -s -m 120 "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}' || true)
tokens=$(echo "$reply" | python3 -c 'import json,sys
try: print(json.load(sys.stdin)["usage"]["completion_tokens"])
except Exception: print(0)')
if [ "$health" = 200 ] && [ "${tokens:-0}" -gt 0 ]; then
  record serve PASS "/health 200, $tokens token(s); $(python3 -c 'import json,sys; print(" | ".join(json.load(open(sys.argv[1]))["summary"]))' "$OUT/plan-summary.json"); -ot $(python3 -c 'import json,sys; print(" -ot ".join(json.load(open(sys.argv[1]))["rules"]))' "$OUT/plan-summary.json")"
else
  record serve FAIL "/health $health, completion: $(echo "$reply" | head -c 300); engine log tail: $(tail -n 8 "$OUT/engine.log" | tr '\n' ' ')"
fi

# ------------------------------------------------------------------------------------------------- proof
nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits > "$OUT/smi-gpus.csv" 2>&1
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits > "$OUT/smi-apps.csv" 2>&1
if $HELPER proof "$OUT/plan.json" "$OUT/engine.log" "$OUT/smi-gpus.csv" "$OUT/smi-apps.csv" "$SERVER_PID" > "$OUT/proof.json" 2>&1; then
  record proof PASS "$(python3 -c 'import json,sys; print("; ".join(c["detail"] for c in json.load(open(sys.argv[1]))["checks"] if c["status"] == "pass"))' "$OUT/proof.json")"
else
  record proof FAIL "$(python3 -c 'import json,sys; print(" | ".join(json.load(open(sys.argv[1]))["summary"]))' "$OUT/proof.json" 2>/dev/null || head -c 800 "$OUT/proof.json")"
fi
cleanup
SERVER_PID=""

# ------------------------------------------------------------------------------------------------- power
mapfile -t OT < <(python3 -c 'import json,sys; [print(x) for r in json.load(open(sys.argv[1]))["override_tensor"] for x in ("-ot", r)]' "$OUT/plan.json")
python3 "$KIT/roles/validate/files/hmk-validate-bench" --gpu-power --interval-ms 100 -- \
  "$WORK/build/bin/llama-bench" -m "$MODEL" -ngl 99 "${OT[@]}" -p 128 -n 128 -r 3 -o json > "$OUT/bench.json" 2> "$OUT/bench.err"
if $HELPER power "$OUT/bench.json" > "$OUT/power.json" 2>&1; then
  record power PASS "$(cat "$OUT/power.json")"
else
  record power FAIL "$(head -c 800 "$OUT/power.json") $(head -c 300 "$OUT/bench.err")"
fi

finish
