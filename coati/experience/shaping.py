"""Reward shapers (`--reward_shaping`): terms added to each completion's reward from how it was generated rather
than from its text, each logged as a reward component of its own name."""
from typing import Dict, List, Sequence

import torch

from coati.config import ShapingConfig
from coati.utils.registry import REWARD_SHAPERS


def overlong_penalty(lengths: torch.Tensor, config: ShapingConfig) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), L_max = `max_length`, L_cache the buffer:
    R(y) = 0 if |y| <= L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache up to L_max, -1 beyond; times the factor."""
    buffer = config.overlong_buffer or max(config.max_length // 4, 1)
    if not 0 < buffer <= config.max_length:
        raise ValueError(f"the overlong buffer ({buffer}) must be within the length limit ({config.max_length})")
    penalty = ((config.max_length - buffer - lengths.float()) / buffer).clamp(min=-1.0, max=0.0)
    return config.overlong_factor * penalty


def shape_rewards(rewards: torch.Tensor, components: Dict[str, List[float]], lengths: torch.Tensor,
                  shapers: Sequence[str], config: ShapingConfig) -> torch.Tensor:
    """`rewards` plus each named shaper's term; each term is also put in `components` under its name."""
    for name in shapers:
        term = REWARD_SHAPERS.get(name)(lengths, config).to(rewards)
        components[name] = term.tolist()
        rewards = rewards + term
    return rewards
