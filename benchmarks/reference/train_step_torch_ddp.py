#!/usr/bin/env python3
"""Reference for `ddp-bench train-step`: PyTorch's own DDP over gloo
(or over nccl with --device cuda, rank r on cuda:r).

The MLP 256-1024-1024-1024-512-10 (about 2.9M parameters), batch 64 per rank,
Adam, one intra-op thread per rank, ranks as processes on this machine.
Prints one JSON record per world size:
{impl, world_size, params, batch_per_rank, step_ms, samples_per_s}.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WIDTHS = [256, 1024, 1024, 1024, 512, 10]


def make_model():
    layers = []
    for i in range(len(WIDTHS) - 1):
        layers.append(torch.nn.Linear(WIDTHS[i], WIDTHS[i + 1]))
        if i + 2 < len(WIDTHS):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def worker(rank, world, port, warmup, steps, batch, device, out):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    model = torch.nn.parallel.DistributedDataParallel(make_model().to(dev), device_ids=[rank] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, WIDTHS[0]).to(dev)
    y = torch.randint(0, WIDTHS[-1], (batch,)).to(dev)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize(dev)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        step_ms = statistics.median(times) * 1000
        params = sum(p.numel() for p in model.parameters())
        out.put({"impl": "torch-ddp", "world_size": world, "params": params, "batch_per_rank": batch,
                 "step_ms": step_ms, "samples_per_s": world * batch / (step_ms / 1000)})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--repeats", type=int, default=1, help="runs per world size; the median run is printed")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    worlds = [int(w) for w in args.world_sizes.split(",")]
    runs = {w: [] for w in worlds}
    port = args.port
    for _ in range(args.repeats):
        for world in worlds:
            out = ctx.Queue()
            mp.start_processes(worker, args=(world, port, args.warmup, args.steps, args.batch, args.device, out),
                               nprocs=world, start_method="spawn")
            port += 1
            runs[world].append(out.get())
    for world in worlds:
        ordered = sorted(runs[world], key=lambda r: r["step_ms"])
        record = ordered[(len(ordered) - 1) // 2]
        record["step_ms_repeats"] = [r["step_ms"] for r in runs[world]]
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
