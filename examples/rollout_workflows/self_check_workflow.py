"""A two-turn rollout workflow, written without touching any trainer: the model answers, is asked to check
its answer, and answers again. The reward scores the final answer; only the model's own tokens are trained
on (the follow-up question is in the sequence but masked out).

    from self_check_workflow import SelfCheckWorkflow
    workflow = SelfCheckWorkflow(tokenizer, SamplingConfig(max_new_tokens=64), num_generations=8)
    executor = WorkflowExecutor(pool, workflow, batch_size=16, max_concurrent_rollouts=32, max_staleness=1)
"""
import asyncio
from typing import Any, Dict, List, Optional

import torch

from coati.config import SamplingConfig
from coati.rewards import WeightedReward
from coati.rollout import RolloutPool, Completions, RolloutWorkflow, Trajectory

CHECK = "Check your answer. Reply with the final answer only."


def _logprobs(out: Completions, row: int) -> List[float]:
    """The generated tokens' log-probs of one row (zeros from an engine that reports none: the local one)."""
    mask = out.action_mask[row]
    return out.logprobs[row][mask].tolist() if out.logprobs is not None else [0.0] * int(mask.sum())


class SelfCheckWorkflow(RolloutWorkflow):
    def __init__(self, tokenizer: Any, sampling: SamplingConfig, num_generations: int) -> None:
        self.tokenizer, self.sampling, self.n = tokenizer, sampling, num_generations
        self.reward = WeightedReward.from_specs(["math_answer"])
        follow_up = tokenizer.apply_chat_template([{"role": "user", "content": CHECK}], tokenize=False,
                                                  add_generation_prompt=True)
        self.follow_up: List[int] = tokenizer.encode(follow_up, add_special_tokens=False)

    async def _second_turn(self, pool: RolloutPool, prompt: List[int], first: List[int]):
        out = await pool.agenerate(prompt + first + self.follow_up, self.sampling, 1)
        second = out.sequences[0, out.prompt_length:][out.action_mask[0]]
        return second.tolist(), _logprobs(out, 0), out.version

    async def arun_episode(self, pool: RolloutPool, sample: Dict[str, Any]) -> Optional[Trajectory]:
        prompt = list(sample["input_ids"])
        first = await pool.agenerate(prompt, self.sampling, self.n)
        turns = [(first.sequences[i, first.prompt_length:][first.action_mask[i]].tolist(), _logprobs(first, i))
                 for i in range(self.n)]
        seconds = await asyncio.gather(*(self._second_turn(pool, prompt, tokens) for tokens, _ in turns))
        rows, masks, logps, finals = [], [], [], []
        for (tokens1, lp1), (tokens2, lp2, _) in zip(turns, seconds):
            rows.append(tokens1 + self.follow_up + tokens2)
            masks.append([1] * len(tokens1) + [0] * len(self.follow_up) + [1] * len(tokens2))
            logps.append(lp1 + [0.0] * len(self.follow_up) + lp2)
            finals.append(self.tokenizer.decode(tokens2, skip_special_tokens=True))
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        text = self.tokenizer.decode(prompt, skip_special_tokens=True)
        total, components = self.reward([text] * self.n, finals, gt_answer=[sample["gt_answer"]] * self.n)
        return Trajectory(
            sequences=torch.tensor([prompt + r + [pad] * (width - len(r)) for r in rows]),
            action_mask=torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool),
            logprobs=torch.tensor([lp + [0.0] * (width - len(lp)) for lp in logps]) if first.logprobs is not None else None,
            rewards=torch.tensor(total), prompt_length=len(prompt),
            version=min([first.version] + [v for _, _, v in seconds]),
            prompts=[text] * self.n, completions=finals, reward_components=components)
