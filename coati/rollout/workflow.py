"""Rollout workflows: one prompt in, finished training samples out. The trainer never sees how they were
made, so multi-turn or tool-using episodes are a new workflow, not a new trainer. `run_episodes` runs one on a batch
of prompts to completion (a synchronous run's rollouts, and evaluation's)."""
import asyncio
import copy
import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from coati.config import SamplingConfig
from coati.dataset.collators import IMAGE_INPUTS, PROMPT_FIELDS
from coati.experience.experience import RolloutSample, per_name
from coati.experience.scorer import Scorer, Scores

from .chat import prompt_images
from .pool import RolloutPool


@dataclass(frozen=True)
class Trajectory:
    """One prompt's finished samples (`RolloutSample`s, unpadded and scored) and the weights `version` that generated
    them (their oldest tokens'). `rollout` is the executor's number for it (its event log), `prompt_id` the
    (pass, row) of a streamed prompt (`PromptRow`). Per sample, for groups and logs: `rewards`, `prompts`,
    `completions`, each reward's values (`reward_components`) and how each was made (`rollout_stats`)."""

    samples: Tuple[RolloutSample, ...]
    version: int
    rollout: Optional[int] = None
    prompt_id: Optional[Tuple[int, int]] = None

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def rewards(self) -> torch.Tensor:
        return torch.tensor([s.reward for s in self.samples], dtype=torch.float32)

    @property
    def prompts(self) -> List[Any]:
        return [s.prompt for s in self.samples]

    @property
    def completions(self) -> List[Any]:
        return [s.completion for s in self.samples]

    @property
    def reward_components(self) -> Dict[str, List[Any]]:
        return per_name(s.reward_components for s in self.samples)

    @property
    def rollout_stats(self) -> Dict[str, List[float]]:
        return per_name(s.stats for s in self.samples)


def scored(samples: Sequence[RolloutSample], prompts: Sequence[Any], completions: Sequence[Any], scores: Scores,
           version: int) -> Trajectory:
    """The group's samples with their `scores` (totals, components by name) and their text for logs."""
    total, components = scores
    return Trajectory(tuple(dataclasses.replace(s, prompt=p, completion=c, reward=float(r),
                                                reward_components={name: v[i] for name, v in components.items()})
                            for i, (s, p, c, r) in enumerate(zip(samples, prompts, completions, total))), version)


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
        n, prompt_ids, images = self.num_generations, list(sample["input_ids"]), prompt_images(sample)
        out = await pool.agenerate(prompt_ids, self.sampling, n, **images)
        samples = [RolloutSample(prompt_ids, ids, [True] * len(ids), logprobs, versions,
                                 image_inputs=images.get(IMAGE_INPUTS, {}))
                   for ids, logprobs, versions in out.rows]
        prompts = [self.scorer.decode(prompt_ids)] * n
        completions = [self.scorer.decode(s.completion_ids) for s in samples]
        fields = {k: [v] * n for k, v in sample.items() if k not in PROMPT_FIELDS}
        scores = await self.scorer.ascore(prompts, completions, fields, samples)
        return scored(samples, prompts, completions, scores, out.version)


def run_episodes(workflow: RolloutWorkflow, pool: RolloutPool, samples: Sequence[Dict[str, Any]],
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> List[Optional[Trajectory]]:
    """`workflow`'s episode for every sample, run concurrently against `pool` until all are done (None where
    the workflow dropped one), in the samples' order; on `loop` when given (a loop kept across calls keeps its
    worker threads), else on a new one."""
    async def every() -> List[Optional[Trajectory]]:
        return list(await asyncio.gather(*(workflow.arun_episode(pool, sample) for sample in samples)))

    return loop.run_until_complete(every()) if loop is not None else asyncio.run(every())
