"""The layer bench's collectives that every rank calls in step: a failure on one rank raised on all (CaseError),
barriers, verdicts and relative errors over all ranks."""
import math

import torch
import torch.distributed as dist

from .runtime import FATAL, MegamoeError


class CaseError(RuntimeError):
    """A failure on some rank, raised on every rank; fatal: a device error, the layer is unusable afterwards."""

    def __init__(self, message, fatal):
        super().__init__(message)
        self.fatal = fatal


def rank_errors(fn):
    """fn() on this rank; returns its result and every rank's (error, fatal) or None. A collective: all ranks call."""
    try:
        result, mine = fn(), None
    except Exception as e:
        result, mine = None, ("%s: %s" % (type(e).__name__, e), isinstance(e, MegamoeError) and e.status in FATAL)
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, mine)
    return result, errors


def on_all_ranks(fn):
    """fn() on this rank; if it raised on any rank, CaseError on every rank (the ranks' collectives stay in step)."""
    result, errors = rank_errors(fn)
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise CaseError("; ".join("rank %d: %s" % (r, e[0]) for r, e in failed), any(e[1] for _, e in failed))
    return result


def sync_ranks():
    dist.barrier(device_ids=[torch.cuda.current_device()])
    torch.cuda.synchronize()


def all_ranks(flag):
    t = torch.tensor([int(flag)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def global_rel_err(y, ref):
    """||y - ref|| / ||ref|| (Frobenius) over the rows of all ranks."""
    s = torch.stack([(y.float() - ref).pow(2).sum(), ref.pow(2).sum()]).double()
    dist.all_reduce(s)
    d, r = s.tolist()
    return math.sqrt(d / r) if r > 0 else (0.0 if d == 0 else math.inf)
