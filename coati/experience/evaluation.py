"""Held-out evaluation of a saved model outside training: greedy completions of prepared prompts,
scored by reward functions (with `math_answer`, exact-answer accuracy)."""
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from coati.dataset.collators import PromptCollator
from coati.dataset.prepare import load_prepared
from coati.dataset.tokenization import load_tokenizer
from coati.models.generation import HFEngine, SamplingConfig
from coati.rewards import WeightedReward
from coati.rewards.registry import table_columns

from .scorer import Scorer


@dataclass
class EvalResult:
    """Mean total reward and per-component means over every prompt, and every (prompt, completion, reward)."""

    reward: float
    components: Dict[str, float]
    samples: List[Dict[str, object]]


@torch.no_grad()
def evaluate_model(model_dir: str, prompt_dirs: Sequence[str], reward_specs: Sequence[str] = ("math_answer",),
                   max_new_tokens: int = 32, batch_size: int = 64) -> EvalResult:
    """Greedy completions of the prepared prompt sets `prompt_dirs` by the model in `model_dir` (loaded
    with `from_pretrained`), scored like rollouts by `reward_specs`."""
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    engine = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, do_sample=False)
    scorer = Scorer(tokenizer, WeightedReward.from_specs(list(reward_specs)))
    loader = DataLoader(load_prepared(list(prompt_dirs), "prompt"), batch_size=batch_size,
                        collate_fn=PromptCollator(tokenizer.pad_token_id))
    samples: List[Dict[str, object]] = []
    for batch in tqdm(loader, desc=f"evaluating {model_dir}", leave=False):
        out = engine.generate(batch["input_ids"], batch["attention_mask"], sampling)
        prompts, completions, (total, components) = scorer.score_batch(batch, out)
        samples += [{"prompt": p, "completion": c, "reward": t, **table_columns(components, i)}
                    for i, (p, c, t) in enumerate(zip(prompts, completions, total))]
    names = [k for k in samples[0] if k not in ("prompt", "completion", "reward")] if samples else []
    means = {k: _mean(samples, k) for k in names}
    return EvalResult(_mean(samples, "reward"), {k: v for k, v in means.items() if v is not None}, samples)


def _mean(samples: List[Dict[str, object]], key: str) -> Optional[float]:
    """The mean of `key` over the samples that have a number there (a reward function's None leaves one out);
    None when none has (a `log_extra` column of text)."""
    values = [float(s[key]) for s in samples if isinstance(s[key], (int, float)) and not math.isnan(s[key])]
    return sum(values) / len(values) if values else None


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
