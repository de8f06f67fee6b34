import pytest

from conftest import dist_script_result


@pytest.mark.slow
def test_all_reduce_meter_across_two_ranks_is_sum_over_sum():
    reduced = dist_script_result("meter_reduce.py")
    assert reduced["loss"] == pytest.approx((10 + 20) / (2 + 4))
    assert reduced["only_rank1"] == pytest.approx(3.0)   # a name missing on rank 0 counts as nothing there
