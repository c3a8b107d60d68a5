"""One rank of the ddp_torch tests (tests/CMakeLists.txt runs it through python3 -m ddp_torch.run at 2 and 4 ranks).

1. Every operation PyTorch's DDP and common code call, on the backend "ddp",
   against its closed form: dtypes, 0 elements, non-contiguous tensors.
2. What the backend lacks raises a RuntimeError naming it, and the group
   goes on.
3. DDP on an MLP and a CNN, 20 steps, with "ddp" and with "gloo" (a second
   group of the same ranks): the same parameters to 1e-6.
4. ZeroRedundancyOptimizer over "ddp" against plain DDP + SGD over gloo.
"""
import math
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

import ddp_torch

warnings.filterwarnings("ignore")  # 1.13's deprecation notes on the private names called here on purpose

dist.init_process_group(backend="ddp")
r, n = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "ddp", dist.get_backend()
assert ddp_torch.describe() is not None
gloo = dist.new_group(backend="gloo")
assert ddp_torch.describe(gloo) is None
checks = 0


def fail(message):
    sys.stderr.write(f"FAILED (rank {r}/{n}): {message}\n")
    sys.stderr.flush()
    os._exit(1)


def expect(name, got, want, tol=0.0):
    global checks
    checks += 1
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        fail(f"{name}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
    g, w = got.to(torch.complex128 if got.is_complex() else torch.float64), want.to(
        torch.complex128 if want.is_complex() else torch.float64)
    if g.numel() and (g - w).abs().max().item() > tol:
        fail(f"{name}: got {got.flatten()[:8].tolist()}, want {want.flatten()[:8].tolist()}")


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8]
COUNTS = [0, 1, 1000, 70000]
Op = dist.ReduceOp


def full(count, value, dtype):
    return torch.full((count,), value, dtype=dtype) if dtype != torch.bool else torch.full((count,), bool(value))


