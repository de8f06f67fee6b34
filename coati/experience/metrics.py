"""Per-rollout statistics over every rank's samples, named after TRL's GRPO metrics where they exist."""
from typing import Dict, Sequence

import numpy as np

from coati.distributed.comm import gather_lists
from coati.models.loss import masked_mean

from .experience import Experience


def _spread(name: str, values: Sequence[float], percentiles: bool = False) -> Dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    stats = {name: float(array.mean()), f"{name}_std": float(array.std())}
    if percentiles:
        stats.update({f"{name}_p{p:02d}": float(np.percentile(array, p)) for p in (5, 50, 95)})
    return stats


def _lengths(lengths: np.ndarray, kind: str = "") -> Dict[str, float]:
    """Mean/min/max completion length; all 0 when there is none (no completion terminated), as TRL logs it."""
    lengths = lengths if lengths.size else np.zeros(1)
    return {f"completions/{stat}{kind}_length": float(getattr(lengths, stat)()) for stat in ("mean", "min", "max")}


def rollout_metrics(experience: Experience, group_size: int = 1) -> Dict[str, float]:
    """Statistics of one experience batch over all ranks: reward mean/std/p05/p50/p95, each reward
    component's mean/std (`rewards/<name>`, `rewards/<name>_std`), `frac_reward_zero_std` (groups of
    `group_size` whose rewards tie), advantage mean/std, completion lengths (all, and those that ended
    with a stop token: `completions/mean_terminated_length`, ...), `completions/clipped_ratio` (hit the length
    limit) and the mean per-token `kl` when there is a reference. A collective: every rank calls it."""
    mask = experience.action_mask
    rewards = gather_lists(experience.rewards.tolist())
    metrics = _spread("reward", rewards, percentiles=True)
    for name, values in experience.info["reward_components"].items():
        metrics.update(_spread(f"rewards/{name}", gather_lists(values)))
    if group_size > 1:
        groups = np.asarray(rewards).reshape(-1, group_size)
        metrics["frac_reward_zero_std"] = float((groups.std(-1) == 0).mean())
    advantages = experience.advantages
    if advantages.dim() == 2:
        advantages = advantages[mask.bool()]
    metrics.update(_spread("advantages", gather_lists(advantages.tolist())))
    lengths = np.asarray(gather_lists(mask.sum(-1).tolist()))
    terminated = np.asarray(gather_lists(experience.info["terminated"]), dtype=bool)
    metrics.update(_lengths(lengths))
    metrics.update(_lengths(lengths[terminated], "_terminated"))
    metrics["completions/clipped_ratio"] = float(1 - terminated.mean())
    if experience.kl is not None:
        metrics["kl"] = float(np.mean(gather_lists(masked_mean(experience.kl, mask, dim=-1).tolist())))
    return metrics


def tokens_in(experience: Experience) -> int:
    """Tokens (prompt and completion, padding excluded) of this rank's experience."""
    return int(experience.attention_mask.sum().item())
