#!/usr/bin/env bash
# Keeps ddp-bench from rotting: every subcommand runs briefly, with --verify
# where it has one, and what it writes is checked. Timings are not judged
# here (targets live in the benchmark's own output, not in tests).
#
#   smoke_test.sh path/to/ddp-bench [PART]
# PART: collectives, train-step, wine-lm, strategies or errors (default: all
# of them); ctest runs each part as a test of its own (bench.smoke.PART), so
# that each stays short and they run side by side.
set -euo pipefail
bench=$(realpath "${1:?usage: $0 path/to/ddp-bench [PART]}")
part=${2:-all}
case "$part" in all | collectives | train-step | wine-lm | strategies | errors) ;;
  *) echo "smoke_test.sh: unknown part \"$part\" (collectives, train-step, wine-lm, strategies, errors or all)" >&2; exit 2 ;;
esac
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN
# A PyTorch reference that hangs prints its stacks and exits (rendezvous.py)
# before the run's own timeout below kills it without a word.
export DDP_REFERENCE_WATCHDOG_S=150

run() {  # run NAME ARGS...: ddp-bench ARGS, log in $out/NAME.log, must succeed
  local name=$1 rc=0 started=$SECONDS
  shift
  timeout -k 5 240 "$bench" "$@" >"$out/$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { sed 's/^/  | /' "$out/$name.log"; fail "ddp-bench $* exited with $rc"; }
  echo "ran $name in $((SECONDS - started)) s"
}

if want collectives; then
# Collectives: every CPU implementation, small sizes, results checked.
run collectives collectives --min-bytes 4K --max-bytes 64K --warmup 1 --iters 2 --verify --json "$out/collectives.json"
python3 - "$out/collectives.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
ops = {r["op"] for r in records}
impls = {r["impl"] for r in records}
assert ops == {"allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall", "gather", "scatter",
               "sendrecv"}, ops
assert "gloo" in impls, impls
sizes = {r["bytes"] for r in records}
assert sizes == {4096, 16384, 65536}, sizes
for r in records:
    assert not r["supported"] or r["time_us"] > 0, r
    # nccl-tests' columns, and the dtype
    assert r["dtype"] == "float32" and r["count"] * 4 == r["bytes"], r
    assert r["redop"] == ("sum" if r["op"] in ("allreduce", "reduce_scatter") else "none"), r
    assert r["root"] == (0 if r["op"] in ("broadcast", "gather", "scatter") else -1), r
    assert r["wrong"] == (0 if r["supported"] else None), r
assert all(r["supported"] for r in records if r["impl"] == "gloo"), "gloo lacks a collective"
print("collectives:", sorted(impls), len(records), "records")
PY
grep -q "^# gloo .*Avg bus bandwidth    : [0-9.]* GB/s" "$out/collectives.log" || fail "no Avg bus bandwidth line for gloo"

# tcp-wire, the bare sockets' ceiling, only when named: it moves every
# operation's bytes; allgather and broadcast are verified, the reductions
# (no arithmetic) are not; every other implementation gets a ratio to it.
run wire collectives --impls tcp-wire,gloo-tcp --min-bytes 4K --max-bytes 256K --warmup 1 --iters 2 --verify \
  --json "$out/wire.json"
python3 - "$out/wire.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
wire = [r for r in records if r["impl"] == "tcp-wire"]
assert len(wire) == 8 * 4, wire  # 8 ops x 4 sizes
for r in wire:
    assert r["supported"] and r["time_us"] > 0, r
    assert r["wrong"] == (None if r["op"] in ("allreduce", "reduce_scatter") else 0), r
PY
grep -q "^ratio gloo-tcp/tcp-wire allreduce 262144 bytes: busbw [0-9.]*x" "$out/wire.log" || fail "no ratio to tcp-wire"
grep -q "^ratio tcp-wire/" "$out/wire.log" && fail "tcp-wire compared with itself"

# alltoall and sendrecv against both references: one target line per point
# of ours from 64 KiB (met or MISSED: timings are reported, not judged).
if grep -q "skipping c10d-gloo" "$out/collectives.log"; then
  echo "SKIPPED targets: $(grep -m1 'skipping c10d-gloo' "$out/collectives.log")"
else
  run targets collectives --ops alltoall,sendrecv --impls gloo,c10d-gloo,tcp-wire --min-bytes 64K --max-bytes 256K \
    --warmup 1 --iters 2 --verify
  [ "$(grep -c "^target gloo \(alltoall\|sendrecv\) [0-9]* bytes: busbw [0-9.]* GB/s, needs [0-9.]*: \(met\|MISSED\)$" \
    "$out/targets.log")" -eq 4 ] || { cat "$out/targets.log"; fail "no target line per point"; }
  grep -q "^# targets met at [0-9]* of 4 points$" "$out/targets.log" || fail "no targets summary"
