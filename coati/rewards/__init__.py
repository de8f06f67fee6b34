"""Reward functions for RL with verifiable rewards, and the registry that picks them by name."""
from .math import answer_format, answers_match, extract_answer, math_answer, normalize_number
from .registry import BUILTIN, RewardFunctionError, RewardTimeoutError, WeightedReward, resolve

__all__ = ["answer_format", "answers_match", "extract_answer", "math_answer", "normalize_number", "BUILTIN",
           "RewardFunctionError", "RewardTimeoutError", "WeightedReward", "resolve"]
