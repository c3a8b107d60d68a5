#!/usr/bin/env bash
# scripts/ddp-plot draws every kind of picture from quick real runs: curves
# of wine on 1 and 2 ranks (accuracy) and of a tiny char_gpt (perplexity),
# and the JSON of ddp-bench collectives, train-step and strategies, each
# also through `auto` (which must pick the same picture, byte for byte).
# Each PNG must load and not be blank. Errors (a missing file, malformed
# JSON, an unknown kind, no data, bad usage) must be one line
# "ddp-plot: ..." on stderr, exit status 2, and no file written.
#
# Usage: plot_test.sh DDP_RUN DDP_BENCH
# Exits 77 (skipped) without python3-matplotlib.
set -euo pipefail
ddp_run=$(realpath "${1:?usage: $0 DDP_RUN DDP_BENCH}")
ddp_bench=$(realpath "${2:?usage: $0 DDP_RUN DDP_BENCH}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
plot=$repo/scripts/ddp-plot
python=/usr/bin/python3

if ! "$python" -c 'import matplotlib, numpy' 2>/dev/null; then
  echo "SKIP: python3-matplotlib missing"
  exit 77
fi
[ -x "$plot" ] || { echo "FAILED: $plot is not executable" >&2; exit 1; }

work=$(mktemp -d /tmp/ddp-plot-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAILED: $*" >&2; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN
export DDP_REFERENCE_WATCHDOG_S=60
start=$SECONDS

quiet() {  # quiet NAME CMD...: CMD's output in NAME.log, shown if it fails
  local name=$1 rc=0
  shift
  timeout -k 5 120 "$@" >"$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { sed 's/^/  | /' "$name.log"; fail "$* exited with $rc"; }
}

# Inputs: run folders and benchmark records, as small as they come.
quiet wine1 "$ddp_run" "$repo/experiments/wine_ddp.json" --nproc-per-node 1 --set training.epochs=12 \
  --set training.eval_every=3 --set training.save_every=0 --out runs/wine1
quiet wine2 "$ddp_run" "$repo/experiments/wine_ddp.json" --nproc-per-node 2 --set training.epochs=12 \
  --set training.eval_every=3 --set training.save_every=0 --set training.trace=true --out runs/wine2
quiet gpt "$ddp_run" "$repo/experiments/char_gpt.json" --nproc-per-node 1 --set training.epochs=3 \
  --set training.eval_every=1 --set training.save_every=0 --set dataset.max_bytes=8000 \
  --set model.n_layer=1 --out runs/gpt
quiet collectives "$ddp_bench" collectives --min-bytes 4K --max-bytes 16K --warmup 1 --iters 2 --json collectives.json \
  --plot bench_collectives.png
# train-step without PyTorch's DDP (seconds more); strategies with its
# PyTorch records where python3-torch is installed (torch-* lack some keys).
quiet train-step "$ddp_bench" train-step --world-sizes 1,2 --steps 2 --warmup 1 --repeats 2 --no-reference \
  --json train-step.json --plot bench_train_step.png
quiet strategies "$ddp_bench" strategies --widths 32,64,10 --steps 2 --warmup 1 --json strategies.json
echo "inputs ready after $((SECONDS - start)) s"

# Pictures: each command must succeed, quietly, and `auto` must draw the same.
draw() {  # draw NAME ARGS...: ddp-plot ARGS -o NAME.png
  local name=$1 rc=0
  shift
  "$plot" "$@" -o "$name.png" >"$name.out" 2>"$name.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "ddp-plot $* exited with $rc: $(cat "$name.err")"
  [ ! -s "$name.out" ] && [ ! -s "$name.err" ] || fail "ddp-plot $* printed: $(cat "$name.out" "$name.err")"
}
draw curves curves runs/wine1 runs/wine2
draw curves_loss curves runs/wine1 --metric loss --no-steps
draw curves_gpt curves runs/gpt
draw curves_gpt_accuracy curves runs/gpt --metric accuracy
draw collectives collectives collectives.json
draw train_step train-step train-step.json
draw strategies strategies strategies.json
draw auto_curves auto runs/wine1 runs/wine2
draw auto_collectives auto collectives.json
draw auto_train_step auto train-step.json
draw auto_strategies auto strategies.json
# ddp-bench wine and lm records, as those commands write them (their runs
# take minutes with the PyTorch references: the keys are what matters).
cat > wine.json <<'JSON'
[{"impl": "ddp", "seconds": 0.0171, "total_seconds": 0.41, "final_train_loss": 0.0118, "test_loss": 0.0428,
  "test_accuracy": 0.9722},
 {"impl": "torch", "seconds": 0.0868, "total_seconds": 1.93, "final_train_loss": 0.0118, "test_loss": 0.0429,
  "test_accuracy": 0.9722}]
JSON
cat > lm.json <<'JSON'
[{"impl": "ddp", "seed": 0, "world_size": 2, "steps": 8, "val_loss": 2.31, "seconds": 31.5},
 {"impl": "torch", "seed": 0, "world_size": 2, "steps": 8, "val_loss": 2.33, "seconds": 44.2},
 {"impl": "ddp", "seed": 1, "world_size": 2, "steps": 8, "val_loss": 2.29, "seconds": 30.9},
 {"impl": "torch", "seed": 1, "world_size": 2, "steps": 8, "val_loss": 2.30, "seconds": 43.8}]
JSON
draw trace trace runs/wine2/trace.json
draw auto_trace auto runs/wine2/trace.json
draw wine wine wine.json
draw lm lm lm.json
draw auto_wine auto wine.json
draw auto_lm auto lm.json
for kind in curves collectives train_step strategies wine lm trace; do
  cmp -s "$kind.png" "auto_$kind.png" || fail "auto drew another picture than $kind"
done
# ddp-bench --plot draws what ddp-plot draws from the same records.
cmp -s bench_collectives.png collectives.png || fail "collectives --plot drew another picture than ddp-plot"
cmp -s bench_train_step.png train_step.png || fail "train-step --plot drew another picture than ddp-plot"
cmp -s curves_gpt.png curves_gpt_accuracy.png && fail "--metric accuracy drew the perplexity panel"

# Every PNG: the signature, loads with matplotlib, not blank.
"$python" - ./*.png <<'PY'
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.image
import numpy as np

for path in sys.argv[1:]:
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG signature"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 300 and image.shape[1] >= 400, f"{path}: shape {image.shape}"
    pixels = image[:, :, :3].reshape(-1, 3)
    assert float(pixels.std()) > 0, f"{path}: one colour only"
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    drawn = len(pixels) - int(counts.max())  # pixels not of the background colour
    assert len(colours) > 10 and drawn >= 2000, f"{path}: nearly blank ({len(colours)} colours, {drawn} drawn)"
    print(f"{path}: {image.shape[1]}x{image.shape[0]}, {len(colours)} colours, {drawn} drawn pixels")
PY

# Errors: exit status 2, one line "ddp-plot: ..." on stderr, nothing else.
expect_error() {  # expect_error WHAT ARGS...: ddp-plot ARGS -o ${OUT:-err.png} must fail
  local what=$1 out=${OUT:-err.png} rc=0
  shift
  rm -f err.png
  "$plot" "$@" -o "$out" >err.out 2>err.err || rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit status $rc, expected 2 (stderr: $(cat err.err))"
  [ "$(wc -l <err.err)" -eq 1 ] || fail "$what: stderr is not one line: $(cat err.err)"
  grep -q '^ddp-plot: ' err.err || fail "$what: stderr does not start with 'ddp-plot: ': $(cat err.err)"
  [ ! -s err.out ] || fail "$what: wrote to stdout: $(cat err.out)"
  [ ! -e err.png ] || fail "$what: wrote err.png"
  echo "$what: $(cat err.err)"
}
mkdir -p empty_run not_a_run
: >empty_run/metrics.jsonl
echo '{"op": ' >malformed.json
echo '[{"impl": "ddp", "seconds": 1.5}]' >unknown.json
echo '[]' >empty.json
expect_error "missing json" collectives missing.json
grep -q 'missing.json' err.err || fail "the missing file is not named: $(cat err.err)"
expect_error "missing json (auto)" auto missing.json
expect_error "missing run folder" curves missing_run
expect_error "malformed json" auto malformed.json
grep -q 'malformed.json:' err.err || fail "the malformed file is not named: $(cat err.err)"
expect_error "unknown kind" auto unknown.json
expect_error "empty records" train-step empty.json
expect_error "no metrics.jsonl" curves not_a_run
expect_error "no epochs" curves empty_run
expect_error "wrong kind" strategies collectives.json
echo '{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0}]}' > empty_trace.json
expect_error "a trace without spans" trace empty_trace.json
expect_error "not a trace" trace collectives.json
expect_error "absent metric" curves runs/wine1 --metric perplexity
expect_error "bad usage" curves
OUT=no/such/folder/x.png expect_error "unwritable output" collectives collectives.json

# --help: every command explained.
"$plot" --help >help.txt
for command in curves collectives train-step strategies wine lm trace auto; do
  grep -q "^ *$command" help.txt || fail "--help does not list $command"
done
"$plot" curves --help | grep -q -- "--metric" || fail "ddp-plot curves --help does not explain --metric"
echo "PASSED in $((SECONDS - start)) s"