fi

fi

if want train-step; then
# Train step: 1 and 2 ranks, two repeats each, the machine's ceiling included.
run train-step train-step --steps 2 --warmup 1 --repeats 2 --no-reference --json "$out/train-step.json"
grep -q "^ceiling: 2 independent ranks" "$out/train-step.log" || fail "train-step printed no ceiling line"
python3 - "$out/train-step.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
got = {(r["impl"], r["world_size"]) for r in records}
want = {("ddp", 1), ("ddp-w1-wrapped", 1), ("ddp", 2), ("independent", 2)}
assert got == want, got
for r in records:
    assert r["params"] == 2892298 and r["batch_per_rank"] == 64, r
    assert len(r["step_ms_repeats"]) == 2 and r["step_ms"] in r["step_ms_repeats"], r
    # Step time is the mean of the ranks' medians and throughput their sum;
    # "independent" ranks never synchronise, so their medians may differ.
    ranks = r["rank_step_ms"]
    assert len(ranks) == r["world_size"] and min(ranks) > 0, r
    assert abs(r["step_ms"] - sum(ranks) / len(ranks)) < 1e-6 * r["step_ms"], r
    assert abs(r["samples_per_s"] - sum(1000 * 64 / m for m in ranks)) < 1e-6 * r["samples_per_s"], r
print("train-step:", sorted(got))
PY

# Train step of the experiments' models (digits_cnn.json, char_gpt.json),
# built through the plugin registry: 2 ranks, every rank's parameters
# checked equal to rank 0's after the steps (the run fails otherwise). The
# cnn also runs PyTorch's DDP on models_torch.Cnn where python3-torch is
# installed (a few seconds); the gpt's reference is left to the benchmark.
run train-step-cnn train-step --model cnn --world-sizes 2 --steps 2 --warmup 1 --repeats 1 --json "$out/cnn.json"
run train-step-gpt train-step --model gpt --world-sizes 2 --steps 2 --warmup 1 --repeats 1 --no-reference \
  --json "$out/gpt.json"
python3 - "$out/cnn.json" "$out/gpt.json" "$(dirname "$0")/../../experiments" <<'PY'
import json, sys
experiments = {"cnn": "digits_cnn.json", "gpt": "char_gpt.json"}
for path, model in zip(sys.argv[1:3], ["cnn", "gpt"]):
    batch = json.load(open(sys.argv[3] + "/" + experiments[model]))["training"]["batch_size"]
    records = json.load(open(path))
    ours = {r["impl"]: r for r in records if r["impl"] != "torch-ddp"}
    assert set(ours) == {"ddp", "independent"}, (model, ours.keys())
    for r in records:
        assert r["model"] == model and r["world_size"] == 2 and r["batch_per_rank"] == batch, r
        assert r["step_ms"] > 0 and r["params"] == ours["ddp"]["params"], r
    assert ours["ddp"]["max_param_diff"] == 0, ours["ddp"]
    if model == "cnn":
        # conv 1->16 (no bias, batch norm) and 16->32, hidden 128->64, head 64->10
        assert ours["ddp"]["params"] == 144 + 32 + 4608 + 64 + 128 * 64 + 64 + 64 * 10 + 10, ours["ddp"]
        torch = [r for r in records if r["impl"] == "torch-ddp"]
        assert len(torch) <= 1 and all(r["max_param_diff"] == 0 for r in torch), torch
    print(f"train-step --model {model}:", sorted(r["impl"] for r in records))
PY

# regress with PyTorch's side (docs.commands runs README's line with
# --no-reference): the mlp at one step, every ratio compared against the
# recorded baseline; at this size the ratios are noise, so none is called
# slower.
run regress regress --models mlp --steps 1 --warmup 0 --repeats 1 --min-tolerance 1000 --json "$out/regress.json"
torch=torch  # regress says when it found no PyTorch to run
grep -q "^# no PyTorch reference" "$out/regress.log" && torch=none
python3 - "$out/regress.json" "$torch" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))
names = {r["ratio"] for r in results}
want = {"independent w2/w1"} | ({"ddp/torch-ddp w1", "ddp/torch-ddp w2"} if sys.argv[2] == "torch" else set())
assert names == want, (names, want)
for r in results:
    assert r["model"] == "mlp" and r["now"] > 0 and r["baseline"] > 0 and r["verdict"] == "ok", r
