#!/usr/bin/env bash
# scripts/ddp-plot draws every kind of picture from quick real runs: curves
# of wine on 1 and 2 ranks (accuracy) and of a tiny char_gpt (perplexity),
# and the JSON of ddp-bench collectives, train-step and strategies; `auto`
# must call the same drawing with the same inputs for each kind, and draw
# the same picture byte for byte (collectives).
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
quiet train-step "$ddp_bench" train-step --world-sizes 1,2 --steps 2 --warmup 1 --repeats 1 --no-reference \
  --json train-step.json --plot bench_train_step.png
quiet strategies "$ddp_bench" strategies --widths 32,64,10 --steps 2 --warmup 1 --json strategies.json
echo "inputs ready after $((SECONDS - start)) s"

# Pictures and errors: ddp-plot's main() called in one Python process, each
# call with its own stdout and stderr, so matplotlib is imported once rather
# than forty times. The command line itself (the script, its exit status
# and streams) is checked after this, on a picture, an error and --help.
cat > wine.json <<'JSON'
[{"impl": "ddp", "seconds": 0.0171, "total_seconds": 0.41, "final_train_loss": 0.0118, "test_loss": 0.0428,
  "test_accuracy": 0.9722},
 {"impl": "torch", "seconds": 0.0868, "total_seconds": 1.93, "final_train_loss": 0.0118, "test_loss": 0.0429,
  "test_accuracy": 0.9722}]
JSON
# ddp-bench wine and lm records, as those commands write them (their runs
# take minutes with the PyTorch references: the keys are what matters).
cat > lm.json <<'JSON'
[{"impl": "ddp", "seed": 0, "world_size": 2, "steps": 8, "val_loss": 2.31, "seconds": 31.5},
 {"impl": "torch", "seed": 0, "world_size": 2, "steps": 8, "val_loss": 2.33, "seconds": 44.2},
 {"impl": "ddp", "seed": 1, "world_size": 2, "steps": 8, "val_loss": 2.29, "seconds": 30.9},
 {"impl": "torch", "seed": 1, "world_size": 2, "steps": 8, "val_loss": 2.30, "seconds": 43.8}]
JSON
mkdir -p empty_run not_a_run
: >empty_run/metrics.jsonl
echo '{"op": ' >malformed.json
echo '[{"impl": "ddp", "seconds": 1.5}]' >unknown.json
echo '[]' >empty.json
echo '{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0}]}' > empty_trace.json
"$python" - "$plot" <<'PY'
import contextlib, glob, importlib.machinery, importlib.util, io, os, sys

loader = importlib.machinery.SourceFileLoader("ddp_plot", sys.argv[1])
ddp_plot = importlib.util.module_from_spec(importlib.util.spec_from_loader("ddp_plot", loader))
loader.exec_module(ddp_plot)


def fail(message):
    sys.stderr.write(f"FAILED: {message}\n")
    sys.exit(1)


