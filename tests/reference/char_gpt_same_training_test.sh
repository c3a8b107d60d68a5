#!/usr/bin/env bash
# ddp-bench lm compares our char_gpt with benchmarks/reference/char_gpt_torch.py
# on the final validation loss, which after ~1000 steps is a draw from a
# chaotic process. This checks the claim underneath: both sides train the
# same thing. With one seed they start from the same weights and see the
# same batches and dropout masks, so after 8 steps (before rounding
# differences grow) their validation losses agree to 1e-5.
set -euo pipefail
ddp_run=$(realpath "${1:?usage: $0 path/to/ddp-run}")
src=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=reference_preamble.sh
. "$(dirname "$0")/reference_preamble.sh"
timeout -k 5 120 "$ddp_run" --nproc-per-node 2 "$src/experiments/char_gpt.json" --out "$out/run" \
  --set training.max_steps=8 --set training.epochs=1 --set training.seed=3 >"$out/ours.log" 2>&1 ||
  { cat "$out/ours.log"; echo "FAILED: ddp-run"; exit 1; }
(cd "$src/benchmarks/reference" && timeout -k 5 120 /usr/bin/python3 char_gpt_torch.py --config "$out/run/config.json") \
  >"$out/theirs.log" 2>&1 || { cat "$out/theirs.log"; echo "FAILED: char_gpt_torch.py"; exit 1; }
/usr/bin/python3 - "$out/run/metrics.jsonl" "$out/theirs.log" <<'PY'
import json, sys
ours = json.loads(open(sys.argv[1]).read().splitlines()[-1])["test_loss"]
theirs = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]
assert theirs["steps"] == 8, theirs
diff = abs(ours - theirs["val_loss"]) / theirs["val_loss"]
print(f"after 8 steps: ours {ours:.7f}, PyTorch {theirs['val_loss']:.7f}, relative difference {diff:.1e}")
if diff > 1e-5:
    sys.exit("FAILED: the two sides do not train the same thing (relative difference above 1e-5)")
PY