print("regress:", sorted(names))
PY

# --set changes the model's experiment: a 1-layer gpt has fewer parameters.
run train-step-gpt1 train-step --model gpt --set model.n_layer=1 --world-sizes 1 --steps 1 --warmup 0 --repeats 1 \
  --no-reference --json "$out/gpt1.json"
python3 - "$out/gpt.json" "$out/gpt1.json" <<'PY'
import json, sys
four = json.load(open(sys.argv[1]))[0]["params"]
one = [r for r in json.load(open(sys.argv[2])) if r["impl"] == "ddp"][0]["params"]
# A block of width 128: two LayerNorms (2 x 256), attention (128 x 384 + 384, 128 x 128 + 128), MLP (128 x 512 +
# 512, 512 x 128 + 128): 198,272 parameters each.
assert four - one == 3 * 198272, (four, one)
print("train-step --set model.n_layer=1:", one, "parameters, 4 layers:", four)
PY

fi

if want wine-lm; then
# Wine: ours (and PyTorch's, where python3-torch is installed) train to the
# baseline's quality.
run wine wine --repeats 1 --json "$out/wine.json"
python3 - "$out/wine.json" <<'PY'
import json, sys
records = {r["impl"]: r for r in json.load(open(sys.argv[1]))}
assert "ddp" in records, records.keys()
for impl, r in records.items():
    assert r["test_accuracy"] >= 0.94 and r["final_train_loss"] < 0.05 and r["seconds"] > 0, r
print("wine:", sorted(records))
PY

# Language model: a tiny gpt for 2 steps per seed, ours and PyTorch's (where
# python3-torch is installed), one row per side and seed.
if [ -r /usr/share/games/fortunes/computers ]; then
  run lm lm --seeds 0,1 --set training.max_steps=2 --set dataset.max_bytes=20000 --set model.n_layer=1 \
    --set model.n_embd=32 --set model.n_head=2 --json "$out/lm.json"
  grep -q "^skipping torch-python" "$out/lm.log" || grep -q "^mean val loss over 2 seed(s)" "$out/lm.log" ||
    fail "lm printed no comparison line"
  python3 - "$out/lm.json" <<'PY'
import json, math, sys
records = json.load(open(sys.argv[1]))
ours = [r for r in records if r["impl"] == "ddp"]
assert sorted(r["seed"] for r in ours) == [0, 1], records
for r in records:
    assert math.isfinite(r["val_loss"]) and r["val_loss"] > 0 and r["seconds"] > 0, r
    assert r["impl"] == "ddp" or r["steps"] == 2, r
print("lm:", sorted({r["impl"] for r in records}), len(records), "records")
PY
else
  echo "SKIPPED lm: /usr/share/games/fortunes/computers is absent (scripts/setup.sh installs fortunes)"
fi

fi

if want strategies; then
# Strategies on a small MLP, with PyTorch's DDP and ZeRO where installed:
# every strategy (and PyTorch) ends with ddp's parameters, zero1 holds half
# of ddp's Adam state at 2 ranks, fsdp half of the parameters as well.
run strategies strategies --widths 64,128,32 --steps 2 --warmup 1 --json "$out/strategies.json"
python3 - "$out/strategies.json" <<'PY'
import json, sys
records = {r["impl"]: r for r in json.load(open(sys.argv[1]))}
assert {"ddp", "zero1", "zero2", "fsdp"} <= set(records), records.keys()
params = 64 * 128 + 128 + 128 * 32 + 32
for name, r in records.items():
    assert r["params"] == params and r["world_size"] == 2 and r["step_ms"] > 0, r
    assert r["peak_rss_bytes"] > r["param_bytes"] > 0, r
    assert abs(r["param_sum"] - records["ddp"]["param_sum"]) <= 1e-4 * abs(records["ddp"]["param_sum"]), r
