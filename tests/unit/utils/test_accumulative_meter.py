import pytest

from coati.utils import AccumulativeMeanMeter, AccumulativeMeanVariable


def test_variable_is_sum_over_count_and_zero_when_empty():
    v = AccumulativeMeanVariable()
    assert v.get() == 0
    v.add(6.0, 3)      # a total of 6 over 3 samples
    v.add(1.0)         # one sample
    assert v.get() == pytest.approx(7.0 / 4)
    v.reset()
    assert v.get() == 0 and v.count == 0


def test_meter_keys_by_name_and_unknown_name_reads_zero():
    m = AccumulativeMeanMeter()
    m.add("loss", 2.0, 4)
    m.add("loss", 6.0, 4)
    m.add("accuracy", 3, 4)
    assert m.get("loss") == pytest.approx(1.0)
    assert m.get("accuracy") == pytest.approx(0.75)
    assert m.get("never_added") == 0
    m.reset()
    assert m.get("loss") == 0


def test_meter_keeps_full_precision():
    m = AccumulativeMeanMeter()
    m.add("x", 1.0000001, 1)
    assert m.get("x") == 1.0000001
