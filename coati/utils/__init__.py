"""Meters, errors, checkpoints and metrics logging. Checkpoint and logging helpers load on first use,
so code that only prepares data starts without importing colossalai."""
import importlib

from .accumulative_meter import AccumulativeMeanMeter, AccumulativeMeanVariable, all_reduce_meter
from .errors import CoatiUsageError, exit_cleanly

_LAZY = {
    "latest_checkpoint": "ckpt_io", "load_checkpoint": "ckpt_io", "save_checkpoint": "ckpt_io",
    "save_hf_model": "ckpt_io", "MetricsLogger": "metrics_logger", "StatsLogger": "metrics_logger",
    "Saver": "cadence", "Evaluator": "cadence", "Frequency": "cadence", "LogCadence": "cadence",
}

__all__ = ["AccumulativeMeanMeter", "AccumulativeMeanVariable", "all_reduce_meter", "CoatiUsageError",
           "exit_cleanly", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