ddp, zero1 = records["ddp"], records["zero1"]
assert ddp["optimizer_bytes"] == 2 * 4 * params, ddp
assert zero1["optimizer_bytes"] == 2 * 4 * ((params + 1) // 2), zero1
zero2 = records["zero2"]  # one bucket at this size: the same shard, and only the shard of the gradients
assert zero2["optimizer_bytes"] == zero1["optimizer_bytes"], zero2
assert zero2["grad_bytes"] == 4 * ((params + 1) // 2), zero2
# fsdp: each layer a unit of its own bucket (weight and bias), padded to
# 2 ranks; between steps only its shard of the parameters is held.
fsdp = records["fsdp"]
shard = sum((n + 1) // 2 for n in (64 * 128 + 128, 128 * 32 + 32))
assert fsdp["param_bytes"] == 4 * shard and fsdp["grad_bytes"] == 4 * shard, fsdp
assert fsdp["optimizer_bytes"] == 2 * 4 * shard, fsdp
print("strategies:", sorted(records))
PY
grep -q "as measured" "$out/strategies.log" || fail "strategies printed no formula check"
! grep -q "DIFFERS" "$out/strategies.log" || fail "strategies: a formula differs from the measurement"
# The same on the built-in gpt (blocks as fsdp's units, the tied
# embedding whole): every strategy, and PyTorch's DDP and ZeRO on
# models_torch.Gpt, match ddp, and fsdp's formula is checked against the
# units the model names.
run strategies-gpt strategies --model gpt --gpt-layers 2 --gpt-width 64 --gpt-block 8 --batch 2 --steps 1 \
  --warmup 1 --json "$out/strategies-gpt.json"
python3 - "$out/strategies-gpt.json" <<'PY'
import json, sys
records = {r["impl"]: r for r in json.load(open(sys.argv[1]))}
assert {"ddp", "zero1", "zero2", "fsdp"} <= set(records), records.keys()
ddp, fsdp = records["ddp"], records["fsdp"]
# PyTorch's DDP on models_torch.Gpt (where python3-torch is installed)
# starts from our weights and batches: it must end where ddp ends.
for name, r in records.items():
    assert name.startswith("torch-") or r["model"] == "gpt", r
    assert "param_sum" not in r or abs(r["param_sum"] - ddp["param_sum"]) <= 1e-4 * abs(ddp["param_sum"]), r
assert max(fsdp["units"]) == 1 and -1 in fsdp["units"], fsdp["units"]
# half of everything, plus the root whole: wte [96, 64], wpe [8, 64], ln_f
assert fsdp["param_bytes"] <= ddp["param_bytes"] / 2 + 4 * (96 * 64 + 8 * 64 + 2 * 64) + 64, fsdp
print("strategies --model gpt:", sorted(records))
PY
[ "$(grep -c "as measured" "$out/strategies-gpt.log")" -eq 4 ] || { cat "$out/strategies-gpt.log"; fail "strategies --model gpt: formulas"; }
run strategies-plan strategies --plan
[ "$(grep -cE '^(ddp|zero1|zero2|fsdp) +(8|64|512) ' "$out/strategies-plan.log")" -eq 12 ] ||
  { cat "$out/strategies-plan.log"; fail "strategies --plan: expected 12 rows"; }
expect_strategy_error() {
  local rc=0
  timeout 60 "$bench" strategies --strategies ddp,zero9 >"$out/error.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && grep -qF 'unknown strategy "zero9"' "$out/error.log" || { cat "$out/error.log"; fail "strategies --strategies zero9"; }
}
expect_strategy_error

fi

if want errors; then
# Bad input: one clear line and a non-zero exit, before any rank starts.
expect_error() {  # expect_error TEXT ARGS...
  local text=$1 rc=0
  shift
  timeout 60 "$bench" "$@" >"$out/error.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "ddp-bench $* succeeded; expected an error"
  grep -qF -- "$text" "$out/error.log" || { cat "$out/error.log"; fail "ddp-bench $*: no '$text' in the error"; }
  ! grep -q "^running" "$out/error.log" || fail "ddp-bench $* started ranks before rejecting its input"
}
expect_error '--device must be "cpu" or "cuda", got "tpu"' train-step --device tpu
expect_error "--repeats must be at least 1" train-step --repeats 0
expect_error "--set changes the experiment of --model cnn or gpt" train-step --set model.n_layer=2
expect_error "model.n_layr: unknown key" train-step --model gpt --set model.n_layr=2
expect_error "--widths: every width must be at least 1, got 0" strategies --widths 8,0,8
expect_error "--lr: expected a learning rate > 0, got -1" strategies --lr -1
expect_error "--plan-ranks: every world size must be at least 1, got 0" strategies --plan --plan-ranks 0
expect_error "--json /nonexistent-ddp-dir/x.json: the folder /nonexistent-ddp-dir does not exist" \
  collectives --world-size 2 --max-bytes 4K --json /nonexistent-ddp-dir/x.json
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "--device cuda needs a CUDA build of LibTorch and a GPU; found 0 devices" train-step --device cuda
fi
fi
echo "ddp-bench smoke test passed ($part)"
