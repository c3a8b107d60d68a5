#!/usr/bin/python3
"""The forward pass of the cnn and gpt models of plugins/models/ written plainly
in PyTorch (benchmarks/reference/models_torch.py), as a reference for
tests/test_models.cpp.

Usage: models_reference.py DIR...

Each DIR/manifest.json, written by the C++ test, holds
  {"model": "cnn" | "gpt", "config": {...the model's parameters and sizes...},
   "tensors": [{"name": ..., "dtype": "float32" | "int64", "shape": [...]}],
   "outputs": ["eval", "train"]}
and DIR/<name>.bin the raw little-endian values of each tensor: the model's
parameters and buffers under their C++ names, and "input". The script loads
them into that model and writes DIR/output_<mode>.bin (float32) for each
mode in "outputs": the forward pass in eval or train mode (dropout must be 0
for train mode to be deterministic). With "grads" among the outputs (and a
"targets" tensor: next tokens [B, T] for a gpt, classes [B] for a cnn), it
also writes DIR/grad_<name>.bin: the gradient of every parameter of the
mean cross-entropy of the train-mode output against the targets.
"""
import json
import os
import sys

import numpy as np
import torch

# The models themselves: benchmarks/reference/models_torch.py, shared with the
# benchmarks' references.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "reference"))
import models_torch  # noqa: E402


def run_case(folder):
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    tensors = {}
    for t in manifest["tensors"]:
        values = np.fromfile(os.path.join(folder, t["name"] + ".bin"), dtype=t["dtype"])
        tensors[t["name"]] = torch.from_numpy(values.reshape(t["shape"]))
    model = models_torch.build(manifest["model"], manifest["config"])
    state = {name: value for name, value in tensors.items() if name not in ("input", "targets")}
    model.load_state_dict(state, strict=True)  # every name must match, both ways
    for mode in manifest["outputs"]:
        if mode == "grads":
            model.train(True)
            out = model(tensors["input"])
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), tensors["targets"].reshape(-1))
            loss.backward()
            for name, p in model.named_parameters():
                p.grad.numpy().astype(np.float32).tofile(os.path.join(folder, "grad_" + name + ".bin"))
            continue
        model.train(mode == "train")
        with torch.no_grad():
            out = model(tensors["input"])
        out.numpy().astype(np.float32).tofile(os.path.join(folder, "output_" + mode + ".bin"))


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: models_reference.py DIR...")
    for folder in sys.argv[1:]:
        run_case(folder)


if __name__ == "__main__":
    main()
