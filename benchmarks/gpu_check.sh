#!/usr/bin/env bash
# GPU check: builds the project against the LibTorch inside the machine's
# PyTorch (a CUDA build), runs the NCCL collective tests at world size 1 and
# at every GPU count above 1, the wine experiment on cuda, and the DDP step
# against a plain step (ddp-bench train-step --device cuda); prints a table
# at the end and writes it, with every log, to $OUT (or runs/gpu-check/).
#
# The GPU machines have no package access: the header-only dependencies come
# from Debian packages unpacked beforehand into .deps/ (an ignored folder) by
# scripts/fetch_header_deps.sh, and travel with the working tree. With the
# device tool: run `bash benchmarks/gpu_check.sh` with carry [".deps"].
#
# GPU_CHECK_DEVICE=cpu runs the same steps on the CPU with gloo, against the
# LibTorch that CMake finds (or DDP_TORCH_PREFIX): a rehearsal of this script
# on a machine without a GPU. It proves the script, not the GPU code.
#
# Exit status: 0 when every step passed, 1 otherwise (the table says which).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
logs=${OUT:-$root/runs/gpu-check}
mkdir -p "$logs"
device=${GPU_CHECK_DEVICE:-cuda}
python=${DDP_PYTHON:-python3}
build=${GPU_CHECK_BUILD_DIR:-$root/build-gpu}
results=()
failed=0
record() {  # record STEP RESULT: one line of the final table
  results+=("$(printf '%-48s %s' "$1" "$2")")
  echo "== $1: $2"
  case $2 in FAILED* | SKIPPED*) failed=1 ;; esac
}
summary() {
  {
    echo
    echo "GPU check summary ($(date -u '+%Y-%m-%d %H:%M UTC'), device $device)"
    printf '%s\n' "${results[@]}"
  } | tee "$logs/summary.txt"
}
finish() { summary; exit "$failed"; }
run_step() {  # run_step SECONDS LOG COMMAND...: the command's status; its output in $logs/LOG
  local limit=$1 log=$2
  shift 2
  timeout -k 10 "$limit" "$@" >"$logs/$log" 2>&1
}

