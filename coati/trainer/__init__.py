from .base import BatchResult, OLTrainer, SLTrainer
from .callbacks import Callback, PerformanceEvaluator
from .sft import SFTTrainer

__all__ = ["BatchResult", "OLTrainer", "SLTrainer", "Callback", "PerformanceEvaluator", "SFTTrainer"]
