"""python3 -m ddp_torch.run: start the ranks of a torch.distributed script, with ddp_torch imported.

    python3 -m ddp_torch.run --nproc-per-node 2 train.py [ARGS...]

Each rank is `python3 train.py ARGS...` with `import ddp_torch` done first,
so a script that calls init_process_group(backend="ddp") needs no import of
its own. The environment is torchrun's: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT. Across hosts, run it
on each with --nnodes, --node-rank, --master-addr and --master-port.

When a rank fails, the others are stopped (SIGTERM, then SIGKILL after
--kill-grace seconds) and the launcher exits with that rank's code, after a
line naming it. SIGINT and SIGTERM to the launcher are passed to every rank,
and ranks still running --kill-grace seconds later are killed.
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
    ranks = {}  # pid -> (rank, Popen)
    stopping = []  # signals forwarded to the ranks

    def forward(signum, _frame):
        stopping.append((signum, time.monotonic()))
        for _, proc in ranks.values():
            if proc.returncode is None:
                proc.send_signal(signum)

    # Before the first rank starts: a signal meanwhile reaches those started.
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    try:
        for local in range(a.nproc_per_node):
            rank = a.node_rank * a.nproc_per_node + local
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                       LOCAL_WORLD_SIZE=str(a.nproc_per_node), GROUP_RANK=str(a.node_rank), MASTER_ADDR=addr,
                       MASTER_PORT=str(port))
            proc = subprocess.Popen([sys.executable, "-c", _BOOT, a.script] + a.args, env=env)
            ranks[proc.pid] = (rank, proc)
    except OSError as e:
        print(f"ddp_torch.run: cannot start rank {rank}: {e}", file=sys.stderr)
        for _, proc in ranks.values():
            proc.kill()
            proc.wait()
        return 1

    def reap():
        """The ranks that ended since the last call, in the order the kernel reports them."""
        ended = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return ended
            if pid == 0:
                return ended
            if pid in ranks:
                rank, proc = ranks[pid]
                proc.returncode = os.waitstatus_to_exitcode(status)
                ended.append((rank, proc))

    def running():
        return [(r, p) for r, p in ranks.values() if p.returncode is None]

    def stop_rest(grace):
        for _, p in running():
            p.terminate()
        deadline = time.monotonic() + grace
        while running() and time.monotonic() < deadline:
            reap()
            time.sleep(0.05)
        for r, p in running():
            print(f"ddp_torch.run: rank {r} (pid {p.pid}) did not stop within {grace} s; killing it", file=sys.stderr)
            p.kill()
        while running():
            reap()
            time.sleep(0.01)

    status = 0
    while running():
        for rank, proc in reap():
            code = proc.returncode
            if code == 0 or status:
                continue
            why = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            status = 128 - code if code < 0 else code
            left = running()
            if left:
                print(f"ddp_torch.run: rank {rank} (pid {proc.pid}) {why}; stopping the other {len(left)} rank(s)",
                      file=sys.stderr)
                stop_rest(a.kill_grace)
            else:
                print(f"ddp_torch.run: rank {rank} (pid {proc.pid}) {why}", file=sys.stderr)
        if stopping and running() and time.monotonic() - stopping[0][1] > a.kill_grace:
            for r, p in running():
                print(f"ddp_torch.run: rank {r} (pid {p.pid}) still runs {a.kill_grace} s after "
                      f"{_signal_name(stopping[0][0])}; killing it", file=sys.stderr)
                p.kill()
            stopping[0] = (stopping[0][0], float("inf"))
        time.sleep(0.05)
    if stopping and not status:
        status = 128 + stopping[0][0]
    return status


if __name__ == "__main__":
    sys.exit(main())
