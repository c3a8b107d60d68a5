"""python3 -m ddp_torch.run: start the ranks of a torch.distributed script, with ddp_torch imported.

    python3 -m ddp_torch.run --nproc-per-node 2 train.py [ARGS...]

Each rank is `python3 train.py ARGS...` with `import ddp_torch` done first,
so a script that calls init_process_group(backend="ddp") needs no import of
its own. The environment is torchrun's: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT. Across hosts, run it
on each with --nnodes, --node-rank, --master-addr and --master-port.

When a rank fails, the others are stopped (SIGTERM, then SIGKILL after
--kill-grace seconds) and the launcher exits with that rank's code, after a
line naming it. SIGINT and SIGTERM to the launcher are passed to every rank.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

_BOOT = (
    "import sys, runpy, os; import ddp_torch; "
    "sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0]))); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m ddp_torch.run",
                                description="Start the ranks of a torch.distributed script with ddp_torch imported.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="ranks on this host (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="hosts in the job (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this host's index (default 0)")
    p.add_argument("--master-addr", "--master_addr", default=None,
                   help="the host of rank 0 (default 127.0.0.1, or $MASTER_ADDR)")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="a free port there (default: $MASTER_PORT, or one picked on a single host)")
    p.add_argument("--kill-grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL to the ranks left when one fails (default 5)")
    p.add_argument("script", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if a.nproc_per_node < 1 or a.nnodes < 1 or not 0 <= a.node_rank < a.nnodes:
        p.error(f"--nproc-per-node {a.nproc_per_node}, --nnodes {a.nnodes} and --node-rank {a.node_rank}: "
                "need at least one rank and host, and 0 <= node rank < nnodes")
    if not os.path.isfile(a.script):
        p.error(f"no script {a.script}")
    return a


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def main(argv=None):
    a = _parse(sys.argv[1:] if argv is None else argv)
    addr = a.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = a.master_port or int(os.environ.get("MASTER_PORT", "0"))
    if not port:
        if a.nnodes > 1:
            print("ddp_torch.run: a job of several hosts needs --master-port (or MASTER_PORT), the same on every host",
                  file=sys.stderr)
            return 2
        port = _free_port()
    world = a.nnodes * a.nproc_per_node
    ranks = []
    for local in range(a.nproc_per_node):
        rank = a.node_rank * a.nproc_per_node + local
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                   LOCAL_WORLD_SIZE=str(a.nproc_per_node), GROUP_RANK=str(a.node_rank), MASTER_ADDR=addr,
                   MASTER_PORT=str(port))
        ranks.append((rank, subprocess.Popen([sys.executable, "-c", _BOOT, a.script] + a.args, env=env)))

    stopping = []

    def forward(signum, _frame):
        stopping.append(signum)
        for _, proc in ranks:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)

    status = 0
    while True:
        running = [(r, p) for r, p in ranks if p.poll() is None]
        failed = [(r, p) for r, p in ranks if p.returncode not in (None, 0)]
        if failed and not status:
            rank, proc = failed[0]
            code = proc.returncode
            why = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            status = 128 - code if code < 0 else code
            if running:
                print(f"ddp_torch.run: rank {rank} (pid {proc.pid}) {why}; stopping the other "
                      f"{len(running)} rank(s)", file=sys.stderr)
                for _, p in running:
                    p.terminate()
                deadline = time.monotonic() + a.kill_grace
                while time.monotonic() < deadline and any(p.poll() is None for _, p in running):
                    time.sleep(0.05)
                for r, p in running:
                    if p.poll() is None:
                        print(f"ddp_torch.run: rank {r} (pid {p.pid}) did not stop within {a.kill_grace} s; "
                              "killing it", file=sys.stderr)
                        p.kill()
                for _, p in running:
                    p.wait()
            else:
                print(f"ddp_torch.run: rank {rank} (pid {proc.pid}) {why}", file=sys.stderr)
            break
        if not running:
            break
        time.sleep(0.05)
    if stopping and not status:
        status = 128 + stopping[0]
    return status


if __name__ == "__main__":
    sys.exit(main())
