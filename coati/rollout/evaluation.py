"""Held-out evaluation through the rollout workflow and pool, one path for both uses: during training
(`OLTrainer.evaluate`, on the pool the rollouts use) and of a saved model (`evaluate_model`). Greedy completions
are scored like rollouts; with N samples per prompt, pass@k, maj@N and mean@N (`coati.experience.evaluation`)."""
import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from coati.dataset.collators import PromptRows
from coati.dataset.prepare import load_prepared, prepared_image_limits
from coati.dataset.tokenization import load_tokenizer
from coati.dataset.vision import ImageLimits, ImageProcessing
from coati.experience.evaluation import sampled_metrics
from coati.experience.experience import per_name
from coati.experience.scorer import Scorer
from coati.models.generation import HFEngine
from coati.models.vision import auto_model_class
from coati.config import EvalSettings, SamplingConfig
from coati.rewards import WeightedReward
from coati.rewards.math import extract_answer
from coati.experience.metrics import component_metrics
from coati.rewards.registry import table_columns
from coati.utils.stats_tracker import StatsTracker

from .chat import ChatTokens
from .pool import LocalPool, RolloutPool
from .multiturn import MultiTurnWorkflow
from .tool_calls import hermes
from .tools import ToolEnvironment, ToolRunner, resolve_tools, tool_schemas
from .workflow import RLVRWorkflow, RolloutWorkflow, Trajectory, run_episodes


def held_out_sampling(sampling: SamplingConfig, evaluation: EvalSettings) -> SamplingConfig:
    """How `--eval_n_samples` samples the held-out prompts: the training's sampling, at `--eval_temperature`,
    `--eval_top_p` and `--eval_top_k` where given."""
    return replace(sampling, do_sample=True, temperature=evaluation.eval_temperature or sampling.temperature,
                   top_p=sampling.top_p if evaluation.eval_top_p is None else evaluation.eval_top_p,
                   top_k=sampling.top_k if evaluation.eval_top_k is None else evaluation.eval_top_k)


def complete(pool: RolloutPool, workflow: RolloutWorkflow, rows: Sequence[Dict[str, Any]], sampling: SamplingConfig,
             n: int = 1) -> List[Trajectory]:
    """`n` episodes of `workflow` on each row by `pool`, sampled with `sampling`: one trajectory per row, in order."""
    return run_episodes(workflow.resampled(sampling, n), pool, rows)


def final_answer(completion: Any) -> str:
    """A completion's answer text: itself, or for a multi-turn episode (its messages) the last assistant turn."""
    if isinstance(completion, list):
        return next((m["content"] for m in reversed(completion) if m.get("role") == "assistant"), "")
    return completion


def record_scores(stats: StatsTracker, trajectories: Sequence[Trajectory]) -> None:
    """The total reward and each reward component of every completion, as means (`reward`, `rewards/<name>/...`)."""
    total = [float(v) for t in trajectories for v in t.rewards.tolist()]
    stats.add("reward", float(sum(total)), len(total))
    for name, values in component_metrics(per_name(s.reward_components for t in trajectories for s in t.samples)):
        stats.add(name, float(sum(values)), len(values))


def record_sampled(stats: StatsTracker, trajectories: Sequence[Trajectory]) -> None:
    """Each prompt's pass@k, maj@N and mean@N over its N completions, under the total reward and each reward
    function (one count per prompt; a prompt a function left unscored is left out of that function's)."""
    for trajectory in trajectories:
        components = trajectory.reward_components
        scores = {"reward": trajectory.rewards.tolist(),
                  **{f"rewards/{k}": v for k, v in components.items() if "/" not in k}}
        answers = [extract_answer(final_answer(c)) for c in trajectory.completions]
        for name, values in scores.items():
            group = [float(v) for v in values]
            if not any(math.isnan(v) for v in group):
                for metric, value in sampled_metrics(group, answers).items():
                    stats.add(f"{name}/{metric}", value, 1)


@dataclass
class EvalResult:
    """Mean total reward and per-component means over every prompt, and every (prompt, completion, reward)."""

    reward: float
    components: Dict[str, float]
    samples: List[Dict[str, object]]


@torch.no_grad()
def evaluate_model(model_dir: str, prompt_dirs: Sequence[str], reward_specs: Sequence[str] = ("math_answer",),
                   max_new_tokens: int = 32, batch_size: int = 64, tools: Sequence[str] = (),
                   max_turns: int = 4) -> EvalResult:
    """Greedy completions of the prepared prompt sets `prompt_dirs` by the model in `model_dir` (loaded
    with `from_pretrained`), scored like rollouts by `reward_specs`; with `tools`, greedy multi-turn episodes of at
    most `max_turns` model turns that may call them. A vision-language model reads the prompts' images, made into
    pixels as the prompts' image tokens were counted."""
    tokenizer = load_tokenizer(model_dir)
    model = auto_model_class(model_dir).from_pretrained(model_dir).eval()
    images = ImageProcessing.load(model_dir, tokenizer, prepared_image_limits(prompt_dirs) or ImageLimits())
    pool = LocalPool(HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
    greedy = SamplingConfig(max_new_tokens=max_new_tokens, do_sample=False)
    scorer = Scorer(tokenizer, WeightedReward.from_specs(list(reward_specs)))
    loader = DataLoader(load_prepared(list(prompt_dirs), "prompt"), batch_size=batch_size,
                        collate_fn=PromptRows(images=images))
    samples: List[Dict[str, object]] = []
    workflow = _tool_workflow(scorer, greedy, tools, max_turns, images) if tools else RLVRWorkflow(scorer, greedy, 1)
    for batch in tqdm(loader, desc=f"evaluating {model_dir}", leave=False):
        for t in complete(pool, workflow, batch, greedy):
            samples.append({"prompt": t.prompts[0], "completion": t.completions[0],
                            "reward": float(t.rewards[0]), **table_columns(t.reward_components, 0)})
    names = [k for k in samples[0] if k not in ("prompt", "completion", "reward")] if samples else []
    means = {k: _mean(samples, k) for k in names}
    return EvalResult(_mean(samples, "reward"), {k: v for k, v in means.items() if v is not None}, samples)


def _tool_workflow(scorer: Scorer, sampling: SamplingConfig, tools: Sequence[str], max_turns: int,
                   images: Optional[ImageProcessing]) -> RolloutWorkflow:
    """One greedy multi-turn episode per prompt, calling `tools` (hermes calls) for at most `max_turns` turns; `images`,
    a vision-language model's processor."""
    runner = ToolRunner(resolve_tools(list(tools)))
    chat = ChatTokens(scorer.tokenizer, [scorer.tokenizer.eos_token_id], tool_schemas(list(runner.tools.values())),
                      images=images)
    return MultiTurnWorkflow(scorer, chat, functools.partial(ToolEnvironment, runner, hermes), sampling, 1, max_turns, 0)


def _mean(samples: List[Dict[str, object]], key: str) -> Optional[float]:
    """The mean of `key` over the samples that have a number there (a reward function's None leaves one out);
    None when none has (a `log_extra` column of text)."""
    values = [float(s[key]) for s in samples if isinstance(s[key], (int, float)) and not math.isnan(s[key])]
    return sum(values) / len(values) if values else None
