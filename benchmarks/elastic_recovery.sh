#!/usr/bin/env bash
# Issue 30's measurement: the time from a rank's death to the next completed
# optimizer step, in place (ddp-run --min-ranks) against a restart of every
# rank from the newest checkpoint (--max-restarts), on wine, digits_cnn and
# char_gpt, 4 ranks on this machine, rank 2 killed (SIGKILL) right after
# step S. Both read steps.jsonl (log_every 1), whose records carry the wall
# time: the gap between step S's record and the next one, against the
# median gap between two steps. A restart also redoes the steps after its
# checkpoint (save_every 1 epoch): "steps redone".
#
#   benchmarks/elastic_recovery.sh path/to/ddp-run [--json FILE]
set -euo pipefail
ddp_run=$(realpath "${1:?usage: elastic_recovery.sh path/to/ddp-run [--json FILE]}")
json_out=""
[ "${2:-}" = "--json" ] && json_out="${3:?--json needs a file}"
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT; echo "work: $work"
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN

run() {  # NAME EXPERIMENT KILL_STEP MODE SETS...
  local name=$1 experiment=$2 step=$3 mode=$4
  shift 4
  local flags="--min-ranks 2"
  [ "$mode" = restart ] && flags="--max-restarts 1"
  DDP_FAULT_INJECT="2@$step" timeout -k 5 900 "$ddp_run" --nproc-per-node 4 $flags "$src/experiments/$experiment" \
    --out "$work/$name-$mode" --set training.log_every=1 --set training.save_every=1 --set training.eval_every=0 \
    --set distributed.timeout_s=60 "$@" >"$work/$name-$mode.log" 2>&1 ||
    { tail -20 "$work/$name-$mode.log"; echo "FAILED: $name $mode"; exit 1; }
}

measure() {  # NAME EXPERIMENT KILL_STEP SETS...
  local name=$1 experiment=$2 step=$3
  shift 3
  run "$name" "$experiment" "$step" elastic "$@"
  run "$name" "$experiment" "$step" restart "$@"
}

measure wine wine_baseline.json 21 --set training.epochs=20
measure cnn digits_cnn.json 50 --set training.epochs=8
measure gpt char_gpt.json 60 --set training.epochs=2 --set training.max_steps=75

/usr/bin/python3 - "$work" "$json_out" <<'PY'
import json, statistics, sys
work, json_out = sys.argv[1], sys.argv[2]
kills = {"wine": 21, "cnn": 50, "gpt": 60}
rows = []
for name, step in kills.items():
    row = {"experiment": name, "kill_after_step": step}
    for mode in ("elastic", "restart"):
        recs = [json.loads(l) for l in open(f"{work}/{name}-{mode}/steps.jsonl")]
        at = next(i for i, r in enumerate(recs) if r["step"] == step)
        normal = statistics.median(b["time"] - a["time"] for a, b in zip(recs[:at], recs[1:at + 1]))
        row[f"{mode}_step_s"] = normal
        # The next completed step (a restart's is one it redoes), and the
        # first step past the one the kill interrupted.
        row[f"{mode}_next_s"] = recs[at + 1]["time"] - recs[at]["time"]
        past = next(r for r in recs[at + 1:] if r["step"] == step + 1)
        row[f"{mode}_past_s"] = past["time"] - recs[at]["time"]
        row[f"{mode}_redone"] = step + 1 - recs[at + 1]["step"]
    row["ratio_next"] = row["restart_next_s"] / row["elastic_next_s"]
    row["ratio_past"] = row["restart_past_s"] / row["elastic_past_s"]
    rows.append(row)
print("| experiment | kill after step | step s | in place: to next step s | restart: to next step s (redoes) | ratio | in place: to step S+1 s | restart: to step S+1 s | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['experiment']} | {r['kill_after_step']} | {r['elastic_step_s']:.4f} | {r['elastic_next_s']:.3f} | "
          f"{r['restart_next_s']:.3f} ({r['restart_redone']}) | {r['ratio_next']:.1f}x | {r['elastic_past_s']:.3f} | "
          f"{r['restart_past_s']:.3f} | {r['ratio_past']:.1f}x |")
if json_out:
    json.dump(rows, open(json_out, "w"), indent=2)
PY
