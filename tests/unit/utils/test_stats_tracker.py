"""StatsTracker in one process: scoped names, scalar means, masked tensor stats and timings (the reduction across
ranks: e2e/test_stats_tracker_e2e.py)."""
import time

import pytest
import torch

from coati.utils.stats_tracker import StatsTracker


def test_scopes_scalars_and_masked_stats_in_one_process():
    stats = StatsTracker()
    with stats.scope("rollout"):
        stats.scalar(reward=1.0)
        stats.scalar(reward=0.0)
        with stats.scope("group"):
            stats.add("loss", 6.0, 3)
        stats.denominator(correct=torch.tensor([True, False, True, False]))
        stats.stat(denominator="correct", length=torch.tensor([4.0, 100.0, 8.0, 1.0]))
    assert stats.export() == {"rollout/reward": 0.5, "rollout/group/loss": 2.0,
                              "rollout/length@correct/avg": 6.0, "rollout/length@correct/min": 4.0,
                              "rollout/length@correct/max": 8.0}
    assert stats.is_empty() and stats.export() == {}


def test_an_empty_denominator_leaves_its_stat_out_and_errors_are_named():
    stats = StatsTracker()
    stats.denominator(correct=torch.zeros(3, dtype=torch.bool))
    stats.stat(denominator="correct", length=torch.ones(3))
    assert stats.export() == {}
    with pytest.raises(KeyError, match="no denominator 'missing'"):
        stats.stat(denominator="missing", length=torch.ones(3))
    with pytest.raises(TypeError, match="must be a boolean tensor"):
        stats.denominator(bad=torch.ones(3))
    stats.denominator(mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="has shape"):
        stats.stat(denominator="mask", length=torch.ones(4))


def test_record_timing_measures_the_block():
    stats = StatsTracker()
    with stats.scope("rollout"), stats.record_timing("gen"):
        time.sleep(0.05)
    assert 0.05 <= stats.export()["rollout/time/gen"] < 1.0
