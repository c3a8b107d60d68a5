#!/usr/bin/env bash
# Elastic training under random failures (issue 30): ROUNDS runs of wine on
# 4 ranks with ddp-run --min-ranks 2, each with a random rank (rank 0
# included) killed after a random step; every other round a second rank
# too, or the first rank restarted to rejoin (--max-restarts 1), or a rank
# that hangs past the collective timeout until the others went on without it. Each round must exit with 0 and
# lose nothing: every epoch's record, every step once (steps.jsonl numbers
# them 1..N without a gap), and a final test accuracy of at least 0.8.
#
#   tests/stress/elastic_kills.sh path/to/ddp-run [ROUNDS=20] [SEED]
set -uo pipefail
ddp_run=$(realpath "${1:?usage: elastic_kills.sh path/to/ddp-run [ROUNDS] [SEED]}")
rounds="${2:-20}"
seed="${3:-$$}"
RANDOM="$seed"
echo "elastic_kills: $rounds rounds, seed $seed (pass it as the third argument to repeat them)"
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN
failed=0
for round in $(seq 1 "$rounds"); do
  rank=$((RANDOM % 4)); step=$((2 + RANDOM % 36))
  fault="$rank@$step"; flags="--min-ranks 2"; env_extra=""; timeout_s=20
  case $((RANDOM % 4)) in
    1) other=$(((rank + 1 + RANDOM % 3) % 4)); fault="$fault,$other@$((step + 1 + RANDOM % 10))" ;;
    2) flags="$flags --max-restarts 1"; env_extra="DDP_FAULT_SLOW=$(((rank + 1) % 4)):10" ;;
    3) fault="$rank@$step:until-replaced"; timeout_s=5 ;;
  esac
  out="$work/r$round"
  log="$work/r$round.log"
  env DDP_FAULT_INJECT="$fault" $env_extra timeout -k 5 120 "$ddp_run" --nproc-per-node 4 $flags \
    "$src/experiments/wine_baseline.json" --out "$out" --set training.epochs=20 --set training.eval_every=1 \
    --set training.log_every=1 --set training.save_every=0 --set distributed.timeout_s=$timeout_s >"$log" 2>&1
  code=$?
  verdict=$(/usr/bin/python3 - "$out" "$code" <<'PY'
import json, sys
run, code = sys.argv[1], int(sys.argv[2])
try:
    steps = [json.loads(l)["step"] for l in open(run + "/steps.jsonl")]
    metrics = [json.loads(l) for l in open(run + "/metrics.jsonl")]
except OSError as e:
    print(f"no records ({e})"); sys.exit()
problems = []
if code != 0: problems.append(f"exit code {code}")
if steps != list(range(1, len(steps) + 1)): problems.append(f"steps not 1..N: {steps}")
if [m["epoch"] for m in metrics] != list(range(1, 21)): problems.append(f"epochs {[m['epoch'] for m in metrics]}")
elif metrics[-1]["test_accuracy"] < 0.8: problems.append(f"final accuracy {metrics[-1]['test_accuracy']}")
print("; ".join(problems) if problems else "ok")
PY
)
  printf 'round %2d: DDP_FAULT_INJECT=%-22s %-36s %s\n' "$round" "$fault" "$flags $env_extra" "$verdict"
  if [ "$verdict" != ok ]; then
    failed=$((failed + 1))
    tail -20 "$log" | sed 's/^/    | /'
  fi
done
echo "elastic_kills: $failed of $rounds round(s) failed"
[ "$failed" -eq 0 ]
