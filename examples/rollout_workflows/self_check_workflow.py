"""A two-turn rollout workflow, written without touching any trainer: the model answers, is asked to check
its answer, and answers again. The reward scores the final answer; only the model's own tokens are trained
on (the follow-up question is in the sequence but masked out).

    from self_check_workflow import SelfCheckWorkflow
    workflow = SelfCheckWorkflow(tokenizer, SamplingConfig(max_new_tokens=64), num_generations=8)
    executor = WorkflowExecutor(pool, workflow, batch_size=16, max_concurrent_rollouts=32, max_staleness=1)
"""
import asyncio
from typing import Any, Dict, List, Optional

from coati.config import SamplingConfig
from coati.rewards import WeightedReward
from coati.rollout import RolloutPool, RolloutSample, RolloutWorkflow, Trajectory, scored

CHECK = "Check your answer. Reply with the final answer only."


class SelfCheckWorkflow(RolloutWorkflow):
    def __init__(self, tokenizer: Any, sampling: SamplingConfig, num_generations: int) -> None:
        self.tokenizer, self.sampling, self.num_generations = tokenizer, sampling, num_generations
        self.reward = WeightedReward.from_specs(["math_answer"])
        follow_up = tokenizer.apply_chat_template([{"role": "user", "content": CHECK}], tokenize=False,
                                                  add_generation_prompt=True)
        self.follow_up: List[int] = tokenizer.encode(follow_up, add_special_tokens=False)

    async def _second_turn(self, pool: RolloutPool, prompt: List[int], first: List[int]):
        out = await pool.agenerate(prompt + first + self.follow_up, self.sampling, 1)
        return out.rows[0], out.version   # (token ids, their log-probs or None, their versions), the version

    async def arun_episode(self, pool: RolloutPool, sample: Dict[str, Any]) -> Optional[Trajectory]:
        prompt, n, asked = list(sample["input_ids"]), self.num_generations, len(self.follow_up)
        first = await pool.agenerate(prompt, self.sampling, n)
        turns = first.rows
        seconds = await asyncio.gather(*(self._second_turn(pool, prompt, ids) for ids, _, _ in turns))
        samples = []
        for (ids1, lp1, v1), ((ids2, lp2, v2), _) in zip(turns, seconds):
            samples.append(RolloutSample(
                prompt_ids=prompt, completion_ids=ids1 + self.follow_up + ids2,
                completion_mask=[True] * len(ids1) + [False] * asked + [True] * len(ids2),   # the question: not trained
                logprobs=None if lp1 is None else lp1 + [0.0] * asked + lp2,
                token_versions=v1 + [first.version] * asked + v2, turn_starts=(0, len(ids1) + asked)))
        text = self.tokenizer.decode(prompt, skip_special_tokens=True)
        finals = [self.tokenizer.decode(ids2, skip_special_tokens=True) for (ids2, _, _), _ in seconds]
        scores = self.reward([text] * n, finals, gt_answer=[sample["gt_answer"]] * n)
        return scored(samples, [text] * n, finals, scores, version=min([first.version] + [v for _, v in seconds]))
