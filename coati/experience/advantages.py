"""Advantage estimators: GAE for PPO, and the outcome-reward estimators `--adv_estimator` picks from
(ADVANTAGE_ESTIMATORS: GRPO's group normalisation, RLOO, REINFORCE++, MaxEnt weighting). Each estimator is
`fn(rewards (N,), config: AdvantageConfig) -> advantages (N,)`; its hyperparameters are in `config.options`. The
`process` estimator reads a process reward model's step scores too and returns per-token advantages (N, T)."""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch

from coati.utils.comm import all_reduce_sums


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


@dataclass(frozen=True)
class AdvantageConfig:
    """What an outcome-reward estimator is given besides the rewards: `group_size` (consecutive completions of one
    prompt), `scale_rewards` (off with `--no_std_normalize`, Dr. GRPO) and `options`, the estimator's own
    hyperparameters (`--adv_option NAME=VALUE ...`; MaxEnt's `tau` comes from its controller)."""

    group_size: int
    scale_rewards: bool = True
    options: Dict[str, Any] = field(default_factory=dict)
    step_rewards: Optional[torch.Tensor] = None
    """A process reward model's score of each step on the token that ends it (N, T), 0 elsewhere; `step_mask` marks
    those tokens. Given where `--prm_pretrain` scores the completions; estimators that read them return (N, T)."""
    step_mask: Optional[torch.Tensor] = None


STD_EPS = 1e-6


def group_advantages(rewards: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean(r_group)) / std(r_group), without the division when
    `scale_rewards` is off (Dr. GRPO). `rewards` holds consecutive groups of `group_size`."""
    groups = rewards.view(-1, config.group_size)
    centred = groups - groups.mean(-1, keepdim=True)
    if config.scale_rewards:
        centred = centred / (groups.std(-1, keepdim=True) + STD_EPS)
    return centred.reshape(-1)


def leave_one_out_advantages(rewards: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): A_i = r_i - (1/(n-1)) sum_{j != i} r_j, the mean of the group's other
    rewards as the baseline (unscaled; `scale_rewards` does not apply)."""
    n = config.group_size
    if n < 2:
        raise ValueError("RLOO needs groups of at least 2 completions")
    groups = rewards.view(-1, n)
    others = (groups.sum(-1, keepdim=True) - groups) / (n - 1)
    return (groups - others).reshape(-1)


def global_normalised_advantages(rewards: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """REINFORCE++ (Hu 2025), outcome rewards: A_i = (r_i - mean(r)) / std(r) over the global batch (every
    rank's completions), not per group; without the division when `scale_rewards` is off."""
    local = rewards.double()
    total, squares, count = all_reduce_sums([local.sum().item(), (local ** 2).sum().item(), local.numel()])
    mean = total / count
    centred = rewards - mean
    if config.scale_rewards:
        std = max(squares / count - mean ** 2, 0.0) ** 0.5
        centred = centred / (std + STD_EPS)
    return centred


def baseline_normalised_advantages(rewards: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025; verl's reinforce_plus_plus_baseline, OpenRLHF's reinforce_baseline):
    each reward less its group's mean, then divided by the std over the global batch (every rank's completions),
    without the division when `scale_rewards` is off."""
    groups = rewards.view(-1, config.group_size)
    return global_normalised_advantages((groups - groups.mean(-1, keepdim=True)).reshape(-1), config)


def maxent_weights(rewards: torch.Tensor, group_size: int, tau: float) -> torch.Tensor:
    """w_i = softmax(r_group / tau)_i within each group of `group_size` consecutive completions."""
    return torch.softmax(rewards.view(-1, group_size).double() / tau, dim=-1).to(rewards.dtype).reshape(-1)


def maxent_advantages(rewards: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """MaxEnt weighting: A_i = n * softmax(r_group / tau)_i - 1, the completion's weight against the uniform 1/n (sums to 0
    over a group; tau -> 0 is best-of-n, large tau is a scaled mean baseline). `options["tau"]` comes from
    `--maxent_tau` and its controller (default 1); `scale_rewards` does not apply."""
    n = config.group_size
    return n * maxent_weights(rewards, n, float(config.options.get("tau", 1.0))) - 1.0


def tied_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A bool per sample: True where every reward of its group is the same (no learning signal; DAPO drops them)."""
    groups = rewards.view(-1, group_size)
    tied = (groups == groups[:, :1]).all(-1)
    return tied.repeat_interleave(group_size)


PROCESS_AGGREGATIONS = ("min", "sum")


def process_advantages(rewards: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """A process reward model's step scores as advantages, plus the outcome rewards' group advantage (`grpo`; 0 where
    every reward of a group ties, e.g. with a PRM alone). `--adv_option aggregation=`:
    - `min` (default): each completion's process score is its worst step's score (0 when no step ended), less the
      mean of its group's, given to every token. More steps can only lower it, so a policy cannot collect step
      rewards by writing more steps (min-form credit assignment, Cheng et al. 2025, PURE). It is centred, not divided
      by the group's std, so the step scores' weight (`--prm_coef`) sets its size against the outcome's normalised
      advantage. Per completion (N,).
    - `sum`: DeepSeekMath's process supervision (Shao et al. 2024, 4.1.3): every step score of a group normalised by
      the mean and std of all the group's step scores, a token's advantage the sum of the normalised scores of the
      steps that end at or after it (normalised, so `--prm_coef` does not change it). Per token (N, T); it rewards
      many steps that score above the group's mean."""
    if config.step_rewards is None or config.step_mask is None:
        raise ValueError("the process advantage estimator needs a process reward model's step scores (--prm_pretrain)")
    aggregation = config.options.get("aggregation", "min")
    if aggregation not in PROCESS_AGGREGATIONS:
        raise ValueError(f"--adv_option aggregation={aggregation}: expected one of {', '.join(PROCESS_AGGREGATIONS)}")
    outcome = group_advantages(rewards, config)
    mask = config.step_mask.bool()
    if aggregation == "min":
        worst = torch.where(mask, config.step_rewards, torch.full_like(config.step_rewards, float("inf"))).min(-1).values
        worst = torch.where(mask.any(-1), worst, torch.zeros_like(worst)).to(rewards.dtype)
        groups = worst.view(-1, config.group_size)
        return (groups - groups.mean(-1, keepdim=True)).reshape(-1) + outcome
    groups = mask.view(-1, config.group_size, mask.size(1))
    scores = config.step_rewards.view_as(groups).double()
    count = groups.sum((1, 2), keepdim=True).clamp(min=1)
    mean = (scores * groups).sum((1, 2), keepdim=True) / count
    centred = (scores - mean) * groups
    if config.scale_rewards:
        std = ((centred ** 2).sum((1, 2), keepdim=True) / (count - 1).clamp(min=1)).sqrt()
        centred = centred / (std + STD_EPS)
    to_go = centred.flip(-1).cumsum(-1).flip(-1).view(-1, mask.size(1)).to(rewards.dtype)
    return to_go + outcome.unsqueeze(-1)
