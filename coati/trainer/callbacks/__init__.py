from .base import Callback, fire
from .health import AlarmThresholds, HealthMonitor
from .performance_evaluator import PerformanceEvaluator, count_samples_and_tokens

__all__ = ["Callback", "fire", "AlarmThresholds", "HealthMonitor", "PerformanceEvaluator", "count_samples_and_tokens"]
