#!/bin/bash
# A full disk while a run writes its metrics, or a checkpoint: one line
# naming the file and "No space left on device", a non-zero exit code, and
# whole records in what was written (no torn line, no temporary file). The
# run folder is a tiny tmpfs in a private mount namespace.
# Usage: full_disk_test.sh DDP_RUN
set -u
ddp_run=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
exp=$src/experiments/wine_baseline.json
if ! unshare -m true 2>/dev/null; then
  echo "SKIPPED: unshare -m is not permitted here (needs root or user namespaces)"
  exit 0
fi
work=$(mktemp -d /tmp/ddp-fulldisk-XXXXXX)
trap 'rm -rf "$work"' EXIT

unshare -m bash -s "$ddp_run" "$exp" "$work" <<'INNER'
set -u
ddp_run=$1 exp=$2 work=$3
mkdir -p "$work/disk"
fail() { echo "FAIL: $*"; exit 1; }
check_records() {  # every line of metrics.jsonl and steps.jsonl is JSON, every CSV line has the header's fields
  python3 - "$1" <<'PY' || fail "torn records in $1"
import json, sys
lines = open(sys.argv[1] + "/metrics.jsonl").read().split("\n")
assert lines[-1] == "", "no newline at the end"
epochs = [json.loads(l)["epoch"] for l in lines[:-1]]
assert epochs == list(range(1, len(epochs) + 1)), epochs[-3:]
csv = open(sys.argv[1] + "/metrics.csv").read().split("\n")
fields = csv[0].count(",")
assert csv[-1] == "" and all(l.count(",") == fields for l in csv[:-1]), (csv[0], csv[-2:])
import os
steps = sys.argv[1] + "/steps.jsonl"
if os.path.exists(steps):
    lines = open(steps).read().split("\n")
    assert lines[-1] == "", "steps.jsonl: no newline at the end"
    [json.loads(l) for l in lines[:-1]]
print(f"{len(epochs)} whole records")
PY
}

# Metrics fill the disk.
mount -t tmpfs -o size=64k tmpfs "$work/disk" || { echo "SKIPPED: cannot mount a tmpfs"; exit 0; }
out=$("$ddp_run" "$exp" --set training.epochs=5000 --set training.save_every=0 --set training.eval_every=5000 \
      --out "$work/disk/run" 2>&1 >/dev/null)
rc=$?
[ "$rc" -ne 0 ] || fail "metrics: exit code 0 on a full disk"
echo "$out" | grep -qE "^ddp-run: cannot write $work/disk/run/(metrics\.jsonl|metrics\.csv|steps\.jsonl|train\.log): No space left on device$" ||
  fail "metrics: said: $out"
check_records "$work/disk/run"
umount "$work/disk"

# A checkpoint does not fit: room for the run folder's six small files (a 4 KiB page each), not for the checkpoint.
mount -t tmpfs -o size=28k tmpfs "$work/disk" || fail "cannot mount a tmpfs again"
out=$("$ddp_run" "$exp" --set training.epochs=2 --set training.save_every=1 --out "$work/disk/run" 2>&1 >/dev/null)
rc=$?
[ "$rc" -ne 0 ] || fail "checkpoint: exit code 0 on a full disk"
[ "$out" = "ddp-run: checkpoint: cannot write $work/disk/run/checkpoints/epoch_000001.pt: No space left on device" ] ||
  fail "checkpoint: said: $out"
[ -z "$(ls -A "$work/disk/run/checkpoints")" ] || fail "checkpoint: left $(ls "$work/disk/run/checkpoints")"
check_records "$work/disk/run"
umount "$work/disk"
echo "PASS: both full disks named, records whole"
INNER
