"""ColossalChat's import path of the running-mean meters (`from coati.utils.accumulative_meter import
AccumulativeMeanMeter`): they live with the tracker built on them, `coati.utils.stats_tracker`."""
from .stats_tracker import AccumulativeMeanMeter, AccumulativeMeanVariable, all_reduce_meter, all_reduce_totals

__all__ = ["AccumulativeMeanMeter", "AccumulativeMeanVariable", "all_reduce_meter", "all_reduce_totals"]
