#!/bin/bash
# training.checkpoint_on_signal on two ranks: SIGTERM to both ranks
# mid-training leaves a checkpoint of the step they stopped after and exit
# code 143; --resume continues from it to the end, one record per epoch.
# Usage: signal_test.sh DDP_RUN
set -u
ddp_run=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
exp=$src/experiments/wine_ddp.json
work=$(mktemp -d /tmp/ddp-signal-XXXXXX)
launcher=
cleanup() {
  [ -n "$launcher" ] && kill -KILL -- "$launcher" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- first run:"; cat "$work/first.log"; exit 1; }
records() { if [ -f "$work/run/metrics.jsonl" ]; then wc -l <"$work/run/metrics.jsonl"; else echo 0; fi; }

sets="--set training.checkpoint_on_signal=true --set training.save_every=0 --set training.eval_every=1000"
"$ddp_run" --nproc-per-node 2 "$exp" $sets --set training.epochs=100000 --out "$work/run" >"$work/first.log" 2>&1 &
launcher=$!
for _ in $(seq 300); do
  [ "$(records)" -ge 3 ] && break
  sleep 0.1
done
[ "$(records)" -ge 3 ] || fail "no metrics after 30 s"
ranks=$(ps -o pid= --ppid "$launcher")
[ "$(echo $ranks | wc -w)" -eq 2 ] || fail "expected 2 ranks under the launcher, found: $ranks"
kill -TERM $ranks
wait "$launcher"
rc=$?
launcher=
[ "$rc" -eq 143 ] || fail "launcher exit code $rc, expected 143"
grep -q "^signal 15: saved $work/run/checkpoints/epoch_[0-9_batch]*\.pt (step [0-9]*, " "$work/run/train.log" ||
  fail "no 'signal 15: saved' line in train.log: $(tail -3 "$work/run/train.log")"
ls "$work/run/checkpoints/"epoch_*.pt >/dev/null 2>&1 || fail "no checkpoint written"

last=$(tail -1 "$work/run/metrics.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["epoch"])')
target=$((last + 2))
"$ddp_run" --nproc-per-node 2 "$exp" $sets --set training.epochs=$target --resume --out "$work/run" >"$work/second.log" 2>&1 ||
  { cat "$work/second.log"; fail "resume failed"; }
grep -q "resumed from $work/run/checkpoints/epoch_" "$work/second.log" || { cat "$work/second.log"; fail "did not resume"; }
python3 - "$work/run/metrics.jsonl" "$target" <<'PY' || fail "metrics after resume"
import json, sys
epochs = [json.loads(line)["epoch"] for line in open(sys.argv[1])]
want = list(range(1, int(sys.argv[2]) + 1))
if epochs != want:
    sys.exit(f"epochs {epochs[-5:]} (of {len(epochs)}), expected 1..{sys.argv[2]}")
PY
echo "PASS: stopped with 143 after epoch $last, resumed to epoch $target"
