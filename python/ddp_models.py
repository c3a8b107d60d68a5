"""The built-in models of plugins/models/ in PyTorch, with the same parameter
and buffer names, so that weights cross both ways:

    import ddp_models                      # python/ of the ddp source tree or share/ddp/python
    model = ddp_models.from_run("runs/wine-20261203-101500")      # newest export or checkpoint
    model = ddp_models.from_safetensors("model.safetensors")      # what `ddp-run --export` wrote
    torch.save(model.state_dict(), "start.pt")                     # `model.init_from: "start.pt"`
    ddp_models.save_safetensors("start.safetensors", model.state_dict())

- Mlp(cfg): plugins/models/mlp.cpp. cfg: layers (widths, 0 at either end
  taken from num_features / num_classes), activation, dropout. Its Linear
  layers are `layers.0`, `layers.1`, ... (the activation has no weights).
- Cnn(cfg): plugins/models/cnn.cpp. cfg holds the model's parameters
  (channels, kernel_size, batch_norm, activation, pool, dropout, hidden) and
  the dataset's sample_shape ([C, H, W] or [H, W]) and classes. PyTorch's
  default initialisation, as the C++ modules use LibTorch's.
- Gpt(cfg): plugins/models/gpt.cpp. cfg holds vocab, block_size, n_layer,
  n_head, n_embd, dropout, bias and tie_weights. GPT-2's initialisation, as
  the C++ model: weights N(0, 0.02), the residual projections (c_proj)
  N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1. With
  tie_weights the head is the token embedding itself (one tensor).
- mlp(widths): Linear layers with ReLU between them in an nn.Sequential
  (what `ddp-bench train-step --model mlp` times; not the mlp plugin).

model_config(model_section, model_context) turns a run's config.json
"model" section and its model_context.json into (kind, cfg); build(kind,
cfg) makes the module. load_safetensors / save_safetensors read and write
the safetensors format with torch alone (the safetensors package is not
needed). Every reference script of benchmarks/ and tests/ imports this file.
"""
import json
import math
import os
import struct

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


# ---- mlp (the plugin) --------------------------------------------------------

def activation(x, name):
    return {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[name](x)


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        widths = cfg["layers"]
        self.act = cfg["activation"]
        self.p = cfg["dropout"]
        self.layers = nn.ModuleList([nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.dropout(activation(x, self.act), self.p, self.training)
        return x


# ---- cnn ---------------------------------------------------------------------

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
    """Mlp(cfg), Cnn(cfg) or Gpt(cfg) by the plugin's name."""
    return {"mlp": Mlp, "cnn": Cnn, "gpt": Gpt}[kind](cfg)


def model_config(model, context):
    """(kind, cfg) of a run: config.json's "model" section and model_context.json,
    with every default the C++ plugin fills in already there (config.json is
    the resolved experiment)."""
    kind = model["name"]
    shape = context.get("sample_shape", [])
    if kind == "mlp":
        widths = list(model["layers"])
        if widths[0] == 0:
            widths[0] = context["num_features"]
        if widths[-1] == 0:
            widths[-1] = context["num_classes"] if context.get("num_classes", 0) > 0 else 1
        return kind, {"layers": widths, "activation": model["activation"], "dropout": model["dropout"]}
    if kind == "cnn":
        cfg = {k: model[k] for k in ("channels", "kernel_size", "batch_norm", "activation", "pool", "dropout", "hidden")}
        cfg.update(sample_shape=shape, classes=context["num_classes"])
        return kind, cfg
    if kind == "gpt":
        cfg = {k: model[k] for k in ("n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights")}
        cfg.update(vocab=context["vocab_size"], block_size=model["block_size"] or shape[0])
        return kind, cfg
    raise ValueError(f"model {kind!r}: ddp_models builds mlp, cnn and gpt; a plugin model needs its own module")


# ---- weights files -----------------------------------------------------------

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def load_safetensors(path):
    """(state_dict, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = bytearray(data[8 + n:])
    state = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = _DTYPES[entry["dtype"]]
        flat = torch.frombuffer(body, dtype=dtype, offset=begin, count=(end - begin) // torch.empty((), dtype=dtype).element_size()) \
            if end > begin else torch.empty(0, dtype=dtype)
        state[name] = flat.reshape(entry["shape"]).clone()
    return state, metadata


def save_safetensors(path, state, metadata=None):
    """Writes a state_dict (tensors, tied ones once each by name) as safetensors."""
    names = {v: k for k, v in _DTYPES.items()}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for raw in blobs:
            f.write(raw)


def from_safetensors(path):
    """The model a `ddp-run --export` file describes (its __metadata__), with its weights, in eval mode."""
    state, metadata = load_safetensors(path)
    kind, cfg = model_config(json.loads(metadata["ddp.model"]), json.loads(metadata["ddp.model_context"]))
    model = build(kind, cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()


def from_run(run_dir, weights=None):
    """The model of a run folder, in eval mode: built from config.json and
    model_context.json, loaded from `weights` (a safetensors file or a .pt of
    a state_dict), else from the run's model.safetensors (`ddp-run --export`)."""
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(run_dir, "model_context.json")) as f:
        context = json.load(f)
    model = build(*model_config(config["model"], context))
    path = weights or os.path.join(run_dir, "model.safetensors")
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    state = torch.load(path, weights_only=True) if is_zip else load_safetensors(path)[0]
    model.load_state_dict(state, strict=True)
    return model.eval()
