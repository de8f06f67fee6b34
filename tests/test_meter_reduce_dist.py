import json

import pytest

from conftest import REPO, torchrun


@pytest.mark.slow
def test_all_reduce_meter_across_two_ranks_is_sum_over_sum():
    result = torchrun(REPO / "tests" / "dist_scripts" / "meter_reduce.py", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
    reduced = json.loads(line[len("RESULT "):])
    assert reduced["loss"] == pytest.approx((10 + 20) / (2 + 4))
    assert reduced["only_rank1"] == pytest.approx(3.0)   # a name missing on rank 0 counts as nothing there
