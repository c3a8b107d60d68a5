"""ddp_torch: the ddp framework's collectives as a backend of torch.distributed.

    import ddp_torch                                   # registers the backend "ddp"
    torch.distributed.init_process_group(backend="ddp")

A group of the backend "ddp" runs ddp's gloo backend under c10d's
ProcessGroup interface: shared memory between the ranks of one host, TCP
between hosts, hierarchical collectives when both. It rendezvouses through
the store torch.distributed gives it (init_method, or MASTER_ADDR and
MASTER_PORT), like any backend, so scripts written for backend="gloo" run
with backend="ddp" unchanged. CPU tensors; every dtype moves (narrow
integers and bool widened to int32, complex as pairs of reals); reductions
SUM, AVG, PRODUCT, MIN and MAX.

`python3 -m ddp_torch.run --nproc-per-node N script.py ...` starts N ranks
of an unchanged script with this module imported first (ddp_torch/run.py).
"""

import torch
import torch.distributed as _dist

if not _dist.is_available():
    raise ImportError("ddp_torch: this torch was built without torch.distributed")

try:
    from . import _C  # noqa: E402  (after torch: _C links torch's libraries)
except ImportError as e:
    raise ImportError(f"ddp_torch: cannot load its extension _C next to {__file__} ({e}). HINT: import the built "
                      "package (PYTHONPATH=<build>/python) or the installed one, not python/ddp_torch of the "
                      "source tree") from e

BACKEND = "ddp"


def _create_process_group(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


if BACKEND.upper() not in getattr(_dist.Backend, "_plugins", {}):
    _dist.Backend.register_backend(BACKEND, _create_process_group)


def describe(group=None):
    """What a "ddp" group runs on, e.g. "gloo: ... shared memory ..."; None for a group of another backend."""
    if group is None:
        group = _dist.distributed_c10d._get_default_group()
    return _C.describe(group)


__all__ = ["BACKEND", "describe"]
