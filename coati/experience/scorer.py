"""One scorer for every place completions are scored: rollouts for training, rollout workflows (asynchronous
generation) and held-out evaluation all decode and reward the same way."""
import asyncio
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from transformers import TrainerState

from coati.models.reward_model import sequence_rewards
from coati.models.vision import joined_image_inputs
from coati.dataset.prepare import PROMPT_COLUMN
from coati.rewards import WeightedReward
from coati.rewards.registry import RewardInputs
from coati.rewards.remote import Sequences

from .experience import RolloutSample, collate, in_row_chunks

REWARD_MODEL = "reward_model"

Scores = Tuple[List[float], Dict[str, List[float]]]


class Scorer:
    """Decodes completions (special tokens left out) and scores them: `reward_fn` on the text with the prompt
    row's other fields, plus `reward_model`'s score of the token sequences (the component `reward_model`) when
    one is given (`forward_batch_size` rows per forward, 0: all at once; the samples collated as the learner's are,
    at least `completion_width` wide), added to the total with `reward_model_weight`. Returns (total per completion,
    components by name); with neither, every reward is 0 (a run that learns from a distillation teacher alone)."""

    def __init__(self, tokenizer: Any, reward_fn: Optional[WeightedReward] = None,
                 reward_model: Optional[torch.nn.Module] = None, forward_batch_size: int = 0,
                 reward_model_weight: float = 1.0, completion_width: int = 0) -> None:
        self.tokenizer, self.reward_fn, self.reward_model = tokenizer, reward_fn, reward_model
        self.forward_batch_size, self.reward_model_weight = forward_batch_size, reward_model_weight
        self.completion_width = completion_width
        self.trainer_state: Optional[TrainerState] = None
        """The trainer's progress, for reward functions (TRL's `trainer_state`); the trainer sets it each episode."""
        self._pending: List[Tuple[Sequence[str], Sequence[str], Dict[str, Sequence[Any]],
                                  Optional[Sequence[RolloutSample]], asyncio.Future]] = []

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def sequences(self, samples: Sequence[RolloutSample]) -> Sequences:
        """The samples' full sequences (prompt and completion) as ids and as text with special tokens."""
        ids = [s.attended_ids for s in samples]
        return Sequences([self.tokenizer.decode(row, skip_special_tokens=False) for row in ids], ids)

    @torch.no_grad()
    def score_texts(self, prompts: Sequence[str], completions: Sequence[str], fields: Dict[str, Sequence[Any]],
                    samples: Optional[Sequence[RolloutSample]] = None) -> Scores:
        """Scores of `completions` of `prompts`; `fields` are the rows' other columns; the reward model, if any,
        reads the `samples`' token sequences (with their images)."""
        fields = dict(fields)
        originals = fields.pop(PROMPT_COLUMN, None)
        total, components = [0.0] * len(completions), {}
        if self.reward_fn is not None:
            fn = self.reward_fn   # TRL's arguments and the sequences are made only where a part reads them
            reads_sequences = samples is not None and getattr(fn, "takes_sequences", False)
            sequences = {"sequences": self.sequences(samples)} if reads_sequences else {}
            reads_inputs = getattr(fn, "takes_inputs", True)
            inputs = self.reward_inputs(prompts, completions, originals, samples) if reads_inputs else None
            total, components = fn(list(prompts), list(completions), inputs=inputs, **fields, **sequences)
        if self.reward_model is not None:
            if samples is None:
                raise ValueError("a reward model scores token sequences: pass the rollout samples")
            batch = collate(samples, self.tokenizer.pad_token_id, self.completion_width)
            scores = in_row_chunks(lambda rows: sequence_rewards(
                self.reward_model, batch.sequences[rows], batch.attention_mask[rows],
                joined_image_inputs([s.image_inputs for s in samples[rows]], batch.sequences.device) or None),
                len(samples), self.forward_batch_size).tolist()
            components = {**components, REWARD_MODEL: scores}
            total = [t + self.reward_model_weight * s for t, s in zip(total, scores)]
        return total, components

    def reward_inputs(self, prompts: Sequence[str], completions: Sequence[str], originals: Optional[Sequence[Any]],
                      samples: Optional[Sequence[RolloutSample]]) -> RewardInputs:
        """TRL's reward-function arguments: each prompt as the data gave it (`PROMPT_COLUMN`; the decoded prompt for
        data prepared without it), each completion as text, or as one assistant message for a conversational
        prompt, and the completions' token ids (the sampled ones; re-tokenized when no `samples` are given)."""
        given = [json.loads(o) if isinstance(o, str) else None for o in (originals or [None] * len(prompts))]
        data_prompts = [p if g is None else g for p, g in zip(prompts, given)]
        data_completions = [[{"role": "assistant", "content": c}] if isinstance(g, list) else c
                            for c, g in zip(completions, given)]
        if samples is not None:
            ids = [s.sampled_ids for s in samples]
        else:
            ids = self.tokenizer(list(completions), add_special_tokens=False)["input_ids"]
        return RewardInputs(data_prompts, data_completions, ids, self.trainer_state)

    async def ascore(self, prompts: Sequence[str], completions: Sequence[str], fields: Dict[str, Sequence[Any]],
                     samples: Optional[Sequence[RolloutSample]] = None) -> Scores:
        """`score_texts` for a workflow: the calls made while the event loop runs one turn (every episode of a batch)
        are scored together, one reward-function call and one reward-model forward on a worker thread, as a batch
        would be; each caller gets its own rows back."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((prompts, completions, fields, samples, future))
        if len(self._pending) == 1:
            loop.call_soon(lambda: loop.create_task(self._flush()))
        return await future

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            fields = {k: [v for request in pending for v in request[2][k]] for k in pending[0][2]}
            given = all(request[3] is not None for request in pending)
            samples = [s for request in pending for s in request[3]] if given else None
            total, components = await asyncio.to_thread(
                self.score_texts, [p for request in pending for p in request[0]],
                [c for request in pending for c in request[1]], fields, samples)
        except Exception as error:   # every waiting episode raises it
            for *_, future in pending:
                future.set_exception(error)
            return
        start = 0
        for _, completions, _, _, future in pending:
            end = start + len(completions)
            future.set_result((total[start:end], {k: v[start:end] for k, v in components.items()}))
            start = end
