"""Distributed samplers that can start part-way through an epoch, for exact mid-epoch resume: one of rows, one of
micro-batches filled up to a token budget; and one for held-out data, which scores every row once."""
import math
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import torch
from torch.utils.data import DistributedSampler

from coati.utils.errors import CoatiUsageError


class StatefulDistributedSampler(DistributedSampler):
    """`DistributedSampler` whose epoch starts after `start_index` of this rank's samples.

    The order of an epoch depends only on the seed and the epoch, so skipping the samples already
    consumed continues with exactly the next unseen ones. The skip applies to the epoch in progress:
    the trainer resets it to 0 when that epoch ends.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.start_index = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start_index:])

    def __len__(self) -> int:
        return max(self.num_samples - self.start_index, 0)

    def set_start_index(self, start_index: int) -> None:
        self.start_index = start_index


class HeldOutBatchSampler:
    """Held-out batches in order, each row on one rank only: rank r takes rows r, r + R, ... in batches of
    `batch_size`. Every rank runs as many batches as the rank with the most (so that collectives stay in step); a rank
    with fewer ends with filler batches of one row, which `held_out_batches` leaves unscored. `DistributedSampler`
    would instead repeat rows to even the ranks out, and those rows would count twice in the held-out metrics."""

    def __init__(self, num_rows: int, batch_size: int, num_replicas: int, rank: int) -> None:
        own = list(range(rank, num_rows, num_replicas))
        self.batches = [own[start:start + batch_size] for start in range(0, len(own), batch_size)]
        self.real_batches = len(self.batches)
        """How many of this rank's batches hold rows of its own; the rest are filler."""
        most = math.ceil(math.ceil(num_rows / num_replicas) / batch_size)
        self.batches += [[0]] * (most - self.real_batches)

    def __iter__(self) -> Iterator[List[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def held_out_batches(loader: Any) -> Iterator[Tuple[Any, bool]]:
    """Each batch of a held-out loader with whether to score it: False for the filler batches of
    `HeldOutBatchSampler` and `TokenBudgetBatchSampler`, which a rank runs only to keep in step with the others."""
    real = getattr(loader.batch_sampler, "real_batches", len(loader))
    for index, batch in enumerate(loader):
        yield batch, index < real


def row_tokens(dataset: Any, max_length: int = 0) -> List[int]:
    """Tokens each row of a prepared dataset packs to: its `*input_ids` columns (chosen and rejected for a
    preference row), each cut to `max_length` as the collator cuts it. Read from the Arrow columns, not decoded."""
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")
    totals = [0] * len(dataset)
    for column in (c for c in dataset.column_names if c.endswith("input_ids")):
        for i, n in enumerate(pc.list_value_length(table[column]).to_pylist()):
            totals[i] += min(n, max_length) if max_length else n
    return totals


def longest_sequence(dataset: Any) -> int:
    """The most tokens in one sequence of a prepared dataset (one value of an `*input_ids` column; 0 when empty)."""
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")
    lengths = [pc.max(pc.list_value_length(table[c])).as_py() for c in dataset.column_names if c.endswith("input_ids")]
    return max((n for n in lengths if n is not None), default=0)


class TokenBudgetBatchSampler:
    """Micro-batches of whole rows filled up to `max_tokens` packed tokens on every rank, for `--max_tokens_per_batch`.

    One plan per epoch over the global order (shuffled by seed and epoch, as `DistributedSampler`): each row goes to
    the rank whose micro-batch holds the fewest tokens, and when it fits there no longer, the next step begins. So
    every rank takes the same number of steps, and each step's ranks hold similar token counts. In the last step a
    rank left without a row gets the epoch's first rows again (as `DistributedSampler` pads; `real_batches` leaves that
    step out of held-out metrics). Resumable like
    `StatefulDistributedSampler`: `set_start_index(n)` skips the steps in which rank 0 took its first n rows."""

    def __init__(self, lengths: Sequence[int], max_tokens: int, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0) -> None:
        too_long = next((i for i, n in enumerate(lengths) if n > max_tokens), None)
        if too_long is not None:
            raise CoatiUsageError(f"--max_tokens_per_batch {max_tokens}: row {too_long} has {lengths[too_long]} tokens "
                                  "and fits no micro-batch; raise it, or cut rows with --max_length")
        self.lengths, self.max_tokens = list(lengths), max_tokens
        self.num_replicas, self.rank, self.shuffle, self.seed = num_replicas, rank, shuffle, seed
        self.epoch, self.start_index = 0, 0
        self._plans: Dict[int, List[List[List[int]]]] = {}
        self._filled: Dict[int, List[bool]] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start_index(self, start_index: int) -> None:
        self.start_index = start_index

    def _order(self) -> List[int]:
        if not self.shuffle:
            return list(range(len(self.lengths)))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.lengths), generator=generator).tolist()

    def plan(self) -> List[List[List[int]]]:
        """This epoch's steps, each a list of row indices per rank."""
        if self.epoch not in self._plans:
            self._plans = {self.epoch: self._make_plan()}
        return self._plans[self.epoch]

    @property
    def real_batches(self) -> int:
        """This rank's steps that hold rows of its own: all but a last step filled with a repeated row."""
        plan = self.plan()
        return len(plan) - self._skipped_steps(plan) - int(self._filled[self.epoch][self.rank])

    def _make_plan(self) -> List[List[List[int]]]:
        order, steps = self._order(), []
        rows: List[List[int]] = [[] for _ in range(self.num_replicas)]
        loads = [0] * self.num_replicas
        for index in order:
            target = loads.index(min(loads))
            if loads[target] + self.lengths[index] > self.max_tokens:
                steps.append(rows)
                rows, loads, target = [[] for _ in range(self.num_replicas)], [0] * self.num_replicas, 0
            rows[target].append(index)
            loads[target] += self.lengths[index]
        self._filled = {self.epoch: [False] * self.num_replicas}
        if any(rows):
            spare = iter(order * self.num_replicas)
            steps.append([bin_ or [next(spare)] for bin_ in rows])
            self._filled[self.epoch] = [not bin_ for bin_ in rows]
        return steps

    def _skipped_steps(self, plan: List[List[List[int]]]) -> int:
        seen = 0
        for step, ranks in enumerate(plan):
            if seen >= self.start_index:
                return step
            seen += len(ranks[0])
        return len(plan)

    def __iter__(self) -> Iterator[List[int]]:
        plan = self.plan()
        return iter([ranks[self.rank] for ranks in plan[self._skipped_steps(plan):]])

    def __len__(self) -> int:
        plan = self.plan()
        return len(plan) - self._skipped_steps(plan)
