"""A distributed sampler that can start part-way through an epoch, for exact mid-epoch resume."""
from typing import Iterator

from torch.utils.data import DistributedSampler


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
