"""A killed or a hung rank on the backend "ddp": the others' next collective raises a RuntimeError naming it.

Run by ctest: /usr/bin/python3 kill_test.py (PYTHONPATH holds the built ddp_torch).
Three ranks, each a process of this script in the role "worker", twice:
- "kill": rank 2 kills itself with SIGKILL after one allreduce, the others
  go on reducing. Their group timeout is 60 s, so an error within 15 s
  comes from noticing the dead peer, not from waiting it out.
- "hang": rank 2 sleeps instead of reducing, with a group timeout of 3 s:
  the others' error comes by the timeout and names rank 2 (killed after).
"""
import os
import signal
import socket
import subprocess
import sys
import time

WORLD, VICTIM, LIMIT_S = 3, 2, 15.0


def worker(mode):
    import datetime
    import torch
    import torch.distributed as dist
    import ddp_torch  # noqa: F401

    dist.init_process_group(backend="ddp", timeout=datetime.timedelta(seconds=60 if mode == "kill" else 3))
    rank = dist.get_rank()
    t = torch.ones(1000)
    dist.all_reduce(t)
    dist.barrier()
    if rank == VICTIM:
        if mode == "hang":
            time.sleep(60)  # killed by the driver once the others have failed
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        for _ in range(100000):
            dist.all_reduce(t)
            if time.monotonic() - started > 3 * LIMIT_S:
                break
    except RuntimeError as e:
        print(f"CAUGHT after {time.monotonic() - started:.2f} s: {str(e).splitlines()[0]}", flush=True)
        os._exit(0)
    print(f"NOT CAUGHT after {time.monotonic() - started:.2f} s", flush=True)
    os._exit(1)


def scenario(mode):
    print(f"=== {mode}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, "worker", mode], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    failed = False
    for rank, proc in enumerate(procs):
        if rank == VICTIM and mode == "hang":
            proc.kill()
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            print(f"FAILED: rank {rank} still running after 60 s (a hang)")
            return 1
        print(f"--- rank {rank} (exit {proc.returncode})\n{out.strip()}")
        if rank == VICTIM:
            if proc.returncode != -signal.SIGKILL:
                print(f"FAILED: rank {VICTIM} exited with {proc.returncode}, not SIGKILL")
                failed = True
            continue
        caught = [line for line in out.splitlines() if line.startswith("CAUGHT after ")]
        if proc.returncode != 0 or not caught:
            print(f"FAILED: rank {rank} raised no RuntimeError after rank {VICTIM} died")
            failed = True
            continue
        seconds = float(caught[0].split()[2])
        if seconds > LIMIT_S:
            print(f"FAILED: rank {rank} noticed after {seconds} s (limit {LIMIT_S} s)")
            failed = True
        if f"rank {VICTIM}" not in caught[0]:
            print(f"FAILED: rank {rank}'s error does not name rank {VICTIM}: {caught[0]}")
            failed = True
    if failed:
        return 1
    print(f"ok ({mode}): ranks other than {VICTIM} raised a RuntimeError naming it")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2])
    sys.exit(scenario("kill") or scenario("hang"))
