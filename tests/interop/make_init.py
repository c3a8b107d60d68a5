#!/usr/bin/python3
"""Starts a model in Python for `model.init_from` (issue 33), and says what
its loss is on a batch, for tests/test_interop.cpp to compare with ours.

Usage: make_init.py RUN_DIR OUT_DIR SEED BATCH

Builds python/ddp_models.py's module of RUN_DIR (config.json and
model_context.json) with PyTorch's own initialisation under
torch.manual_seed(SEED) and writes, into OUT_DIR:
- init.safetensors (ddp_models.save_safetensors: a few lines of Python, as
  the safetensors package is not on Debian) and init.pt
  (torch.save(model.state_dict()): an OrderedDict);
- batch.safetensors: BATCH samples of input and target drawn under the same
  seed, and the model's loss on them (mean cross-entropy, over every token
  for a gpt) in train mode ("loss_train"; dropout must be 0 there) and in
  eval mode ("loss_eval"), and the eval-mode logits;
- for mlp and cnn, x.npy and y.npy: the same batch as a dataset for the npy
  plugin, so that one full-batch step of ddp-run sees exactly these samples.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # after PYTHONPATH: a built ddp_torch comes first
import ddp_models  # noqa: E402


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: make_init.py RUN_DIR OUT_DIR SEED BATCH")
    run_dir, out_dir, seed, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(run_dir, "model_context.json")) as f:
        context = json.load(f)
    kind, cfg = ddp_models.model_config(config["model"], context)
    torch.manual_seed(seed)
    model = ddp_models.build(kind, cfg)
    if kind == "gpt":
        x = torch.randint(0, cfg["vocab"], (batch, cfg["block_size"]))
        y = torch.randint(0, cfg["vocab"], (batch, cfg["block_size"]))
    else:
        shape = context["sample_shape"]
        x = torch.randn(batch, *shape)
        classes = cfg["layers"][-1] if kind == "mlp" else cfg["classes"]
        y = torch.arange(batch) % classes  # every class present, as the npy plugin wants

    def loss_of(out):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    model.train(True)
    with torch.no_grad():
        loss_train = loss_of(model(x))
    model.eval()
    with torch.no_grad():
        logits = model(x)
    ddp_models.save_safetensors(os.path.join(out_dir, "init.safetensors"), model.state_dict())
    torch.save(model.state_dict(), os.path.join(out_dir, "init.pt"))
    ddp_models.save_safetensors(os.path.join(out_dir, "batch.safetensors"), {
        "input": x, "target": y, "logits": logits,
        "loss_train": loss_train.double().reshape(1), "loss_eval": loss_of(logits).double().reshape(1)})
    if kind != "gpt":
        np.save(os.path.join(out_dir, "x.npy"), x.numpy().astype(np.float32))
        np.save(os.path.join(out_dir, "y.npy"), y.numpy().astype(np.int64))
    print(json.dumps({"kind": kind, "loss_train": loss_train.item(), "loss_eval": loss_of(logits).item()}))


if __name__ == "__main__":
    main()
