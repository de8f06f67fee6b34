"""Small collective helpers that also work when no process group is set up (a plain `python` run)."""
import os
from typing import Any, List, Sequence

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_rank_0() -> bool:
    return rank() == 0


def is_local_rank_0() -> bool:
    """True on one process per node: the one that prints launch-time errors."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def gather_lists(values: Sequence[Any]) -> List[Any]:
    """Every rank's `values` (picklable), concatenated in rank order; this rank's alone without a group."""
    if not is_distributed():
        return list(values)
    gathered: List[List[Any]] = [[] for _ in range(world_size())]
    dist.all_gather_object(gathered, list(values))
    return [v for part in gathered for v in part]


def all_reduce_sums(values: Sequence[float]) -> List[float]:
    """Each value summed over every rank (float64); this rank's values alone without a group."""
    if not is_distributed() or world_size() == 1:
        return [float(v) for v in values]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    totals = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return totals.tolist()
