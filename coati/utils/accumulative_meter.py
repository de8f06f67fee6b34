"""Running means of training metrics, and their one reduction across ranks per logged step."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Tuple

from coati.utils.comm import collective_device, is_distributed

if TYPE_CHECKING:
    import torch.distributed as dist


class AccumulativeMeanVariable:
    """A running mean: `add(value, count_update)` adds a total that stands for `count_update` samples."""

    def __init__(self) -> None:
        self._sum = 0.0
        self._count = 0.0

    def add(self, value: float, count_update: float = 1) -> None:
        self._sum += float(value)
        self._count += float(count_update)

    def get(self) -> float:
        """Sum over count; 0 when nothing was counted."""
        return self._sum / self._count if self._count else 0.0

    def reset(self) -> None:
        self._sum = 0.0
        self._count = 0.0

    @property
    def sum(self) -> float:
        return self._sum

    @property
    def count(self) -> float:
        return self._count


class AccumulativeMeanMeter:
    """`AccumulativeMeanVariable`s keyed by metric name; a name never added reads as 0."""

    def __init__(self) -> None:
        self.variable_dict: Dict[str, AccumulativeMeanVariable] = {}

    def add(self, name: str, value: float, count_update: float = 1) -> None:
        self.variable_dict.setdefault(name, AccumulativeMeanVariable()).add(value, count_update)

    def get(self, name: str) -> float:
        variable = self.variable_dict.get(name)
        return variable.get() if variable is not None else 0.0

    def reset(self) -> None:
        for variable in self.variable_dict.values():
            variable.reset()

    def names(self) -> list:
        return sorted(self.variable_dict)


def all_reduce_meter(meter: AccumulativeMeanMeter, group: Optional[dist.ProcessGroup] = None) -> Dict[str, float]:
    """Means over all ranks of every metric in `meter` (sum of sums over sum of counts), in float64.

    Call it once per logged step, on every rank: it is a collective. Ranks may hold different metric
    names; a name missing on a rank counts as nothing there.
    """
    return {name: (s / c if c else 0.0) for name, (s, c) in all_reduce_totals(meter, group).items()}


def all_reduce_totals(meter: AccumulativeMeanMeter,
                      group: Optional[dist.ProcessGroup] = None) -> Dict[str, Tuple[float, float]]:
    """(sum, count) over all ranks of every metric any rank holds; a collective, like `all_reduce_meter`."""
    import torch
    import torch.distributed as dist

    names = meter.names()
    if not is_distributed() or dist.get_world_size(group) == 1:
        return {name: (meter.variable_dict[name].sum, meter.variable_dict[name].count) for name in names}
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, names, group=group)
    names = sorted(set().union(*gathered))
    device = collective_device(group)
    totals = torch.tensor(
        [[meter.variable_dict[n].sum, meter.variable_dict[n].count] if n in meter.variable_dict else [0.0, 0.0]
         for n in names],
        dtype=torch.float64,
        device=device,
    ).reshape(-1, 2)
    dist.all_reduce(totals, group=group)
    return {name: (s, c) for name, (s, c) in zip(names, totals.tolist())}