# ---- 1. closed forms -------------------------------------------------------
for dtype in DTYPES:
    for count in COUNTS:
        tag = f"{dtype} x {count}"
        forms = {Op.SUM: n * (n + 1) // 2, Op.PRODUCT: math.factorial(n), Op.MIN: 1, Op.MAX: n}
        if dtype.is_floating_point:
            forms[Op.AVG] = (n + 1) / 2
        for op, want in forms.items():
            if dtype in (torch.int8, torch.uint8) and op == Op.PRODUCT and n > 4:
                continue
            t = full(count, r + 1, dtype)
            dist.all_reduce(t, op=op)
            expect(f"allreduce {op} {tag}", t, full(count, want, dtype), 1e-2 if dtype in (torch.float16, torch.bfloat16) else 0)
        t = full(count, r, dtype)
        dist.broadcast(t, src=n - 1)
        expect(f"broadcast {tag}", t, full(count, n - 1, dtype))
        outs = [full(count, -1, dtype) for _ in range(n)]
        dist.all_gather(outs, full(count, r, dtype))
        for i in range(n):
            expect(f"allgather {tag} from {i}", outs[i], full(count, i, dtype))
        flat = full(n * count, -1, dtype)
        dist._all_gather_base(flat, full(count, r, dtype))
        expect(f"_allgather_base {tag}", flat, torch.cat([full(count, i, dtype) for i in range(n)]))
        out = full(count, -1, dtype)
        dist.reduce_scatter(out, [full(count, (r + 1) * (j + 1), dtype) for j in range(n)])
        expect(f"reduce_scatter {tag}", out, full(count, (r + 1) * n * (n + 1) // 2, dtype))
        out = full(count, -1, dtype)
        dist._reduce_scatter_base(out, torch.cat([full(count, (r + 1) * (j + 1), dtype) for j in range(n)]))
        expect(f"_reduce_scatter_base {tag}", out, full(count, (r + 1) * n * (n + 1) // 2, dtype))
        t = full(count, r + 1, dtype)
        dist.reduce(t, dst=n - 1, op=Op.SUM)
        expect(f"reduce {tag}", t, full(count, n * (n + 1) // 2 if r == n - 1 else r + 1, dtype))
        gathered = [full(count, -1, dtype) for _ in range(n)] if r == 0 else None
        dist.gather(full(count, r, dtype), gather_list=gathered, dst=0)
        if r == 0:
            for i in range(n):
                expect(f"gather {tag} from {i}", gathered[i], full(count, i, dtype))
        out = full(count, -1, dtype)
        dist.scatter(out, scatter_list=[full(count, j, dtype) for j in range(n)] if r == n - 1 else None, src=n - 1)
        expect(f"scatter {tag}", out, full(count, r, dtype))

# all-to-all with uneven splits: rank i sends rank j (i + j + 1) rows of 100 i + j.
for dtype in (torch.float32, torch.int64, torch.uint8):
    send = torch.cat([torch.full((r + j + 1, 3), 100 * r + j, dtype=torch.int64) for j in range(n)]).to(dtype)
    recv = torch.full((sum(i + r + 1 for i in range(n)), 3), -1, dtype=torch.int64).to(dtype)
    dist.all_to_all_single(recv, send, output_split_sizes=[i + r + 1 for i in range(n)],
                           input_split_sizes=[r + j + 1 for j in range(n)])
    want = torch.cat([torch.full((i + r + 1, 3), 100 * i + r, dtype=torch.int64) for i in range(n)]).to(dtype)
    expect(f"alltoall_base {dtype}", recv, want)
    equal = torch.arange(n * 2, dtype=torch.int64).to(dtype) + 10 * r
    got = torch.empty_like(equal)
    dist.all_to_all_single(got, equal)
    expect(f"alltoall_base equal splits {dtype}", got,
           torch.tensor([10 * i + 2 * r + k for i in range(n) for k in range(2)], dtype=torch.int64).to(dtype))
    outs = [torch.full((r + 1, 2), -1, dtype=torch.int64).to(dtype) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((j + 1, 2), 10 * r + j, dtype=torch.int64).to(dtype) for j in range(n)])
    for i in range(n):
        expect(f"alltoall {dtype} from {i}", outs[i], torch.full((r + 1, 2), 10 * i + r, dtype=torch.int64).to(dtype))

# bool: or and and; complex: pairs of reals.
b = torch.tensor([r == 0, True, False])
dist.all_reduce(b, op=Op.SUM)
expect("allreduce bool SUM (or)", b, torch.tensor([True, True, False]))
b = torch.tensor([r == 0, True, False])
dist.all_reduce(b, op=Op.MIN)
expect("allreduce bool MIN (and)", b, torch.tensor([n == 1, True, False]))
c = torch.tensor([complex(r, -r), complex(1, 2)], dtype=torch.complex64)
dist.all_reduce(c)
expect("allreduce complex64", c, torch.tensor([complex(n * (n - 1) / 2, -n * (n - 1) / 2), complex(n, 2 * n)],
                                                dtype=torch.complex64))
c = torch.full((4,), complex(r, 1), dtype=torch.complex128)
dist.broadcast(c, src=0)
expect("broadcast complex128", c, torch.full((4,), complex(0, 1), dtype=torch.complex128))

# Non-contiguous inputs and outputs.
t = (torch.arange(12.).view(3, 4) * (r + 1)).t()
dist.all_reduce(t)
expect("allreduce non-contiguous", t, (torch.arange(12.).view(3, 4) * n * (n + 1) / 2).t())
base = torch.full((4, 2 * n), -1.0)
outs = [base[:, 2 * i:2 * i + 2] for i in range(n)]
dist.all_gather(outs, torch.full((2, 4), float(r)).t())
for i in range(n):
    expect(f"allgather into column slices from {i}", base[:, 2 * i:2 * i + 2], torch.full((4, 2), float(i)))
t = torch.full((6, 4), float(r)).t()
dist.broadcast(t, src=0)
expect("broadcast non-contiguous", t, torch.zeros(4, 6))

# Copies back on the backend's thread keep the caller's inference mode
# (a list output of a large allgather is filled there).
with torch.inference_mode():
    outs = [torch.empty(100003) for _ in range(n)]
    dist.all_gather(outs, torch.full((100003,), float(r)))
    for i in range(n):
        expect(f"allgather under inference_mode from {i}", outs[i], torch.full((100003,), float(i)))

# Point to point: a ring with a tag, then receives from any source.
t = torch.full((5,), float(r))
dst, src = (r + 1) % n, (r - 1) % n
if r % 2 == 0:
    dist.send(t, dst, tag=7)
    got = torch.empty(5)
    dist.recv(got, src, tag=7)
else:
    got = torch.empty(5)
    dist.recv(got, src, tag=7)
    dist.send(t, dst, tag=7)
expect("send/recv ring", got, torch.full((5,), float(src)))
if r == 0:
    seen = set()
    for _ in range(n - 1):
        got = torch.empty(2, dtype=torch.int64)
        sender = dist.recv(got)
        expect(f"recv from any source: from {sender}", got, torch.tensor([sender, 2 * sender]))
        seen.add(sender)
    if seen != set(range(1, n)):
        fail(f"recv from any source heard {sorted(seen)}, want 1..{n - 1}")
else:
    dist.send(torch.tensor([r, 2 * r]), 0)
work = dist.irecv(torch.empty(1), src=src, tag=9) if n > 1 else None
if n > 1:
    dist.isend(torch.tensor([float(r)]), dst, tag=9).wait()
    work.wait()

# Async works: wait() and the future hold the outputs.
t = torch.ones(100)
work = dist.all_reduce(t, async_op=True)
value = work.get_future().wait()
expect("future of allreduce", value[0], torch.full((100,), float(n)))
work.wait()
assert work.is_completed()
dist.barrier()
# dist.monitored_barrier() lets only gloo through; the group's own method reaches ours.
dist.distributed_c10d._get_default_group().monitored_barrier()

# ---- 2. what is not supported ----------------------------------------------
def refused(name, call, needle):
    global checks
    try:
        call()
    except RuntimeError as e:
        if needle not in str(e):
            fail(f"{name}: the error does not name {needle!r}: {e}")
        checks += 1
        return
    fail(f"{name}: no error")


refused("BAND", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=Op.BAND), "BAND")
refused("complex MAX", lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=Op.MAX), "complex")
refused("allgather_coalesced",
        lambda: dist.all_gather_coalesced([[torch.ones(1)] * n], [torch.ones(1)]), "allgather_coalesced")
t = torch.ones(3)
dist.all_reduce(t)
expect("allreduce after refused calls", t, torch.full((3,), float(n)))


# ---- 3. DDP: the same parameters as over gloo ------------------------------
def train(make, shape, group, steps=20, zero=False):
    torch.manual_seed(0)
    model = make()
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=1)
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9,
                                      process_group=group)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + r)
    for _ in range(steps):
        x = torch.randn(*shape, generator=gen)
        y = torch.randint(0, 10, (shape[0],), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10))


for name, make, shape in (("mlp", mlp, (16, 64)), ("cnn", cnn, (8, 1, 12, 12))):
    ours = train(make, shape, None)
    theirs = train(make, shape, gloo)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        expect(f"DDP {name} parameter {i}: ddp against gloo", a, b, 1e-6)
    zero = train(make, shape, None, zero=True)
    for i, (a, b) in enumerate(zip(zero, theirs)):
        expect(f"ZeroRedundancyOptimizer {name} parameter {i}: ddp against DDP + SGD over gloo", a, b, 1e-6)

dist.barrier()
print(f"rank {r}/{n}: {checks} checks passed", flush=True)
dist.destroy_process_group()
