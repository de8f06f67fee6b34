"""ColossalChat's import path of its verifiable rewards (`from coati.utils.reward_score import *`): `coati.compat`'s,
imported on first use."""
NAMES = ("validate_response_structure", "extract_solution", "gsm8k_reward_fn", "math_competition_reward_fn")
__all__ = [*NAMES]


def __getattr__(name: str):
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("coati.compat.reward_score"), name)
