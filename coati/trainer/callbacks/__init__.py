from .base import Callback, fire
from .performance_evaluator import PerformanceEvaluator, count_samples_and_tokens

__all__ = ["Callback", "fire", "PerformanceEvaluator", "count_samples_and_tokens"]
