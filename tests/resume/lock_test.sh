#!/bin/bash
# Two ddp-run on one run folder: the second (one rank or two) is refused
# with one line naming the owner, exit code 2, while the first trains on.
# Usage: lock_test.sh DDP_RUN
set -u
ddp_run=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
exp=$src/experiments/wine_baseline.json
work=$(mktemp -d /tmp/ddp-lock-XXXXXX)
first=
cleanup() {
  [ -n "$first" ] && kill -KILL "$first" 2>/dev/null && wait "$first" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$ddp_run" "$exp" --set training.epochs=100000 --set training.save_every=0 --out "$work/run" >"$work/first.log" 2>&1 &
first=$!
for _ in $(seq 300); do
  [ -s "$work/run/metrics.jsonl" ] && break
  sleep 0.1
done
[ -s "$work/run/metrics.jsonl" ] || fail "the first run wrote no metrics in 30 s: $(cat "$work/first.log")"
want="run folder $work/run is in use by pid $first (host $(hostname)). HINT: wait for that job to end, or use another --out"
for ranks in "" "--nproc-per-node 2"; do
  out=$("$ddp_run" $ranks "$exp" --set training.epochs=100000 --resume --out "$work/run" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "second run ($ranks) exit code $rc, expected 2: $out"
  echo "$out" | grep -qxF "$want" || fail "second run ($ranks) said: $out"
done
kill -0 "$first" 2>/dev/null || fail "the first run stopped"
echo "PASS: the second run was refused while the first trained"
