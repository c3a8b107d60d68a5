#!/usr/bin/env bash
# training.trace: trace.json in the run folder, valid, one process per rank
# with compute and communication tracks, spans for each traced step, and
# (digits_cnn at 2 ranks, several buckets) a bucket's collective that starts
# before backward ends. DDP_TRACE=1 turns it on without the config; a run
# that ends before trace_start writes none and says so.
set -euo pipefail
ddp_run=$1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$repo"

echo "== digits_cnn, 2 ranks, small buckets: overlap visible"
"$ddp_run" experiments/digits_cnn.json --nproc-per-node 2 --out "$work/cnn" --set training.trace=true \
  --set training.trace_start=2 --set training.trace_steps=3 --set training.max_steps=6 \
  --set distributed.bucket_cap_mb=0.005 --set distributed.first_bucket_cap_mb=0.002 > "$work/cnn.out" 2>&1 ||
  { cat "$work/cnn.out"; exit 1; }
grep -q "trace: steps 2-4 of 2 rank(s)" "$work/cnn/train.log" || { echo "FAIL: no trace line in train.log"; exit 1; }
$python "$here/check_trace.py" "$work/cnn/trace.json" 2 2 4 --overlap

echo "== wine, 2 ranks, DDP_TRACE=1 without the config key"
DDP_TRACE=1 "$ddp_run" experiments/wine_ddp.json --nproc-per-node 2 --out "$work/wine" \
  --set training.epochs=2 > "$work/wine.out" 2>&1 || { cat "$work/wine.out"; exit 1; }
$python "$here/check_trace.py" "$work/wine/trace.json" 2 2 4

echo "== DDP_TRACE=1 on one of two nodes: every rank traces (the ranks agree)"
port=$($python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
common=(experiments/wine_ddp.json --nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port"
  --set training.epochs=2 --set distributed.timeout_s=60)
DDP_TRACE=1 timeout -k 5 120 "$ddp_run" "${common[@]}" --node-rank 0 --out "$work/node0" > "$work/node0.out" 2>&1 &
node0=$!
timeout -k 5 120 "$ddp_run" "${common[@]}" --node-rank 1 --out "$work/node1" > "$work/node1.out" 2>&1 ||
  { cat "$work/node1.out"; echo "FAIL: node 1 (no DDP_TRACE)"; exit 1; }
wait "$node0" || { cat "$work/node0.out"; echo "FAIL: node 0 (DDP_TRACE=1)"; exit 1; }
$python "$here/check_trace.py" "$work/node0/trace.json" 2 2 4

echo "== wine, 1 rank: compute only"
"$ddp_run" experiments/wine_baseline.json --out "$work/one" --set training.trace=true --set training.trace_start=5 \
  --set training.trace_steps=2 --set training.epochs=2 > "$work/one.out" 2>&1 || { cat "$work/one.out"; exit 1; }
$python "$here/check_trace.py" "$work/one/trace.json" 1 5 6

echo "== a run that ends before trace_start writes no trace, and says so"
"$ddp_run" experiments/wine_baseline.json --out "$work/short" --set training.trace=true \
  --set training.trace_start=1000 --set training.epochs=1 > "$work/short.out" 2>&1 || { cat "$work/short.out"; exit 1; }
[ ! -e "$work/short/trace.json" ] || { echo "FAIL: trace.json written though the run ended before trace_start"; exit 1; }
grep -q "trace: none written, the run ended at step" "$work/short/train.log" || { echo "FAIL: no line saying why"; exit 1; }

echo "== the checker fails on a trace without overlap (it can fail)"
$python - "$work/cnn/trace.json" "$work/bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["traceEvents"]:
    if e.get("name") == "bucket allreduce":
        e["ts"] += 1e6
json.dump(d, open(sys.argv[2], "w"))
PY
if $python "$here/check_trace.py" "$work/bad.json" 2 2 4 --overlap > "$work/bad.out"; then
  echo "FAIL: the checker accepted buckets that start after backward"; exit 1
fi
grep -q "no bucket's collective started before" "$work/bad.out"
echo "PASS"