# ---- environment -------------------------------------------------------------
if ! torch_info=$("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.utils.cmake_prefix_path)' 2>&1); then
  record "PyTorch" "FAILED: $python cannot import torch: $(echo "$torch_info" | tail -1)"
  finish
fi
read -r torch_version torch_cuda gpus torch_prefix <<<"$torch_info"
torch_prefix=${DDP_TORCH_PREFIX:-$torch_prefix}
record "PyTorch" "$torch_version (CUDA $torch_cuda), $gpus GPU(s)"
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -8 | tee "$logs/gpus.txt"
  if [ "$gpus" -lt 1 ]; then
    record "GPUs" "FAILED: torch sees no CUDA device (GPU_CHECK_DEVICE=cpu rehearses this script without one)"
    finish
  fi
  backend=nccl
  max_world=$gpus  # NCCL allows one rank per GPU
else
  backend=gloo
  max_world=2
fi

# ---- build ---------------------------------------------------------------------
deps="$root/.deps/usr"
if [ ! -d "$deps" ]; then
  record "build" "FAILED: no .deps/; run scripts/fetch_header_deps.sh where Debian's archive is reachable, then carry .deps"
  finish
fi
start=$(date +%s)
cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$torch_prefix;$deps")
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
# File by file: the first build against LibTorch 2.x headers names each
# failing file alone, and 16 cores need no unity batches.
cmake_args+=(-DDDP_UNITY_BUILD=OFF)
# The GPU build has NCCL alone (as a GPU-only user's would); the rehearsal
# needs gloo.
if [ "$device" = cuda ]; then cmake_args+=(-DDDP_WITH_GLOO=OFF -DDDP_WITH_NCCL=ON); fi
run_step 600 build.log cmake "${cmake_args[@]}" &&
  timeout -k 10 900 cmake --build "$build" -j "$(nproc)" --target ddp_tests ddp-run ddp-bench >>"$logs/build.log" 2>&1
build_rc=$?
grep -E '✓|✗|c10d-gloo|^-- LibTorch ' "$logs/build.log"
if [ $build_rc != 0 ]; then
  grep -m5 -E 'error|Error' "$logs/build.log"
  tail -20 "$logs/build.log"
  record "build (targets ddp_tests, ddp-run, ddp-bench)" "FAILED after $(($(date +%s) - start)) s; see build.log"
  finish
fi
record "build (targets ddp_tests, ddp-run, ddp-bench)" "ok in $(($(date +%s) - start)) s"
tests=$build/tests/ddp_tests
ddp_run=$build/ddp-run
bench=$build/benchmarks/ddp-bench

# ---- collectives -----------------------------------------------------------------
# The [nccl] test cases run every collective x dtype x count against closed
# forms at world sizes 1..GPUs (ranks as threads, one GPU each): CPU tensors
# staged through the device, and tensors already on the device; then
# alltoall (equal and uneven splits), gather, scatter and, from 2 GPUs,
# send/recv around a ring (ncclSend/ncclRecv in group calls).
if [ "$device" = cuda ]; then
  run_step 600 nccl-tests.log "$tests" "[nccl]"
  rc=$?
  last=$(grep -E 'test cases|All tests passed' "$logs/nccl-tests.log" | tail -1)
  if [ $rc != 0 ]; then
    record "nccl collectives, world 1..$gpus (tests [nccl])" "FAILED (exit $rc): $last"
  elif grep -q "SKIPPED" "$logs/nccl-tests.log"; then
    record "nccl collectives, world 1..$gpus (tests [nccl])" "SKIPPED on a GPU machine: $(grep -m1 -A1 SKIPPED "$logs/nccl-tests.log" | tr '\n' ' ')"
  else
    record "nccl collectives, world 1..$gpus (tests [nccl])" "passed: $last"
  fi
else
  run_step 600 collective-tests.log "$tests" "gloo collectives match closed forms - 2*"
  record "gloo collectives (rehearsal)" "$([ $? = 0 ] && echo passed || echo FAILED)"
fi
# The same across processes, started by the launcher.
for ((n = 2; n <= max_world; n++)); do
  run_step 300 "demo-$n.log" "$ddp_run" --nproc-per-node "$n" --demo --demo-backend "$backend"
  record "$backend demo, $n processes (ddp-run --demo)" "$([ $? = 0 ] && echo passed || echo "FAILED; see demo-$n.log")"
done

# ---- wine ------------------------------------------------------------------------
wine_result() {  # the last line of a run's log: its final metrics
  grep -v '^\s*$' "$logs/$1" | tail -1 | cut -c1-120
}
run_step 300 wine.log "$ddp_run" "$root/experiments/wine_baseline.json" --set "distributed.device=$device" \
  --set "distributed.backend=$backend" --out "$logs/wine-run"
if [ $? = 0 ]; then record "wine on $device, 1 rank" "$(wine_result wine.log)"; else record "wine on $device, 1 rank" "FAILED; see wine.log"; fi
if [ "$max_world" -ge 2 ]; then
  run_step 300 wine-ddp.log "$ddp_run" --nproc-per-node 2 "$root/experiments/wine_ddp.json" \
    --set "distributed.device=$device" --set "distributed.backend=$backend" --out "$logs/wine-ddp-run"
  if [ $? = 0 ]; then record "wine_ddp on $device, 2 ranks" "$(wine_result wine-ddp.log)"; else record "wine_ddp on $device, 2 ranks" "FAILED; see wine-ddp.log"; fi
fi

# ---- DDP step against a plain step -------------------------------------------------
worlds=1
for ((n = 2; n <= max_world && n <= 8; n++)); do worlds+=",$n"; done
run_step 420 train-step.log "$bench" train-step --device "$device" --backend "$backend" --world-sizes "$worlds" \
  --repeats 3 --json "$logs/train-step.json"
if [ $? = 0 ]; then
  sed -n '/^impl/,$p' "$logs/train-step.log"
  ratio=$("$python" - "$logs/train-step.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
step = {(r["impl"], r["world_size"]): r["step_ms"] for r in records}
plain, wrapped = step[("ddp", 1)], step[("ddp-w1-wrapped", 1)]
line = f"{wrapped:.2f} / {plain:.2f} ms = {wrapped / plain:.3f}x (goal <= 1.05)"
if ("torch-ddp", 1) in step:
    line += f"; torch-ddp w1 {step[('torch-ddp', 1)]:.2f} ms"
print(line)
PY
  )
  record "DDP step / plain step, world 1 (MLP 2.9M)" "${ratio:-FAILED: no records in train-step.json}"
  grep -E '^(ratio|scaling|ceiling)' "$logs/train-step.log" | while read -r line; do echo "   $line"; done
  results+=("$(grep -E '^(ratio|scaling|ceiling)' "$logs/train-step.log" | sed 's/^/   /')")
else
  tail -5 "$logs/train-step.log"
  record "DDP step / plain step, world 1 (MLP 2.9M)" "FAILED; see train-step.log"
fi
finish
