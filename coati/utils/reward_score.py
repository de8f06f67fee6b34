"""ColossalChat's import path of its verifiable rewards (`from coati.utils.reward_score import *`): `coati.compat`."""
from coati.compat.reward_score import (extract_solution, gsm8k_reward_fn, math_competition_reward_fn,
                                       validate_response_structure)

__all__ = ["validate_response_structure", "extract_solution", "gsm8k_reward_fn", "math_competition_reward_fn"]
