"""One step's metrics under scoped names (`StatsTracker`), kept as running means (`AccumulativeMeanMeter`) and
reduced across ranks once per step.

    stats = StatsTracker()
    with stats.scope("rollout"):
        stats.scalar(reward=0.5)                                  # rollout/reward: mean over the step
        stats.denominator(correct=rewards > 0, wrong=rewards <= 0)
        stats.stat(denominator="correct", length=lengths)         # rollout/length@correct/{avg,min,max}
        with stats.record_timing("gen"):                          # rollout/time/gen: seconds, mean over the step
            ...
    metrics = stats.export()                                      # a collective: every rank calls it
"""
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from coati.utils.comm import collective_device, is_distributed


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


class StatsTracker:
    """Scalars averaged over the step (`scalar`, `add`), tensor stats reduced under a boolean mask
    (`denominator`, `stat`: mean, min and max over the masked elements), extremes (`minimum`, `maximum`) and
    timings. `export()` reduces every rank's records (sums and counts summed, min of mins, max of maxes) and
    starts a new step. A log window of several steps closes each with `end_step()`: `export()` then gives
    each step's mean equal weight."""

    def __init__(self) -> None:
        self._scopes: List[str] = []
        self._means = AccumulativeMeanMeter()
        self._mins: Dict[str, float] = {}
        self._maxs: Dict[str, float] = {}
        self._masks: Dict[str, torch.Tensor] = {}
        self._window = AccumulativeMeanMeter()
        self._steps = 0

    def _key(self, name: str) -> str:
        return "/".join([*self._scopes, name])

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Names recorded inside get the prefix `name/`; scopes nest."""
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def add(self, name: str, total: float, count: float = 1) -> None:
        """A total standing for `count` items (a batch's summed loss over its rows); exported as total / count."""
        self._means.add(self._key(name), float(total), count)

    def record(self, metrics: Dict[str, Tuple[float, float]]) -> None:
        """A batch's metrics as (total, count) by name, each added as `add` does."""
        for name, (total, count) in metrics.items():
            self.add(name, total, count)

    def scalar(self, **values: float) -> None:
        """Each value counts once; exported as the mean of the step's values."""
        for name, value in values.items():
            self.add(name, value, 1)

    def minimum(self, **values: float) -> None:
        """Exported as the least value recorded, on any rank, since the last export."""
        for name, value in values.items():
            key = self._key(name)
            self._mins[key] = min(self._mins.get(key, float("inf")), float(value))

    def maximum(self, **values: float) -> None:
        """Exported as the largest value recorded, on any rank, since the last export."""
        for name, value in values.items():
            key = self._key(name)
            self._maxs[key] = max(self._maxs.get(key, float("-inf")), float(value))

    def denominator(self, **masks: torch.Tensor) -> None:
        """Boolean masks that later `stat` calls reduce under, by name (in the current scope)."""
        for name, mask in masks.items():
            if mask.dtype != torch.bool:
                raise TypeError(f"denominator {name!r} must be a boolean tensor, got {mask.dtype}")
            self._masks[self._key(name)] = mask

    def stat(self, denominator: str, **tensors: torch.Tensor) -> None:
        """Each tensor (shaped like the mask) over the elements where `denominator` is True:
        `<name>@<denominator>/avg` (mean over the step's elements on every rank), `/min`, `/max`."""
        mask = self._masks.get(self._key(denominator))
        if mask is None:
            raise KeyError(f"no denominator {denominator!r} in scope {'/'.join(self._scopes) or '(top)'}")
        for name, tensor in tensors.items():
            if tensor.shape != mask.shape:
                raise ValueError(f"stat {name!r} has shape {tuple(tensor.shape)}, its denominator {tuple(mask.shape)}")
            values = tensor.detach()[mask].double()
            key = self._key(f"{name}@{denominator}")
            self._means.add(f"{key}/avg", values.sum().item(), values.numel())
            if values.numel():
                self._mins[f"{key}/min"] = min(self._mins.get(f"{key}/min", float("inf")), values.min().item())
                self._maxs[f"{key}/max"] = max(self._maxs.get(f"{key}/max", float("-inf")), values.max().item())

    def end_step(self) -> None:
        """Close one step of the log window: its means are kept apart, to be weighed equally at `export()`."""
        for name, variable in self._means.variable_dict.items():
            self._window.add(f"{name}{_STEP}{self._steps}", variable.sum, variable.count)
        self._means, self._steps = AccumulativeMeanMeter(), self._steps + 1

    def is_empty(self) -> bool:
        """True when nothing was recorded on this rank since the last export."""
        return not (self._means.names() or self._window.names() or self._mins or self._maxs)

    @contextmanager
    def record_timing(self, name: str) -> Iterator[None]:
        """Seconds spent in the block, under `time/<name>`; the mean over the step's blocks."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(f"time/{name}", time.perf_counter() - start)

    def export(self, group: Optional[dist.ProcessGroup] = None) -> Dict[str, float]:
        """Every rank's records of this step, reduced; a collective (call it on every rank). A mean whose
        elements were all masked out on every rank is left out. Resets for the next step."""
        if self._steps:
            self.end_step()
            result = _mean_of_step_means(all_reduce_totals(self._window, group))
        else:
            totals = all_reduce_totals(self._means, group)
            result = {name: total / count for name, (total, count) in totals.items() if count > 0}
        result.update(_reduce_extremes(self._mins, self._maxs, group))
        self._means, self._mins, self._maxs, self._masks = AccumulativeMeanMeter(), {}, {}, {}
        self._window, self._steps = AccumulativeMeanMeter(), 0
        return dict(sorted(result.items()))


_STEP = "\x00step"
"""Separates a metric's name from its step's index in a log window's keys."""


def _mean_of_step_means(totals: Dict[str, Tuple[float, float]]) -> Dict[str, float]:
    """Each metric's mean over the steps of the window that recorded it, from (sum, count) per `name<_STEP>i`."""
    means: Dict[str, List[float]] = {}
    for key, (total, count) in totals.items():
        if count > 0:
            means.setdefault(key.rsplit(_STEP, 1)[0], []).append(total / count)
    return {name: sum(values) / len(values) for name, values in means.items()}


def _reduce_extremes(mins: Dict[str, float], maxs: Dict[str, float],
                     group: Optional[dist.ProcessGroup]) -> Dict[str, float]:
    """The min over ranks of every `mins` entry and the max of every `maxs` entry (one gather of names)."""
    low, high = sorted(mins), sorted(maxs)
    if is_distributed() and dist.get_world_size(group) > 1:
        gathered: List[Optional[Tuple[List[str], List[str]]]] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, (low, high), group=group)
        low = sorted(set().union(*(g[0] for g in gathered)))
        high = sorted(set().union(*(g[1] for g in gathered)))
    result = {}
    device = collective_device(group) if is_distributed() else torch.device("cpu")
    for keys, values, op, neutral in ((low, mins, dist.ReduceOp.MIN, float("inf")),
                                      (high, maxs, dist.ReduceOp.MAX, float("-inf"))):
        if not keys:
            continue
        tensor = torch.tensor([values.get(n, neutral) for n in keys], dtype=torch.float64, device=device)
        if is_distributed() and dist.get_world_size(group) > 1:
            dist.all_reduce(tensor, op=op, group=group)
        result.update(zip(keys, tensor.tolist()))
    return result
