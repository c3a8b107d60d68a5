#!/usr/bin/env python3
"""Reference for `ddp-bench lm`: the char_gpt experiment in PyTorch's Python.

Reads the resolved experiment that our run wrote (RUN_DIR/config.json) and
trains the same thing with torch.nn.parallel.DistributedDataParallel over
gloo, one process per rank, one intra-op thread each:

- data: the text file's bytes (at most max_bytes), the vocabulary its
  distinct bytes in byte order; the first 1 - val_fraction of the tokens
  train, the rest validate; sample k is the window at k * stride (stride 0:
  block_size), targets shifted by one;
- model: models_torch.Gpt (this folder), the plain PyTorch twin of
  plugins/models/gpt.cpp (token and position embeddings, n_layer pre-norm
  blocks of causal self-attention and a 4x GELU MLP, final layer norm, a
  head tied to the token embedding when tie_weights), GPT-2's
  initialisation;
- training: DistributedSampler shards (shuffled per epoch, seeded),
  batch_size windows per rank, the optimizer and lr of the experiment,
  `epochs` epochs (or max_steps steps), cross-entropy per token; with
  training.clip_grad_norm, torch.nn.utils.clip_grad_norm_ after backward;
  with scheduler "constant" and warmup_steps W, LinearLR(1/W, 1, W - 1)
  stepped per optimizer step; with training.precision "bf16", the forward
  under torch.autocast("cpu", torch.bfloat16) and the loss in fp32;
- evaluation: the mean loss per token over every validation window, after
  the last epoch, sharded over the ranks and summed.

The order in which windows are drawn comes from PyTorch's own generator, so
it is not ours: the two runs see the same data in different orders, and
their final losses agree to within run-to-run noise, not bit for bit.

Prints one JSON record: {impl, world_size, params, steps, val_loss,
seconds} where seconds is the epoch loop on rank 0 (after building).
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from distributed_sampler import indices_for_epoch  # our sampler's order
from models_torch import Gpt  # this folder's; the one Python definition of the models
import rendezvous  # this folder's: a fresh file store per job


class Windows(torch.utils.data.Dataset):
    def __init__(self, ids, begin, end, block, stride):
        self.ids, self.begin, self.block, self.stride = ids, begin, block, stride
        tokens = end - begin
        self.n = 0 if tokens < block + 1 else (tokens - block - 1) // stride + 1

    def __len__(self):
        return self.n

    def __getitem__(self, k):
        start = self.begin + k * self.stride
        w = self.ids[start:start + self.block + 1]
        return w[:-1], w[1:]


def load(cfg):
    d = cfg["dataset"]
    data = open(d["path"], "rb").read()
    if d.get("max_bytes", 0) > 0:
        data = data[:d["max_bytes"]]
    vocab = sorted(set(data))
    index = {b: i for i, b in enumerate(vocab)}
    ids = torch.tensor([index[b] for b in data], dtype=torch.long)
    n = len(ids)
    cut = n - int(n * d["val_fraction"])
    block = d["block_size"]
    stride = d.get("stride", 0) or block
    return len(vocab), Windows(ids, 0, cut, block, stride), Windows(ids, cut, n, block, stride)


def worker(rank, world, store, cfg, out):
    torch.set_num_threads(1)
    rendezvous.init("gloo", rank, world, store)
    tc, m, o = cfg["training"], cfg["model"], cfg["optimizer"]
    torch.manual_seed(tc["seed"])
    vocab, train, val = load(cfg)
    model = Gpt({"vocab": vocab, "block_size": cfg["dataset"]["block_size"], "n_layer": m["n_layer"],
                 "n_head": m["n_head"], "n_embd": m["n_embd"], "dropout": m["dropout"], "bias": m.get("bias", True),
                 "tie_weights": m.get("tie_weights", True)})
    params = sum(p.numel() for p in model.parameters())
    ddp = nn.parallel.DistributedDataParallel(model)
    betas = (o.get("beta1", 0.9), o.get("beta2", 0.999))
    if o["name"] == "adamw":
        opt = torch.optim.AdamW(ddp.parameters(), lr=o["lr"], betas=betas, eps=o.get("eps", 1e-8),
                                weight_decay=o.get("weight_decay", 0.01))
    elif o["name"] == "adam":
        opt = torch.optim.Adam(ddp.parameters(), lr=o["lr"], betas=betas, eps=o.get("eps", 1e-8),
                               weight_decay=o.get("weight_decay", 0.0))
    else:
        raise SystemExit(f"char_gpt_torch.py: optimizer {o['name']} not supported here")
    sched = cfg.get("scheduler")
    warmup = None
    if sched:
        if sched["name"] != "constant":
            raise SystemExit(f"char_gpt_torch.py: scheduler {sched['name']} not supported here (constant only)")
        w = sched.get("warmup_steps", 0)
        if w > 0:
            warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / w, end_factor=1.0,
                                                       total_iters=max(w - 1, 0))
    clip = tc.get("clip_grad_norm", 0)
    bf16 = tc.get("precision", "fp32") == "bf16"
    norms = []
    # Our sampler's order (not torch's DistributedSampler, nor a DataLoader,
    # which draws from the global generator each epoch): with the same seed
    # both sides see the same batches and the same dropout masks.
    batch = tc["batch_size"]
    max_steps = tc.get("max_steps", 0)
    steps = 0
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(tc["epochs"]):
        ddp.train()
        mine = indices_for_epoch(len(train), tc["seed"], epoch, rank, world, drop_last=tc.get("drop_last", False))
        for b in range(0, len(mine), batch):
            if tc.get("drop_last", False) and b + batch > len(mine):
                break  # as the trainer: no short last batch
            xs, ys = zip(*(train[k] for k in mine[b:b + batch]))
            x, y = torch.stack(xs), torch.stack(ys)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = ddp(x)
            F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1)).backward()
            if clip > 0:
                norms.append(torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip).item())
            opt.step()
            if warmup is not None:
                warmup.step()
            steps += 1
            if max_steps and steps >= max_steps:
                break
        if max_steps and steps >= max_steps:
            break
    # The validation windows r, r + w, ...: loss sum and windows, summed.
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        rows = list(range(rank, len(val), world))
        for i in range(0, len(rows), 256):
            xs, ys = zip(*(val[k] for k in rows[i:i + 256]))
            x, y = torch.stack(xs), torch.stack(ys)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
            sums += torch.tensor([loss.item() * len(xs), len(xs)], dtype=torch.float64)
    dist.all_reduce(sums)
    seconds = time.perf_counter() - start
    if rank == 0:
        out.put({"impl": "torch-python", "world_size": world, "params": params, "steps": steps,
                 "val_loss": (sums[0] / sums[1]).item(), "seconds": seconds, "grad_norms": norms})
    dist.destroy_process_group()


def main():
    rendezvous.watchdog()
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, help="a resolved experiment (RUN_DIR/config.json)")
    args = p.parse_args()
    cfg = json.load(open(args.config))
    world = cfg["distributed"]["nproc_per_node"]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with rendezvous.job_store() as store:
        mp.start_processes(worker, args=(world, store, cfg, out), nprocs=world, start_method="spawn")
    print(json.dumps(out.get()), flush=True)


if __name__ == "__main__":
    main()
