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
