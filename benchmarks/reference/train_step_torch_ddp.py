#!/usr/bin/env python3
"""Reference for `ddp-bench train-step`: PyTorch's own DDP over gloo
(or over nccl with --device cuda, rank r on cuda:r; or over our collectives
with --backend ddp, which imports ddp_torch: benchmarks/python_backend.py).

--model mlp (default): the MLP 256-1024-1024-1024-512-10 (about 2.9M
parameters), batch 64 per rank, Adam lr 1e-3, cross entropy.
--model cnn | gpt: models_torch.Cnn / Gpt (this folder) built from
--model-config (the model's parameters, the dataset's sample_shape, and the
classes, or the vocab and block_size), the optimizer of --optimizer (a
resolved experiment's optimizer section: adam or adamw), cross entropy (the
mean per token for gpt), --batch samples per rank: random images
[batch, *sample_shape] and classes, or random token ids [batch, window] and
next tokens. ddp-bench passes both from the experiment that it builds its
own model from.

One intra-op thread per rank, ranks as processes on this machine. After the
timed steps every rank's parameters are compared with rank 0's; a rank that
differs fails the run. Prints one JSON record per world size:
{impl, model, world_size, params, batch_per_rank, step_ms, samples_per_s,
 max_param_diff}.
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import models_torch  # this folder's; the one Python definition of the models
import rendezvous  # this folder's: a fresh file store per job

WIDTHS = [256, 1024, 1024, 1024, 512, 10]


def make_workload(args, dev):
    """(model, optimizer, loss function, inputs, targets) of this rank."""
    torch.manual_seed(0)  # same start everywhere (DDP also broadcasts rank 0's)
    if args.model == "mlp":
        model = models_torch.mlp(WIDTHS).to(dev)
        opt_cfg = {"name": "adam", "lr": 1e-3}
    else:
        model = models_torch.build(args.model, args.model_config).to(dev)
        opt_cfg = args.optimizer
    return model, opt_cfg


def make_optimizer(params, o):
    kwargs = {"lr": o["lr"], "betas": (o.get("beta1", 0.9), o.get("beta2", 0.999)), "eps": o.get("eps", 1e-8)}
    if o["name"] == "adam":
        return torch.optim.Adam(params, weight_decay=o.get("weight_decay", 0.0), **kwargs)
    if o["name"] == "adamw":
        return torch.optim.AdamW(params, weight_decay=o.get("weight_decay", 0.01), **kwargs)
    raise SystemExit(f"train_step_torch_ddp.py: optimizer {o['name']} not supported here")


def make_batch(args, rank, dev):
    """Random inputs and targets of the right shapes and dtypes, different per rank."""
    torch.manual_seed(1 + rank)
    b, cfg = args.batch, args.model_config
    if args.model == "mlp":
        x, y = torch.randn(b, WIDTHS[0]), torch.randint(0, WIDTHS[-1], (b,))
    elif args.model == "cnn":
        x, y = torch.randn(b, *cfg["sample_shape"]), torch.randint(0, cfg["classes"], (b,))
    else:
        shape = (b, *cfg["sample_shape"])  # [batch, window]
        x, y = torch.randint(0, cfg["vocab"], shape), torch.randint(0, cfg["vocab"], shape)
    return x.to(dev), y.to(dev)


def worker(rank, world, store, args, out):
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    if args.backend == "ddp":
        import ddp_torch  # noqa: F401  (registers the backend "ddp")
    rendezvous.init("nccl" if cuda else args.backend, rank, world, store)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    net, opt_cfg = make_workload(args, dev)
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank] if cuda else None)
    opt = make_optimizer(model.parameters(), opt_cfg)
    x, y = make_batch(args, rank, dev)
    times, phases = [], []  # phases: (zero_grad + forward + loss, backward, optimizer step)
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        logits = model(x)
        if logits.dim() == 3:  # gpt: [B, T, V] against [B, T], the mean per token
            logits, target = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        else:
            target = y
        loss = F.cross_entropy(logits, target)
        forward_end = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        opt.step()
        if cuda:
            torch.cuda.synchronize(dev)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
            phases.append((forward_end - start, backward_end - forward_end, time.perf_counter() - backward_end))
    # Every rank must hold rank 0's parameters: the largest difference.
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        first = flat.clone()
        dist.broadcast(first, 0)
        diff = (flat - first).abs().max().reshape(1)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        step_ms = statistics.median(times) * 1000
        params = sum(p.numel() for p in net.parameters())
        out.put({"impl": "torch-ddp", "backend": "nccl" if cuda else args.backend, "model": args.model, "world_size": world, "params": params,
                 "batch_per_rank": args.batch, "step_ms": step_ms, "samples_per_s": world * args.batch / (step_ms / 1000),
                 "max_param_diff": diff.item(),
                 **{name + "_ms": statistics.median(p[k] for p in phases) * 1000
                    for k, name in enumerate(["forward", "backward", "optimizer"])}})
    dist.destroy_process_group()


def main():
    rendezvous.watchdog()
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="mlp")
    p.add_argument("--model-config", type=json.loads, default=None,
                   help="cnn, gpt: JSON of the model's parameters and data sizes (see models_torch.py)")
    p.add_argument("--optimizer", type=json.loads, default=None,
                   help='cnn, gpt: JSON of the optimizer, e.g. {"name": "adam", "lr": 0.003}')
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=None, help="samples per rank (default: 64 for mlp, else 32)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["gloo", "ddp"], default="gloo",
                   help="the CPU backend: gloo, or ddp (ours, through ddp_torch; PYTHONPATH must hold it)")
    p.add_argument("--repeats", type=int, default=1, help="runs per world size; the median run is printed")
    args = p.parse_args()
    if args.model != "mlp" and (args.model_config is None or args.optimizer is None):
        p.error(f"--model {args.model} needs --model-config and --optimizer")
    if args.batch is None:
        args.batch = 64 if args.model == "mlp" else 32
    ctx = mp.get_context("spawn")
    worlds = [int(w) for w in args.world_sizes.split(",")]
    runs = {w: [] for w in worlds}
    for _ in range(args.repeats):
        for world in worlds:
            out = ctx.Queue()
            with rendezvous.job_store() as store:
                mp.start_processes(worker, args=(world, store, args, out), nprocs=world, start_method="spawn")
            record = out.get()
            if record["max_param_diff"] != 0:
                raise SystemExit(f"train_step_torch_ddp.py: after {args.steps + args.warmup} steps at world size "
                                 f"{world} the ranks' parameters differ by up to {record['max_param_diff']}")
            runs[world].append(record)
    for world in worlds:
        ordered = sorted(runs[world], key=lambda r: r["step_ms"])
        record = ordered[(len(ordered) - 1) // 2]
        record["step_ms_repeats"] = [r["step_ms"] for r in runs[world]]
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
