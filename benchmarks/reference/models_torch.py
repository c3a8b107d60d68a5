"""The built-in models of plugins/models/ written plainly in PyTorch: the one
Python definition that every reference script imports.

- mlp(widths): Linear layers with ReLU between them (what `ddp-bench
  train-step --model mlp` times; not the mlp plugin, which has more options).
- Cnn(cfg): plugins/models/cnn.cpp. cfg holds the model's parameters
  (channels, kernel_size, batch_norm, activation, pool, dropout, hidden) and
  the dataset's sample_shape ([C, H, W] or [H, W]) and classes. PyTorch's
  default initialisation, as the C++ modules use LibTorch's.
- Gpt(cfg): plugins/models/gpt.cpp. cfg holds vocab, block_size, n_layer,
  n_head, n_embd, dropout, bias and tie_weights. GPT-2's initialisation, as
  the C++ model: weights N(0, 0.02), the residual projections (c_proj)
  N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1. With
  tie_weights the head is the token embedding itself (one tensor).

Parameter and buffer names are the C++ ones, so a state dict written from a
C++ model loads here with strict=True (tests/reference/models_reference.py).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


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
        c, h, w = (shape if len(shape) == 3 else [1] + list(shape))
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
    """Over the last dimension, with an optional bias."""

    def __init__(self, width, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class SelfAttention(nn.Module):
    """Multi-head causal self-attention, written out."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg["n_head"]
        self.p = cfg["dropout"]
        self.c_attn = nn.Linear(cfg["n_embd"], 3 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.n_head
        q, k, v = (z.view(b, t, self.n_head, d).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = F.dropout(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1), self.p, self.training)
        y = (weights @ v).transpose(1, 2).contiguous().view(b, t, c)
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
        self._initialise(cfg["n_layer"])

    def _initialise(self, n_layer):
        """GPT-2's, rule for rule as gpt.cpp's initialise(), in registration order."""
        residual_std = 0.02 / math.sqrt(2.0 * n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif name.startswith("ln_") or ".ln_" in name:
                    p.fill_(1.0)  # a LayerNorm weight
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, residual_std)
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        x = F.dropout(x, self.p, self.training)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        # Tied: the head's weight is the token embedding's [vocab, n_embd].
        return F.linear(x, self.wte.weight) if self.tied else self.lm_head(x)


def build(kind, cfg):
    """Cnn(cfg) or Gpt(cfg) by the plugin's name."""
    return {"cnn": Cnn, "gpt": Gpt}[kind](cfg)
