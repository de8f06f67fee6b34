"""StatsTracker's reduction across two real ranks, as computed by hand."""
import pytest

from conftest import dist_script_result


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
