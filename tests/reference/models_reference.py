#!/usr/bin/python3
"""The cnn and gpt models of plugins/models/ written plainly in PyTorch, as a
reference for tests/test_models.cpp.

Usage: models_reference.py DIR...

Each DIR/manifest.json, written by the C++ test, holds
  {"model": "cnn" | "gpt", "config": {...the model's parameters and sizes...},
   "tensors": [{"name": ..., "dtype": "float32" | "int64", "shape": [...]}],
   "outputs": ["eval", "train"]}
and DIR/<name>.bin the raw little-endian values of each tensor: the model's
parameters and buffers under their C++ names, and "input". The script loads
them into the model below and writes DIR/output_<mode>.bin (float32) for each
mode in "outputs": the forward pass in eval or train mode (dropout must be 0
for train mode to be deterministic).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- cnn ---------------------------------------------------------------------

def activation(x, name):
    return {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh}[name](x)


class ConvBlock(nn.Module):
    def __init__(self, c_in, c_out, k, batch_norm, act, pool):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, padding=k // 2, bias=not batch_norm)
        self.bn = nn.BatchNorm2d(c_out) if batch_norm else None
        self.act = act
        self.pool = pool

    def forward(self, x):
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        x = activation(x, self.act)
        if self.pool == "max":
            x = F.max_pool2d(x, 2)
        elif self.pool == "avg":
            x = F.avg_pool2d(x, 2)
        return x


class Cnn(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        shape = cfg["sample_shape"]
        c, h, w = (shape if len(shape) == 3 else [1] + shape)
        self.act = cfg["activation"]
        self.dropout = cfg["dropout"]
        blocks = []
        for out in cfg["channels"]:
            pool = cfg["pool"]
            if pool != "none":
                if h == 1 and w == 1:
                    pool = "none"
                else:
                    h, w = h // 2, w // 2
            blocks.append(ConvBlock(c, out, cfg["kernel_size"], cfg["batch_norm"], self.act, pool))
            c = out
        self.blocks = nn.ModuleList(blocks)
        features = c * h * w
        if cfg["hidden"] > 0:
            self.hidden = nn.Linear(features, cfg["hidden"])
            self.head = nn.Linear(cfg["hidden"], cfg["classes"])
        else:
            self.hidden = None
            self.head = nn.Linear(features, cfg["classes"])

    def forward(self, x):
        if x.dim() == 3:
            x = x.unsqueeze(1)
        for block in self.blocks:
            x = block(x)
        x = F.dropout(torch.flatten(x, 1), self.dropout, self.training)
        if self.hidden is not None:
            x = activation(self.hidden(x), self.act)
        return self.head(x)


# ---- gpt ---------------------------------------------------------------------

class LayerNorm(nn.Module):
    def __init__(self, width, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg["n_head"]
        self.p = cfg["dropout"]
        self.c_attn = nn.Linear(cfg["n_embd"], 3 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.n_head
        q, k, v = self.c_attn(x).chunk(3, dim=2)
        q = q.reshape(b, t, self.n_head, d).permute(0, 2, 1, 3)
        k = k.reshape(b, t, self.n_head, d).permute(0, 2, 1, 3)
        v = v.reshape(b, t, self.n_head, d).permute(0, 2, 1, 3)
        scores = q @ k.transpose(2, 3) / math.sqrt(d)
        allowed = torch.tril(torch.ones(t, t, dtype=torch.bool))
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = F.dropout(torch.softmax(scores, dim=3), self.p, self.training)
        y = (weights @ v).permute(0, 2, 1, 3).reshape(b, t, c)
        return F.dropout(self.c_proj(y), self.p, self.training)


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.p = cfg["dropout"]
        self.c_fc = nn.Linear(cfg["n_embd"], 4 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(4 * cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])

    def forward(self, x):
        return F.dropout(self.c_proj(F.gelu(self.c_fc(x))), self.p, self.training)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.attn = SelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.mlp = FeedForward(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.p = cfg["dropout"]
        self.tied = cfg["tie_weights"]
        self.wte = nn.Embedding(cfg["vocab"], cfg["n_embd"])
        self.wpe = nn.Embedding(cfg["block_size"], cfg["n_embd"])
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])])
        self.ln_f = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.lm_head = None if self.tied else nn.Linear(cfg["n_embd"], cfg["vocab"], bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(t))
        x = F.dropout(x, self.p, self.training)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.t() if self.tied else self.lm_head(x)


def run_case(folder):
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    tensors = {}
    for t in manifest["tensors"]:
        values = np.fromfile(os.path.join(folder, t["name"] + ".bin"), dtype=t["dtype"])
        tensors[t["name"]] = torch.from_numpy(values.reshape(t["shape"]))
    model = {"cnn": Cnn, "gpt": Gpt}[manifest["model"]](manifest["config"])
    state = {name: value for name, value in tensors.items() if name != "input"}
    model.load_state_dict(state, strict=True)  # every name must match, both ways
    for mode in manifest["outputs"]:
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
