#!/usr/bin/env python3
"""Our collectives against gloo's, from Python: the backend "ddp" of ddp_torch (issue 43).

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python_backend.py [--json F]

1. allreduce (sum, float32) at 4 KiB to 64 MiB on --world ranks (default
   2), both backends in the same job: the default group is "ddp", a second
   group of the same ranks is "gloo", and each size is timed on one, then
   the other, in turns (--rounds), so that both see the same machine. Each
   timing warms up, takes the median of its iterations, and the result is
   checked against its closed form. The table has nccl-tests' columns, per
   backend, and the ratio of bus bandwidths.
2. PyTorch's DDP step (reference/train_step_torch_ddp.py, the 2.9M MLP,
   batch 64 per rank) with --backend ddp and gloo, in turns, --repeats each:
   the median step of each, and their ratio.
One JSON record per line to --json: {"bench": "allreduce", "bytes", "backend",
"time_us", "algbw_gbs", "busbw_gbs"} and {"bench": "ddp_step", "backend",
"step_ms", "step_ms_repeats"}, then {"bench": "summary", ...}.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sizes(lo, hi):
    out, b = [], lo
    while b <= hi:
        out.append(b)
        b *= 4
    return out


def worker(args):
    import torch
    import torch.distributed as dist
    import ddp_torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("ddp", timeout=datetime.timedelta(minutes=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"ddp": None, "gloo": dist.new_group(backend="gloo")}
    results = {name: {} for name in groups}
    for _ in range(args.rounds):
        for nbytes in sizes(args.min_bytes, args.max_bytes):
            count = nbytes // 4
            t = torch.empty(count)
            iters = max(3, min(200, int(2e8 // max(nbytes, 1))))
            for name, group in groups.items():
                times = []
                for i in range(args.warmup + iters):
                    t.fill_(rank + 1)
                    dist.barrier(group=group)
                    start = time.perf_counter()
                    dist.all_reduce(t, group=group)
                    if i >= args.warmup:
                        times.append(time.perf_counter() - start)
                want = world * (world + 1) / 2
                if count and (t - want).abs().max().item() != 0:
                    raise SystemExit(f"python_backend.py: {name} allreduce of {nbytes} B: got {t[0].item()}, "
                                     f"want {want}")
                results[name].setdefault(nbytes, []).append(statistics.median(times))
    if rank == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


def run_allreduce(args):
    port = free_port()
    procs = []
    for rank in range(args.world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--world", str(args.world),
                                       "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                                       "--warmup", str(args.warmup), "--rounds", str(args.rounds)],
                                      env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"python_backend.py: an allreduce rank failed: exit codes {[p.returncode for p in procs]}")
    raw = json.loads(outs[0].strip().splitlines()[-1])
    records = []
    for name, by_size in raw.items():
        for nbytes, times in by_size.items():
            t = statistics.median(times)
            algbw = int(nbytes) / t / 1e9
            records.append({"bench": "allreduce", "backend": name, "bytes": int(nbytes), "world_size": args.world,
                            "time_us": t * 1e6, "algbw_gbs": algbw,
                            "busbw_gbs": algbw * 2 * (args.world - 1) / args.world})
    return records


def run_ddp_step(args):
    records = {"ddp": [], "gloo": []}
    script = os.path.join(HERE, "reference", "train_step_torch_ddp.py")
    for _ in range(args.repeats):
        for backend in ("ddp", "gloo"):
            out = subprocess.run([sys.executable, script, "--backend", backend, "--world-sizes", str(args.world),
                                  "--warmup", "3", "--steps", str(args.steps)],
                                 stdout=subprocess.PIPE, text=True, check=True).stdout
            records[backend].append(json.loads(out.strip().splitlines()[-1])["step_ms"])
    return [{"bench": "ddp_step", "backend": b, "world_size": args.world, "model": "mlp 2.9M",
             "step_ms": statistics.median(v), "step_ms_repeats": v} for b, v in records.items()]


def human(nbytes):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--min-bytes", type=int, default=4 << 10)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="turns of every size on both backends (median of medians)")
    p.add_argument("--repeats", type=int, default=3, help="DDP step runs per backend, in turns")
    p.add_argument("--steps", type=int, default=20, help="timed DDP steps per run")
    p.add_argument("--no-ddp-step", action="store_true")
    p.add_argument("--json", help="append the records here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    records = run_allreduce(args)
    by = {(r["backend"], r["bytes"]): r for r in records}
    print(f"# allreduce, float32 sum, {args.world} ranks on this host, from Python (torch.distributed)")
    print(f"{'size':>9} {'count':>10} | {'ddp time(us)':>12} {'busbw':>7} | {'gloo time(us)':>13} {'busbw':>7} | "
          f"{'ddp/gloo busbw':>14}")
    ratios = {}
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        d, g = by[("ddp", nbytes)], by[("gloo", nbytes)]
        ratios[nbytes] = d["busbw_gbs"] / g["busbw_gbs"]
        print(f"{human(nbytes):>9} {nbytes // 4:>10} | {d['time_us']:12.1f} {d['busbw_gbs']:7.3f} | "
              f"{g['time_us']:13.1f} {g['busbw_gbs']:7.3f} | {ratios[nbytes]:13.2f}x")
    summary = {"bench": "summary", "busbw_ratio": {str(k): v for k, v in ratios.items()},
               "min_busbw_ratio_from_64KiB": min(v for k, v in ratios.items() if k >= 64 << 10)}
    if not args.no_ddp_step:
        steps = run_ddp_step(args)
        records += steps
        s = {r["backend"]: r["step_ms"] for r in steps}
        summary["ddp_step_ratio"] = s["ddp"] / s["gloo"]
        print(f"# PyTorch DDP step, MLP 2.9M, batch 64 per rank, {args.world} ranks: ddp {s['ddp']:.2f} ms, "
              f"gloo {s['gloo']:.2f} ms, ratio {summary['ddp_step_ratio']:.3f}")
    print(f"# busbw ratio ddp/gloo at 64 KiB and above: at least {summary['min_busbw_ratio_from_64KiB']:.2f}x")
    if args.json:
        with open(args.json, "a") as f:
            for r in records + [summary]:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