def call(argv):
    """ddp-plot ARGV: (exit status, stdout, stderr), as the command line would give them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = ddp_plot.main(argv)
        except SystemExit as e:
            status = e.code
    return status or 0, out.getvalue(), err.getvalue()


def draw(name, *args):  # each must succeed, quietly
    status, out, err = call(list(args) + ["-o", f"{name}.png"])
    if status != 0:
        fail(f"ddp-plot {' '.join(args)} exited with {status}: {err}")
    if out or err:
        fail(f"ddp-plot {' '.join(args)} printed: {out}{err}")


draw("curves", "curves", "runs/wine1", "runs/wine2")
draw("curves_loss", "curves", "runs/wine1", "--metric", "loss", "--no-steps")
draw("curves_gpt", "curves", "runs/gpt")
draw("curves_gpt_accuracy", "curves", "runs/gpt", "--metric", "accuracy")
draw("collectives", "collectives", "collectives.json")
draw("train_step", "train-step", "train-step.json")
draw("strategies", "strategies", "strategies.json")
draw("trace", "trace", "runs/wine2/trace.json")
draw("wine", "wine", "wine.json")
draw("lm", "lm", "lm.json")
# auto, drawn once for real (byte for byte the picture of its kind, below);
# for every other input, which drawing auto calls and with what, without
# drawing again (each picture costs a second of matplotlib).
draw("auto_collectives", "auto", "collectives.json")


def auto_calls(*inputs):
    calls = []
    originals = {name: getattr(ddp_plot, name) for name in dir(ddp_plot) if name.startswith("plot_")
                 and name != "plot_auto"}
    bench = dict(ddp_plot.BENCH_PLOTS)
    recorder = lambda name: lambda *args, **kwargs: calls.append((name, args, kwargs))
    try:
        for name in originals:
            setattr(ddp_plot, name, recorder(name))
        for kind, function in bench.items():
            ddp_plot.BENCH_PLOTS[kind] = recorder(function.__name__)
        status, out, err = call(["auto", *inputs, "-o", "auto.png"])
    finally:
        for name, function in originals.items():
            setattr(ddp_plot, name, function)
        ddp_plot.BENCH_PLOTS.update(bench)
    if status != 0 or out or err:
        fail(f"ddp-plot auto {' '.join(inputs)}: exit {status}: {out}{err}")
    return calls


for inputs, drawing, args in [
        (("runs/wine1", "runs/wine2"), "plot_curves", (["runs/wine1", "runs/wine2"], "auto.png", "auto")),
        (("train-step.json",), "plot_train_step", ("train-step.json", "auto.png")),
        (("strategies.json",), "plot_strategies", ("strategies.json", "auto.png")),
        (("runs/wine2/trace.json",), "plot_trace", ("runs/wine2/trace.json", "auto.png")),
        (("wine.json",), "plot_wine", ("wine.json", "auto.png")),
        (("lm.json",), "plot_lm", ("lm.json", "auto.png")),
        (("runs/wine1/metrics.jsonl",), "plot_curves", (["runs/wine1"], "auto.png", "auto"))]:
    calls = auto_calls(*inputs)
    if [(c[0], tuple(c[1])) for c in calls] != [(drawing, args)]:
        fail(f"ddp-plot auto {' '.join(inputs)} called {calls}, not {drawing}{args}")


def same(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


# auto must pick the same picture, byte for byte.
if not same("collectives.png", "auto_collectives.png"):
    fail("auto drew another picture than collectives")
# ddp-bench --plot draws what ddp-plot draws from the same records.
if not same("bench_collectives.png", "collectives.png"):
    fail("collectives --plot drew another picture than ddp-plot")
if not same("bench_train_step.png", "train_step.png"):
    fail("train-step --plot drew another picture than ddp-plot")
if same("curves_gpt.png", "curves_gpt_accuracy.png"):
    fail("--metric accuracy drew the perplexity panel")

# Every PNG: the signature, loads with matplotlib, not blank.
import matplotlib
matplotlib.use("Agg")
import matplotlib.image
import numpy as np

for path in sorted(glob.glob("*.png")):
    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            fail(f"{path}: not a PNG signature")
    image = matplotlib.image.imread(path)
    if not (image.ndim == 3 and image.shape[0] >= 300 and image.shape[1] >= 400):
        fail(f"{path}: shape {image.shape}")
    pixels = image[:, :, :3].reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    drawn = len(pixels) - int(counts.max())  # pixels not of the background colour
    if not (float(pixels.std()) > 0 and len(colours) > 10 and drawn >= 2000):
        fail(f"{path}: nearly blank ({len(colours)} colours, {drawn} drawn)")
    print(f"{path}: {image.shape[1]}x{image.shape[0]}, {len(colours)} colours, {drawn} drawn pixels")


def expect_error(what, *args, out="err.png", names=None):
    """Exit status 2, one line "ddp-plot: ..." on stderr, nothing on stdout, no file."""
    if os.path.exists("err.png"):
        os.remove("err.png")
    status, stdout, stderr = call(list(args) + ["-o", out])
    if status != 2:
        fail(f"{what}: exit status {status}, expected 2 (stderr: {stderr})")
    if stderr.count("\n") != 1 or not stderr.endswith("\n"):
        fail(f"{what}: stderr is not one line: {stderr}")
    if not stderr.startswith("ddp-plot: "):
        fail(f"{what}: stderr does not start with 'ddp-plot: ': {stderr}")
    if stdout:
        fail(f"{what}: wrote to stdout: {stdout}")
    if os.path.exists("err.png"):
        fail(f"{what}: wrote err.png")
    if names and names not in stderr:
        fail(f"{what}: {names} is not named: {stderr}")
    print(f"{what}: {stderr.strip()}")


expect_error("missing json", "collectives", "missing.json", names="missing.json")
expect_error("missing json (auto)", "auto", "missing.json")
expect_error("missing run folder", "curves", "missing_run")
expect_error("malformed json", "auto", "malformed.json", names="malformed.json:")
expect_error("unknown kind", "auto", "unknown.json")
expect_error("empty records", "train-step", "empty.json")
expect_error("no metrics.jsonl", "curves", "not_a_run")
expect_error("no epochs", "curves", "empty_run")
expect_error("wrong kind", "strategies", "collectives.json")
expect_error("a trace without spans", "trace", "empty_trace.json")
expect_error("not a trace", "trace", "collectives.json")
expect_error("absent metric", "curves", "runs/wine1", "--metric", "perplexity")
expect_error("bad usage", "curves")
expect_error("unwritable output", "collectives", "collectives.json", out="no/such/folder/x.png")

# --help: every command explained.
status, text, _ = call(["--help"])
for command in ("curves", "collectives", "train-step", "strategies", "wine", "lm", "trace", "auto"):
    if not any(line.lstrip().startswith(command) for line in text.splitlines()):
        fail(f"--help does not list {command}")
status, text, _ = call(["curves", "--help"])
if "--metric" not in text:
    fail("ddp-plot curves --help does not explain --metric")
PY

# The command line: a picture, the same as main() drew; an error's exit
# status and single stderr line; bad usage; --help.
rc=0
"$plot" curves runs/wine1 runs/wine2 -o cli_curves.png >cli.out 2>cli.err || rc=$?
[ "$rc" -eq 0 ] || fail "ddp-plot curves exited with $rc: $(cat cli.err)"
[ ! -s cli.out ] && [ ! -s cli.err ] || fail "ddp-plot curves printed: $(cat cli.out cli.err)"
cmp -s cli_curves.png curves.png || fail "the command line drew another picture than main()"
rc=0
"$plot" auto malformed.json -o err.png >cli.out 2>cli.err || rc=$?
[ "$rc" -eq 2 ] || fail "ddp-plot auto malformed.json: exit status $rc, expected 2"
[ "$(wc -l <cli.err)" -eq 1 ] && grep -q '^ddp-plot: malformed.json:' cli.err ||
  fail "ddp-plot auto malformed.json: stderr: $(cat cli.err)"
[ ! -s cli.out ] && [ ! -e err.png ] || fail "ddp-plot auto malformed.json wrote something"
rc=0
"$plot" curves >cli.out 2>cli.err || rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <cli.err)" -eq 1 ] || fail "ddp-plot curves (bad usage): exit $rc, stderr: $(cat cli.err)"
"$plot" --help | grep -q "^ *curves" || fail "ddp-plot --help does not list curves"
echo "PASSED in $((SECONDS - start)) s"
