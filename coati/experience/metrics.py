"""Per-rollout statistics over every rank's samples, under the names of the published GRPO logging module
(`reward_p50`, `rewards/<name>/mean`, `completions/mean_length_sampled`, `completions/diversity/...`)."""
import math
from itertools import combinations
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch

from coati.utils.comm import gather_lists
from coati.rewards.registry import EXTRA_PREFIX, METRIC_PREFIX

from .experience import Experience

QUANTILES = (0, 5, 25, 50, 75, 95, 100)


def quantiles(prefix: str, values: Sequence[float]) -> Dict[str, float]:
    """`<prefix>NN` for each percentile NN of QUANTILES, linearly interpolated between order statistics."""
    array = np.asarray(values, dtype=np.float64)
    return {f"{prefix}{q:02d}": float(np.percentile(array, q)) for q in QUANTILES}


def component_metrics(components: Dict[str, Sequence[Any]]) -> Iterator[Tuple[str, List[float]]]:
    """(metric name, values) of each numeric component, the rows a function returned None for left out:
    `rewards/<component>`, or a `log_metric` value under its own name; `log_extra` columns are not metrics."""
    for name, values in components.items():
        if name.startswith(EXTRA_PREFIX):
            continue
        kept = [float(v) for v in values if not math.isnan(v)]
        if kept:
            yield (name[len(METRIC_PREFIX):] if name.startswith(METRIC_PREFIX) else f"rewards/{name}"), kept


def reward_stats(rewards: Sequence[float], components: Dict[str, Sequence[float]]) -> Dict[str, float]:
    """`reward` (mean), `reward_std` (population), `reward_pNN`; per component `rewards/<name>/mean`, `/std`, `/pNN`
    over the rows it scored (a function's None leaves a row out), and each `log_metric` value by its name."""
    array = np.asarray(rewards, dtype=np.float64)
    stats = {"reward": float(array.mean()), "reward_std": float(array.std()), **quantiles("reward_p", array)}
    for name, values in component_metrics(components):
        values = np.asarray(values, dtype=np.float64)
        if not name.startswith("rewards/"):          # a reward function's log_metric
            stats[name] = float(values.mean())
            continue
        stats[f"{name}/mean"] = float(values.mean())
        stats[f"{name}/std"] = float(values.std())
        stats.update(quantiles(f"{name}/p", values))
    return stats


def length_stats(lengths: np.ndarray, terminated: np.ndarray) -> Dict[str, float]:
    """Mean/min/max completion length of every sample (`_sampled`) and of those that ended with a stop token
    (`_terminated`; 0 when none did), and the fraction cut at the length limit (`clipped_frac`)."""
    stats = {"avg_completion_tokens": float(lengths.mean()), "completions/clipped_frac": float(1 - terminated.mean())}
    for kind, chosen in (("sampled", lengths), ("terminated", lengths[terminated])):
        chosen = chosen if chosen.size else np.zeros(1)
        stats.update({f"completions/{stat}_length_{kind}": float(getattr(chosen, stat)()) for stat in ("mean", "min", "max")})
    return stats


def group_diversity(completions: Sequence[Sequence[int]]) -> Dict[str, float]:
    """Diversity of one group's completions (token ids): `distinct_1` / `distinct_2`, unique unigrams / bigrams
    over all of them (Li et al. 2016), and `jaccard`, the mean pairwise Jaccard distance of their token sets
    (0: the same tokens, 1: none shared)."""
    stats = {}
    for n in (1, 2):
        grams = [tuple(c[i:i + n]) for c in completions for i in range(len(c) - n + 1)]
        stats[f"distinct_{n}"] = len(set(grams)) / len(grams) if grams else 0.0
    distances = [1 - len(set(a) & set(b)) / len(set(a) | set(b)) if set(a) | set(b) else 0.0
                 for a, b in combinations(completions, 2)]
    stats["jaccard"] = float(np.mean(distances)) if distances else 0.0
    return stats


def completion_tokens(experience: Experience) -> List[List[int]]:
    """Each completion's token ids, without padding."""
    completions = experience.sequences[:, experience.prompt_length:]
    return [row[mask.bool()].tolist() for row, mask in zip(completions, experience.action_mask)]


def diversity_stats(experience: Experience, group_size: int) -> Dict[str, float]:
    """`completions/diversity/{distinct_1,distinct_2,jaccard}`: `group_diversity` of each group of `group_size`
    consecutive samples, averaged over every rank's groups. A collective."""
    tokens = completion_tokens(experience)
    groups = [group_diversity(tokens[i:i + group_size]) for i in range(0, len(tokens), group_size)]
    groups = gather_lists(groups)
    return {f"completions/diversity/{k}": float(np.mean([g[k] for g in groups])) for k in groups[0]}


def kl_stats(kl: torch.Tensor, mask: torch.Tensor) -> Dict[str, float]:
    """`kl`: the mean over completions of their summed per-token KL to the reference; `kl_per_completion_token`:
    the summed KL over the completion tokens. A collective."""
    mask = mask.to(kl.dtype)
    per_sequence = (kl * mask).sum(-1)
    sequences = gather_lists(per_sequence.tolist())
    tokens = sum(gather_lists([mask.sum().item()]))
    return {"kl": float(np.mean(sequences)), "kl_per_completion_token": float(sum(sequences) / max(tokens, 1))}


def rollout_metrics(experience: Experience, group_size: int = 1) -> Dict[str, float]:
    """Statistics of one experience batch over all ranks: `reward_stats`, `frac_reward_zero_std` (groups of
    `group_size` whose rewards tie), `advantages/mean` and `/std`, `length_stats`, `diversity_stats` (groups
    of two or more), `kl_stats` when there is a reference, and the mean of each of the rollouts' own counts
    (`rollout/turns`, `rollout/tool_calls`, ... of multi-turn episodes). A collective: every rank calls it."""
    mask = experience.action_mask
    rewards = gather_lists(experience.rewards.tolist())
    components = {name: gather_lists(values) for name, values in experience.reward_components.items()
                  if not name.startswith(EXTRA_PREFIX)}
    metrics = reward_stats(rewards, components)
    advantages = experience.advantages
    if advantages.dim() == 2:
        advantages = advantages[mask.bool()]
    advantages = np.asarray(gather_lists(advantages.tolist()), dtype=np.float64)
    metrics.update({"advantages/mean": float(advantages.mean()), "advantages/std": float(advantages.std())})
    lengths = np.asarray(gather_lists(mask.sum(-1).tolist()), dtype=np.float64)
    terminated = np.asarray(gather_lists(experience.terminated.tolist()), dtype=bool)
    metrics.update(length_stats(lengths, terminated))
    if group_size > 1:
        groups = np.asarray(rewards).reshape(-1, group_size)
        metrics["frac_reward_zero_std"] = float((groups.std(-1) == 0).mean())
        metrics.update(diversity_stats(experience, group_size))
    if experience.kl is not None:
        metrics.update(kl_stats(experience.kl, mask))
    metrics.update({f"rollout/{name}": float(np.mean(gather_lists(values)))
                    for name, values in experience.rollout_stats.items()})
    return metrics


def tokens_in(experience: Experience) -> int:
    """Tokens (prompt and completion, padding excluded) of this rank's experience."""
    return int(experience.attention_mask.sum().item())
