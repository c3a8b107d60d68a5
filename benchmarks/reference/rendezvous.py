"""How the reference scripts' ranks find each other: a file store, fresh for
each job, instead of a fixed MASTER_PORT.

A fixed port is shared by every job on the machine. When ctest runs two
reference scripts at once, the second one's rank 1 can join the first one's
store and wait for a peer that never comes. A file that only this job knows
cannot be joined by another job, and needs no free port.
"""
import contextlib
import datetime
import faulthandler
import os
import os
import tempfile

import torch.distributed as dist


@contextlib.contextmanager
def job_store():
    """Yields the path of an empty store file for one job; removes it after."""
    fd, path = tempfile.mkstemp(prefix="ddp-reference-store-")
    os.close(fd)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def watchdog():
    """With DDP_REFERENCE_WATCHDOG_S set (the smoke test sets it), a process
    still running after that many seconds prints every thread's stack and
    exits, so a hang shows where it is instead of running into a kill."""
    seconds = int(os.environ.get("DDP_REFERENCE_WATCHDOG_S", "0") or 0)
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, exit=True)


def init(backend, rank, world, store):
    """Joins the job of `store`. A peer or collective that does not answer in
    two minutes fails the job (PyTorch's default would wait 30 minutes)."""
    watchdog()
    dist.init_process_group(backend, init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=2))
