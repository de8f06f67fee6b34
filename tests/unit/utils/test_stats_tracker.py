"""StatsTracker: scoped names, scalar means, masked tensor stats, timings, and the reduction across ranks."""
import time

import pytest
import torch

from coati.utils.stats_tracker import StatsTracker
from conftest import dist_script_result


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


@pytest.mark.slow
def test_export_reduces_across_two_ranks_as_computed_by_hand():
    reduced = dist_script_result("stats_reduce.py")
    assert reduced["rollout/reward"] == pytest.approx((2 / 3 + 0.0) / 2)   # one scalar per rank, averaged
    assert reduced["rollout/only_rank1"] == pytest.approx(5.0)
    # correct lengths: rank 0's 4 and 6; rank 1 has none
    assert reduced["rollout/length@correct/avg"] == pytest.approx(5.0)
    assert reduced["rollout/length@correct/min"] == 4.0 and reduced["rollout/length@correct/max"] == 6.0
    # wrong lengths: rank 0's 9, rank 1's 3 and 12
    assert reduced["rollout/length@wrong/avg"] == pytest.approx((9 + 3 + 12) / 3)
    assert reduced["rollout/length@wrong/min"] == 3.0 and reduced["rollout/length@wrong/max"] == 12.0
    # a window of two steps: each step's mean over both ranks, then the steps weighted equally
    assert reduced["window"]["loss"] == pytest.approx((6.0 + 1.75) / 2)   # not (10 + 2 + 3 + 4) / 6
    assert reduced["window"]["only_step2"] == 7.0
    assert reduced["window"]["low"] == 0.1 and reduced["window"]["high"] == 0.9
