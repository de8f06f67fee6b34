from .accumulative_meter import AccumulativeMeanMeter, AccumulativeMeanVariable, all_reduce_meter
from .ckpt_io import latest_checkpoint, load_checkpoint, save_checkpoint, save_hf_model
from .errors import CoatiUsageError, exit_on_usage_error
from .metrics_logger import MetricsLogger

__all__ = [
    "AccumulativeMeanMeter", "AccumulativeMeanVariable", "all_reduce_meter", "latest_checkpoint",
    "load_checkpoint", "save_checkpoint", "save_hf_model", "CoatiUsageError", "exit_on_usage_error", "MetricsLogger",
]
