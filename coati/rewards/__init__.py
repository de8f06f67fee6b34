"""Reward functions for RL with verifiable rewards, and the registry that picks them by name."""
from .code import CodeTests, code_tests, extract_code
from .math import answer_format, answers_match, check_answers, extract_answer, math_answer, normalize_number
from .output import RewardOutput
from .registry import BUILTIN, RewardFunctionError, RewardTimeoutError, WeightedReward, resolve
from .sandbox import RunResult, Sandbox, SandboxError, SandboxLimits

__all__ = ["CodeTests", "code_tests", "extract_code", "RunResult", "Sandbox", "SandboxError", "SandboxLimits",
           "answer_format", "answers_match", "check_answers", "extract_answer", "math_answer", "normalize_number",
           "RewardOutput", "BUILTIN", "RewardFunctionError", "RewardTimeoutError", "WeightedReward", "resolve"]
