#!/usr/bin/env python3
"""Reference for `ddp-bench strategies`: PyTorch's DDP, ZeroRedundancyOptimizer
(optimizer state sharded, as our zero1) and FSDP over gloo on the CPU, on the
MLP of --widths (or, with --model gpt, models_torch.Gpt of --gpt on random
token ids) with Adam, batch --batch per rank of random data.

Same seeds and initialisation as ddp-bench's own ranks (torch.manual_seed(0)
before the model, 1 + rank before the batch), so on the same LibTorch version
every implementation starts from the same weights and batches. One intra-op
thread per rank, ranks as processes, one implementation after the other.

Prints one JSON line per implementation: {impl, world_size, params,
batch_per_rank, step_ms, param_bytes, grad_bytes, optimizer_bytes,
peak_rss_bytes, param_sum, param_abs_sum}, the bytes the largest over ranks
(parameters and gradients as the module's tensors hold them, each storage
once; DDP's own gradient buckets are not visible here, so peak_rss_bytes is
the figure to compare); or {impl, unavailable: why} when this PyTorch cannot
run it (FSDP on CPU before 2.x).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import models_torch  # this folder's; the one Python definition of the models
import rendezvous  # this folder's: a fresh file store per job


def storage_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = t.storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def state_bytes(opt):
    total = 0
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v) and v.dim() > 0:
                total += v.numel() * v.element_size()
    return total


def worker(rank, world, store, impl, args, out):
    torch.set_num_threads(1)
    rendezvous.init("gloo", rank, world, store)
    torch.manual_seed(0)
    gpt = args.model == "gpt"
    net = models_torch.Gpt(args.gpt) if gpt else models_torch.mlp(args.widths)
    torch.manual_seed(1 + rank)
    if gpt:
        vocab, block = args.gpt["vocab"], args.gpt["block_size"]
        x, y = torch.randint(0, vocab, (args.batch, block)), torch.randint(0, vocab, (args.batch * block,))
    else:
        vocab = args.widths[-1]
        x, y = torch.randn(args.batch, args.widths[0]), torch.randint(0, vocab, (args.batch,))
    try:
        if impl == "torch-fsdp":
            from torch.distributed.fsdp import FullyShardedDataParallel
            model = FullyShardedDataParallel(net)
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            local_opt = opt
        else:
            model = torch.nn.parallel.DistributedDataParallel(net)
            if impl == "torch-zero":
                from torch.distributed.optim import ZeroRedundancyOptimizer
                opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
                local_opt = opt.optim
            else:
                opt = torch.optim.Adam(model.parameters(), lr=args.lr)
                local_opt = opt
        times = []
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x).reshape(-1, vocab), y).backward()
            opt.step()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    except Exception as e:  # this PyTorch cannot run it here
        if rank == 0:
            out.put({"impl": impl, "unavailable": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
        leave(out)
    params = list(model.parameters())
    mine = torch.tensor([statistics.median(times), storage_bytes(params),
                         storage_bytes([p.grad for p in params]), state_bytes(local_opt),
                         resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.float64)
    table = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(table, mine)
    table = torch.stack(table)
    if impl == "torch-fsdp":
        full = None  # the sums below need the full parameters; FSDP holds shards
    else:
        full = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).double()
    if rank == 0:
        record = {"impl": impl, "world_size": world, "params": sum(p.numel() for p in net.parameters()),
                  "batch_per_rank": args.batch, "step_ms": table[:, 0].mean().item() * 1000,
                  "param_bytes": table[:, 1].max().item(), "grad_bytes": table[:, 2].max().item(),
                  "optimizer_bytes": table[:, 3].max().item(), "peak_rss_bytes": table[:, 4].max().item()}
        if full is not None:
            record["param_sum"] = full.sum().item()
            record["param_abs_sum"] = full.abs().sum().item()
        out.put(record)
    leave(out)


def leave(out):
    """Ends a worker at once, its record flushed: the interpreter's own
    teardown (a process group's threads, the queue's feeder) hung once in
    a hundred runs here, with the parent waiting in join()."""
    out.close()
    out.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    rendezvous.watchdog()
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="2048,4096,4096,4096,2048")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--impls", default="torch-ddp,torch-zero,torch-fsdp")
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    p.add_argument("--gpt", type=json.loads, default=None,
                   help="--model gpt: JSON of the gpt's parameters and vocab (see models_torch.py)")
    args = p.parse_args()
    if args.model == "gpt" and args.gpt is None:
        p.error("--model gpt needs --gpt")
    args.widths = [int(w) for w in args.widths.split(",")]
    ctx = mp.get_context("spawn")
    for impl in args.impls.split(","):
        if impl == "torch-fsdp":
            try:  # Debian's torch 1.13 under Python 3.11 cannot even import it: no ranks to start
                import torch.distributed.fsdp  # noqa: F401
            except Exception as e:
                print(json.dumps({"impl": impl, "unavailable": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}),
                      flush=True)
                continue
        out = ctx.Queue()
        try:
            with rendezvous.job_store() as store:
                mp.start_processes(worker, args=(args.world_size, store, impl, args, out), nprocs=args.world_size,
                                   start_method="spawn")
        except Exception as e:
            print(json.dumps({"impl": impl, "unavailable": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}),
                  flush=True)
            continue
        print(json.dumps(out.get(timeout=60)), flush=True)


if __name__ == "__main__":
    main()
