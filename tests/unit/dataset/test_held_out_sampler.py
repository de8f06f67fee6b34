"""Held-out data on several ranks: every row is scored once, and the ranks run the same number of batches."""
import pytest
from torch.utils.data import DataLoader

from coati.dataset.sampler import HeldOutBatchSampler, TokenBudgetBatchSampler, held_out_batches


def _scored_rows(loaders):
    """The rows each rank scores, through `held_out_batches` as the trainers read them."""
    return [[row for batch, scored in held_out_batches(loader) if scored for row in batch.tolist()] for loader in loaders]


@pytest.mark.parametrize("rows, batch_size, ranks", [(3, 4, 2), (3, 1, 2), (10, 3, 4), (1, 2, 3), (8, 2, 2)])
def test_every_row_is_scored_once_and_ranks_run_as_many_batches(rows, batch_size, ranks):
    loaders = [DataLoader(range(rows), batch_sampler=HeldOutBatchSampler(rows, batch_size, ranks, rank))
               for rank in range(ranks)]
    scored = _scored_rows(loaders)
    assert sorted(row for rank in scored for row in rank) == list(range(rows))
    assert len({len(loader) for loader in loaders}) == 1
    assert len(loaders[0]) == -(-(-(-rows // ranks)) // batch_size)   # what DistributedSampler's padding gave


def test_rows_split_as_distributed_sampler_splits_them_where_it_needs_no_padding():
    assert [list(HeldOutBatchSampler(8, 2, 2, rank)) for rank in range(2)] == [[[0, 2], [4, 6]], [[1, 3], [5, 7]]]


def test_the_token_budget_samplers_filler_step_is_not_scored():
    lengths = [30, 30, 30, 30, 30]               # 2 ranks, 60 tokens: steps of 2 + 2 rows, then 1 row and a filler
    samplers = [TokenBudgetBatchSampler(lengths, 60, 2, rank, shuffle=False) for rank in range(2)]
    loaders = [DataLoader(range(5), batch_sampler=sampler) for sampler in samplers]
    assert [len(loader) for loader in loaders] == [2, 2]
    assert [sampler.real_batches for sampler in samplers] == [2, 1]
    assert sorted(row for rank in _scored_rows(loaders) for row in rank) == list(range(5))


def test_reading_the_held_out_data_leaves_the_global_rng_alone(world_of_one):
    """Evaluation between training steps must not move the random stream that sampling (and a resumed run) reads."""
    import torch
    from colossalai.booster.plugin import TorchDDPPlugin

    from coati.cli.runner import build_held_out_dataloader

    loader = build_held_out_dataloader(TorchDDPPlugin(), list(range(5)), 2, torch.utils.data.default_collate)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert [len(batch) for batch, _ in held_out_batches(loader)] == [2, 2, 1]
    assert torch.equal(torch.rand(3), expected)
