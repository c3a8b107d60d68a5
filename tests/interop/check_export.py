#!/usr/bin/python3
"""Loads weights that `ddp-run --export` wrote into python/ddp_models.py's
module of the run, and compares its logits with ours (issue 33).

Usage: check_export.py RUN_DIR CASE.safetensors WEIGHTS...

CASE.safetensors, written by tests/test_interop.cpp, holds "input" and
"logits": the C++ model's eval-mode output on that input. For each WEIGHTS
file (a safetensors file or a torch.save one) the script builds the model
from RUN_DIR/config.json and model_context.json, loads the file with
load_state_dict(strict=True), and prints one JSON line
{"weights": FILE, "max_abs_diff": D, "max_abs_logit": M}.
"""
import json
import os
import sys

import torch

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # after PYTHONPATH: a built ddp_torch comes first
import ddp_models  # noqa: E402


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: check_export.py RUN_DIR CASE.safetensors WEIGHTS...")
    run_dir, case_path = sys.argv[1], sys.argv[2]
    case, _ = ddp_models.load_safetensors(case_path)
    for weights in sys.argv[3:]:
        model = ddp_models.from_run(run_dir, weights)
        with torch.no_grad():
            out = model(case["input"])
        diff = (out - case["logits"]).abs().max().item()
        print(json.dumps({"weights": weights, "max_abs_diff": diff, "max_abs_logit": case["logits"].abs().max().item()}))


if __name__ == "__main__":
    main()
