#!/usr/bin/env bash
# PyTorch's torchrun as the launcher of ddp-run's ranks, in the store modes
# it hands its workers, against ddp-run's own launcher:
#   1. --rdzv_backend static with --master_addr/--master_port: torchrun's
#      agent serves a c10d store (TORCHELASTIC_USE_AGENT_STORE=True) that
#      every rank joins as a client;
#   2. --rdzv_backend c10d --rdzv_endpoint: rank 0 serves ddp's store;
#   3. --max_restarts 1 with a rank killed at epoch 2: the restarted ranks
#      (TORCHELASTIC_RESTART_COUNT=1) resume from the newest checkpoint and
#      end where an uninterrupted run ends;
#   4. a rank's failure reaches torchrun's summary through
#      TORCHELASTIC_ERROR_FILE (5: as JSON, whatever the bytes);
#   6. --min-ranks on one node is refused at start, with the reason (the
#      agent stops every worker of its node when one fails);
#   7. --min-ranks on two nodes (two agents, c10d rendezvous): node 1's
#      worker killed, node 0's trains on in place (issue 42).
# (--standalone is tested in ddp_tests, "torchrun --standalone ...".)
# Debian's torch 1.13 needs --redirects 1 --tee 1 (an enum bug in torchrun).
set -euo pipefail
ddp_run=$(realpath "$1")
python=/usr/bin/python3
if ! $python -c "import torch.distributed.run" 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 cannot import torch.distributed.run (python3-torch is not installed)"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# torchrun makes a torchelastic_* folder per run under TMPDIR: here, in $work.
export TMPDIR="$work"
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK DDP_STORE_TOKEN DDP_FAULT_INJECT
experiment=("$repo/experiments/wine_ddp.json" --set training.epochs=4 --set training.save_every=1)
fail() { echo "FAIL: $*"; exit 1; }
free_port() { $python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# The last epoch's record without times and memory, which differ run to run.
last_record() {
  $python - "$1/metrics.jsonl" <<'PY'
import json, sys
rec = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print({k: v for k, v in rec.items() if k in ("epoch", "train_loss", "test_loss", "test_accuracy")})
PY
}
torchrun() { timeout -k 5 240 $python -m torch.distributed.run --nproc_per_node 2 --no_python --redirects 1 --tee 1 "$@"; }

echo "== ddp-run's own launcher: the reference"
"$ddp_run" --nproc-per-node 2 "${experiment[@]}" --out "$work/own" > "$work/own.out" 2>&1 || { cat "$work/own.out"; fail "reference run"; }
reference=$(last_record "$work/own")
echo "reference: $reference"

echo "== 1. static rendezvous: the ranks join torchrun's agent store"
port=$(free_port)
DDP_LOG_LEVEL=info torchrun --nnodes 1 --node_rank 0 --rdzv_backend static --master_addr 127.0.0.1 \
  --master_port "$port" "$ddp_run" "${experiment[@]}" --out "$work/static" > "$work/static.out" 2>&1 ||
  { cat "$work/static.out"; fail "torchrun --rdzv_backend static"; }
grep -q "joined torchrun's agent store at 127.0.0.1:$port" "$work/static.out" ||
  { cat "$work/static.out"; fail "the ranks did not say they joined the agent's store"; }
[ "$(last_record "$work/static")" = "$reference" ] || fail "static: $(last_record "$work/static") != $reference"

echo "== 2. c10d rendezvous: rank 0 serves ddp's store"
port=$(free_port)
torchrun --nnodes 1 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" --rdzv_id job2 \
  "$ddp_run" "${experiment[@]}" --out "$work/c10d" > "$work/c10d.out" 2>&1 ||
  { cat "$work/c10d.out"; fail "torchrun --rdzv_backend c10d"; }
[ "$(last_record "$work/c10d")" = "$reference" ] || fail "c10d: $(last_record "$work/c10d") != $reference"

echo "== 3. --max_restarts 1: a rank killed at epoch 2, the restart resumes"
port=$(free_port)
DDP_FAULT_INJECT=1:2 torchrun --nnodes 1 --node_rank 0 --rdzv_backend static --master_addr 127.0.0.1 \
  --master_port "$port" --max_restarts 1 "$ddp_run" "${experiment[@]}" --out "$work/restart" \
  > "$work/restart.out" 2>&1 || { cat "$work/restart.out"; fail "torchrun --max_restarts 1"; }
grep -q "resum" "$work/restart/train.log" || { cat "$work/restart/train.log"; fail "the restart did not resume"; }
[ "$(last_record "$work/restart")" = "$reference" ] || fail "restart: $(last_record "$work/restart") != $reference"

echo "== 4. a failure reaches torchrun's summary through TORCHELASTIC_ERROR_FILE"
port=$(free_port)
rc=0
torchrun --nnodes 1 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" "$ddp_run" "${experiment[@]}" \
  --set model.layers=[10,8,3] --out "$work/bad" > "$work/bad.out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a bad model did not fail under torchrun"
grep -q "traceback : model.layers: first width 10 does not match the dataset's 13 features" "$work/bad.out" ||
  { cat "$work/bad.out"; fail "torchrun's summary does not show the rank's error"; }
echo "== 5. the error file is whole JSON even when the error holds bytes that are not UTF-8"
bad=$'no_such_caf\xe9.json'
rc=0
(cd "$work" && TORCHELASTIC_ERROR_FILE="$work/error.json" "$ddp_run" "$bad" > "$work/utf8.out" 2>&1) || rc=$?
[ "$rc" -eq 2 ] || { cat "$work/utf8.out"; fail "a missing experiment file gave exit $rc"; }
$python -c 'import json, sys; m = json.load(open(sys.argv[1]))["message"]; assert "no_such_caf" in m["message"], m' \
  "$work/error.json" || fail "TORCHELASTIC_ERROR_FILE is not the JSON torchrun reads"
echo "== 6. --min-ranks under torchrun on one node: refused at start, with the reason"
port=$(free_port)
rc=0
torchrun --nnodes 1 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" "$ddp_run" "${experiment[@]}" \
  --min-ranks 1 --out "$work/one-node" > "$work/one-node.out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "--min-ranks under torchrun on one node was not refused"
grep -q "under torchrun on one node: torchrun's agent stops every worker of a node" "$work/one-node.out" ||
  { cat "$work/one-node.out"; fail "the refusal does not give its reason"; }
[ ! -e "$work/one-node/metrics.jsonl" ] || fail "a refused job trained"

echo "== 7. --min-ranks under torchrun on two nodes: node 1's worker killed, node 0's trains on in place"
# Two agents (two nodes of one rank) through torchrun's c10d rendezvous;
# rank 0 serves ddp's store. Rank 1 kills itself after step 9; its agent
# (--max_restarts 0) gives up that node and exits non-zero; rank 0 leaves
# rank 1 out and finishes alone (its agent exits 0): every step once,
# world 2 then 1.
port=$(free_port)
for node in 0 1; do
  DDP_FAULT_INJECT=1@9 timeout -k 5 240 $python -m torch.distributed.run --nnodes 2 --nproc_per_node 1 \
    --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" --rdzv_id elastic7 --max_restarts 0 --no_python \
    --redirects 1 --tee 1 "$ddp_run" "${experiment[@]}" --set training.epochs=30 --set training.log_every=1 \
    --set distributed.timeout_s=10 --min-ranks 1 --out "$work/two-nodes" > "$work/node$node.out" 2>&1 &
  pids[node]=$!
done
rc0=0 rc1=0
wait "${pids[0]}" || rc0=$?
wait "${pids[1]}" || rc1=$?
# (The c10d rendezvous, not the order of start, decides which agent's
# worker is rank 0.)
echo "the agents exited $rc0 and $rc1"
if [ "$rc0" = 0 ]; then survivor=0 victim=1; else survivor=1 victim=0; fi
[ "$(eval echo \$rc$survivor)" = 0 ] && [ "$(eval echo \$rc$victim)" != 0 ] ||
  { cat "$work/node0.out" "$work/node1.out"; fail "the agents exited $rc0 and $rc1: one should exit 0, the other not"; }
grep -q "done: .* steps" "$work/node$survivor.out" || { cat "$work/node$survivor.out"; fail "rank 0 did not finish"; }
grep -q "elastic: generation 1: lost rank id(s) 1" "$work/two-nodes/train.log" ||
  { cat "$work/node$survivor.out"; fail "rank 0 did not recover in place"; }
$python - "$work/two-nodes" <<'PY' || fail "the two-node job's steps"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1] + "/steps.jsonl") if l.strip()]
numbers = [s["step"] for s in steps]
assert numbers == list(range(1, len(numbers) + 1)), f"steps not 1..N once: {numbers[:12]}"
worlds = [s["world_size"] for s in steps]
assert worlds[:9] == [2] * 9 and worlds[-1] == 1, f"world sizes {worlds[:12]}..."
epochs = [json.loads(l)["epoch"] for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
assert epochs == list(range(1, 31)), f"epochs {epochs[:3]}..."
print(f"ok: {len(numbers)} steps once, world 2 -> 1 after step {worlds.index(1)}, 30 epochs")
PY
echo "PASS"
