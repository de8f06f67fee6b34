"""Advantage estimators: GAE for PPO, group-normalised rewards for GRPO."""
from typing import Tuple

import torch


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                lam: float = 0.95) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over response tokens (batch, T):
    delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, with V and A zero past the
    last unmasked token. Returns (advantages, returns = advantages + values), zero where masked."""
    mask = mask.to(values.dtype)
    values = values * mask
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.size(1))):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantages[:, t] = (delta + gamma * lam * next_advantage) * mask[:, t]
        next_value, next_advantage = values[:, t], advantages[:, t]
    return advantages, (advantages + values) * mask


def group_advantages(rewards: torch.Tensor, group_size: int, scale_by_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO (Shao et al. 2024): each reward minus its group's mean, divided by the group's std unless
    `scale_by_std` is off (Dr. GRPO). `rewards` holds consecutive groups of `group_size`."""
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(-1, keepdim=True)
    if scale_by_std:
        centred = centred / (groups.std(-1, keepdim=True) + eps)
    return centred.reshape(-1)


def tied_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A bool per sample: True where every reward of its group is the same (no learning signal; DAPO drops them)."""
    groups = rewards.view(-1, group_size)
    tied = (groups == groups[:, :1]).all(-1)
    return tied.repeat_interleave(group_size)
