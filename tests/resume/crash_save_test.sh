#!/bin/bash
# kill -9 in the middle of a sharded save leaves the previous checkpoint
# whole: a rank killed once its shard is on disk, rank 0 killed with the
# index written but not yet renamed, and the same under async saving. Each
# crashed job exits non-zero; the half-written save has no index.json, so
# it is no checkpoint; --resume continues from the previous save and ends
# with the same losses as a run that never crashed.
# Usage: crash_save_test.sh DDP_RUN
set -u
ddp_run=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/ddp-crashsave-XXXXXX)
trap 'rm -rf "$work"' EXIT
unset DDP_FAULT_SAVE DDP_FAULT_INJECT
fail() { echo "FAILED: $*"; exit 1; }
common=(--nproc-per-node 2 "$src/experiments/wine_baseline.json" --set distributed.strategy=fsdp
        --set training.epochs=4 --set training.save_every=1 --set training.checkpoint_format=sharded)
# The losses of every epoch, as metrics.jsonl records them (times dropped).
losses() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["epoch"], *(f"{k}={v}" for k, v in sorted(r.items()) if k.endswith("loss") or k.endswith("accuracy")))
PY
}

"$ddp_run" "${common[@]}" --out "$work/whole" > "$work/whole.log" 2>&1 || { tail -20 "$work/whole.log"; fail "the unbroken run failed"; }
want=$(losses "$work/whole")
[ "$(grep -c loss <<< "$want")" -eq 4 ] || fail "the unbroken run recorded no losses of 4 epochs: $want"

# CASE: NAME FAULT EXTRA...: the run crashes at FAULT (DDP_FAULT_SAVE) in
# its second save, then resumes.
crash_case() {
  local name=$1 fault=$2
  shift 2
  local out="$work/$name" rc=0
  DDP_FAULT_SAVE=$fault timeout -k 5 120 "$ddp_run" "${common[@]}" "$@" --out "$out" > "$work/$name.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { tail -20 "$work/$name.log"; fail "$name: the crashed run exited $rc"; }
  grep -q "DDP_FAULT_SAVE: rank .* killed at the" "$work/$name.log" || { tail -20 "$work/$name.log"; fail "$name: the fault did not fire"; }
  [ -f "$out/checkpoints/epoch_000001.shards/index.json" ] || { ls -R "$out"; fail "$name: the first save lost its index"; }
  [ ! -e "$out/checkpoints/epoch_000002.shards/index.json" ] || fail "$name: the crashed save has an index.json"
  [ ! -e "$out/checkpoints/epoch_000003.shards" ] || fail "$name: a save after the crash exists"
  "$ddp_run" "${common[@]}" "$@" --out "$out" --resume > "$work/$name.resume.log" 2>&1 ||
    { tail -20 "$work/$name.resume.log"; fail "$name: --resume after the crash failed"; }
  grep -qi "epoch_000001.shards" "$work/$name.resume.log" ||
    { tail -20 "$work/$name.resume.log"; fail "$name: the resume did not name the first save"; }
  [ -f "$out/checkpoints/epoch_000004.shards/index.json" ] || fail "$name: no whole last save after the resume"
  got=$(losses "$out")
  [ "$got" = "$want" ] || { diff <(echo "$want") <(echo "$got"); fail "$name: losses differ from the unbroken run"; }
  echo "ok: $name: crashed (exit $rc), resumed from epoch 1's save, same losses as the unbroken run"
}

crash_case shard-rank1 1:2:shard
crash_case index-rank0 0:2:index
crash_case async-index-rank0 0:2:index --set training.async_checkpoint=true
crash_case async-shard-rank0 0:2:shard --set training.async_checkpoint=true
echo PASSED
