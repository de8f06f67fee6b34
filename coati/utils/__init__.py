"""Meters, errors, checkpoints and metrics logging. All but the errors load on first use, so code that only
prepares data starts without importing torch or colossalai."""
import importlib

from .errors import CoatiUsageError, exit_cleanly

_LAZY = {
    "latest_checkpoint": "ckpt_io", "load_checkpoint": "ckpt_io", "save_checkpoint": "ckpt_io",
    "save_hf_model": "ckpt_io", "MetricsLogger": "metrics_logger", "StatsLogger": "metrics_logger",
    "Saver": "cadence", "Evaluator": "cadence", "Frequency": "cadence", "LogCadence": "cadence",
    "AccumulativeMeanMeter": "stats_tracker", "AccumulativeMeanVariable": "stats_tracker",
    "all_reduce_meter": "stats_tracker",
}

__all__ = ["CoatiUsageError", "exit_cleanly", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
