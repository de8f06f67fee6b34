"""The numbers users compare held-out runs by: pass@k (the unbiased estimator), maj@N and mean@N over N sampled
completions of a prompt. Held-out evaluation itself runs through the rollout workflow (`coati.rollout.evaluation`)."""
import math
from typing import Dict, List, Optional, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` samples of which `c` pass (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code"): 1 - C(n-c, k) / C(n, k), the chance that k of the n drawn without
    replacement hold at least one pass."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@{k} needs 0 < k <= n and 0 <= c <= n (n={n}, c={c})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(n: int) -> List[int]:
    """The k that pass@k is reported for with `n` samples: 1, 2, 4, ... below n, and n."""
    return sorted({2 ** i for i in range(n.bit_length()) if 2 ** i < n} | {n})


def sampled_metrics(values: Sequence[float], answers: Sequence[Optional[str]]) -> Dict[str, float]:
    """One prompt's metrics over its `n` sampled completions, from their scores under one reward (`values`) and their
    final answers (`answers`, for the majority vote): `mean@n` always; where every score is 0 or 1, `pass@k` for
    `k_values(n)` and `maj@n`, the score of the most common answer (the first such on a tie; a completion without an
    answer never wins the vote)."""
    n = len(values)
    metrics = {f"mean@{n}": sum(values) / n}
    if not all(v in (0.0, 1.0) for v in values):
        return metrics
    passed = int(sum(values))
    metrics.update({f"pass@{k}": pass_at_k(n, passed, k) for k in k_values(n)})
    votes: Dict[str, List[float]] = {}
    for answer, value in zip(answers, values):
        if answer is not None:
            votes.setdefault(answer, []).append(value)
    metrics[f"maj@{n}"] = max(votes.values(), key=len)[0] if votes else 0.0
    return metrics
