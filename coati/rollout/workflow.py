"""Rollout workflows: one prompt in, finished training samples out. The trainer never sees how they were
made, so multi-turn or tool-using episodes are a new workflow, not a new trainer."""
import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from coati.config import SamplingConfig
from coati.experience.scorer import PROMPT_FIELDS, Scorer

from .pool import RolloutPool


@dataclass
class Trajectory:
    """One prompt's finished samples, ready to train on: `sequences` (n, prompt + T) with the prompt in the
    first `prompt_length` columns, `action_mask` (n, T) over the tokens to train on, `logprobs` (n, T) of
    those tokens under the generating weights (None where the engine reports none), `rewards` (n,), and the
    weights `version` that generated them. For logs and sample tables: each sample's `prompts` and `completions`
    (text, or messages for conversational data) and each reward function's values (`reward_components`);
    `rollout` is the executor's number for it (its event log), `prompt_id` the (pass, row) of a streamed prompt
    (`PromptRow`); `rollout_stats` holds per-sample counts of how it was made (a multi-turn episode's turns and
    tool calls), logged as `rollout/<name>`. `token_versions` (n, T), where set, is the version that made each
    token (partial rollouts continue a completion on newer weights); `version` is then the oldest."""

    sequences: torch.Tensor
    action_mask: torch.Tensor
    logprobs: Optional[torch.Tensor]
    rewards: torch.Tensor
    prompt_length: int
    version: int
    prompts: List[Any] = field(default_factory=list)
    completions: List[Any] = field(default_factory=list)
    reward_components: Dict[str, List[Any]] = field(default_factory=dict)
    rollout: Optional[int] = None
    prompt_id: Optional[Tuple[int, int]] = None
    rollout_stats: Dict[str, List[float]] = field(default_factory=dict)
    token_versions: Optional[torch.Tensor] = None


class RolloutWorkflow(ABC):
    """Subclass and implement `arun_episode`; the executor runs many at once. A workflow samples with `sampling`,
    `num_generations` samples per prompt, so that held-out evaluation can run it greedily (`resampled`)."""

    sampling: SamplingConfig
    num_generations: int

    @abstractmethod
    async def arun_episode(self, pool: RolloutPool, sample: Dict[str, Any]) -> Optional[Trajectory]:
        """Turn one prompt-dataset row (`input_ids` and its other fields) into a `Trajectory`; None drops it."""

    def resampled(self, sampling: SamplingConfig, num_generations: int) -> "RolloutWorkflow":
        """This workflow sampling with `sampling`, `num_generations` per prompt (evaluation: greedy, or N samples)."""
        made = copy.copy(self)
        made.sampling, made.num_generations = sampling, num_generations
        return made


class RLVRWorkflow(RolloutWorkflow):
    """Single-turn RL with verifiable rewards: `num_generations` completions of the prompt, decoded and scored by
    `scorer` (the trainer's) with the row's other fields (e.g. `gt_answer`); the episodes running at once are
    scored in one batch (`Scorer.ascore`)."""

    def __init__(self, scorer: Scorer, sampling: SamplingConfig, num_generations: int) -> None:
        self.scorer, self.sampling, self.num_generations = scorer, sampling, num_generations

    async def arun_episode(self, pool: RolloutPool, sample: Dict[str, Any]) -> Optional[Trajectory]:
        n = self.num_generations
        out = await pool.agenerate(list(sample["input_ids"]), self.sampling, n)
        prompt = self.scorer.decode(sample["input_ids"])
        completions = self.scorer.completions(out)
        fields = {k: [v] * n for k, v in sample.items() if k not in PROMPT_FIELDS}
        total, components = await self.scorer.ascore([prompt] * n, completions, fields, out.as_output())
        return Trajectory(out.sequences, out.action_mask, out.logprobs, torch.tensor(total, dtype=torch.float32),
                          out.prompt_length, out.version, [prompt] * n, completions, components,
                          token_versions=out.token_versions)
