"""Small collective helpers that also work when no process group is set up (a plain `python` run).

No process group can exist before torch is imported, so these answer without importing it (the command line
and `--help` start before torch); the collectives import it where they run."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


def is_distributed() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _dist():
    import torch.distributed as dist

    return dist


def rank() -> int:
    return _dist().get_rank() if is_distributed() else 0


def world_size() -> int:
    return _dist().get_world_size() if is_distributed() else 1


def is_rank_0() -> bool:
    return rank() == 0


def is_local_rank_0() -> bool:
    """True on one process per node: the one that prints launch-time errors."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def barrier() -> None:
    if is_distributed():
        _dist().barrier()


def gather_lists(values: Sequence[Any]) -> List[Any]:
    """Every rank's `values` (picklable), concatenated in rank order; this rank's alone without a group."""
    if not is_distributed():
        return list(values)
    gathered: List[List[Any]] = [[] for _ in range(world_size())]
    _dist().all_gather_object(gathered, list(values))
    return [v for part in gathered for v in part]


def all_reduce_sums(values: Sequence[float]) -> List[float]:
    """Each value summed over every rank (float64); this rank's values alone without a group."""
    if not is_distributed() or world_size() == 1:
        return [float(v) for v in values]
    import torch

    totals = torch.tensor([float(v) for v in values], dtype=torch.float64, device=collective_device())
    _dist().all_reduce(totals)
    return totals.tolist()


def collective_device(group: Optional[dist.ProcessGroup] = None) -> torch.device:
    """The device that the group's backend reduces on: CUDA for NCCL, else CPU."""
    import torch

    if _dist().get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
