"""Multi-turn, tool-using rollouts: generate, let the environment answer (run the tool calls), generate again, until
the model answers without a call, `max_turns` model turns, or `max_total_tokens` after the prompt.

The trained sequence is the prompt, then each turn's sampled token ids verbatim, with what the environment adds
tokenized once and appended (`ChatTokens`); the action mask covers only the sampled tokens, and the engine's
log-probs (where it reports them) exist exactly for those. The episode is scored on its final answer by the trainer's
`Scorer` (plus the environment's per-turn terms), and reports its turns, tool calls, tool errors by kind, tool time,
how it ended and how many tokens the model and the environment wrote, as `rollout/*` metrics.
"""
import asyncio
import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence

from coati.config import SamplingConfig
from coati.dataset.prepare import PROMPT_COLUMN
from coati.dataset.collators import IMAGE_INPUTS, PROMPT_FIELDS
from coati.dataset.vision import IMAGES
from coati.experience.experience import RolloutSample
from coati.experience.scorer import Scorer

from .chat import ChatTokens, prompt_images
from .pool import Completions, RolloutPool
from .environment import ERROR_KINDS, Environment, Message
from .workflow import RolloutWorkflow, Trajectory, scored

ENDINGS = ("answer", "max_turns", "max_total_tokens", "truncated")
"""How an episode ends: an answer without a tool call (or a turn ended by a stop token that closes no turn, such as
end of sequence), the turn limit, the token budget, or a turn cut at `max_new_tokens` (nothing can follow it)."""


@dataclass
class Episode:
    """One sample's conversation as it is built: token ids after the prompt, which of them the model sampled, their
    log-probs (None once a turn came without) and weights versions (-1 where none made them), where each model turn
    starts, the messages, and counts for the metrics (tool time and errors only where its tools ran here,
    `runs_tools`: an agent runs its own, and they never reach us)."""

    ids: List[int] = field(default_factory=list)
    sampled: List[bool] = field(default_factory=list)
    logprobs: Optional[List[float]] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    turn_starts: List[int] = field(default_factory=list)
    messages: List[Message] = field(default_factory=list)
    final_text: str = ""
    reward: float = 0.0
    ended: str = "answer"
    counts: Dict[str, float] = field(default_factory=dict)
    runs_tools: bool = True

    def add(self, ids: List[int], sampled: bool, logprobs: Optional[List[float]] = None,
            versions: Optional[List[int]] = None) -> None:
        if sampled:
            self.turn_starts.append(len(self.ids))
        self.ids += ids
        self.sampled += [sampled] * len(ids)
        self.versions += versions if versions is not None else [-1] * len(ids)
        if self.logprobs is not None:
            self.logprobs = None if sampled and logprobs is None else self.logprobs + (logprobs or [0.0] * len(ids))

    def stats(self, endings: Sequence[str] = ENDINGS) -> Dict[str, float]:
        sampled = float(sum(self.sampled))
        stats = {"turns": float(len(self.turn_starts)), "tool_calls": self.counts.get("tool_calls", 0.0),
                 "sampled_tokens": sampled, "environment_tokens": len(self.ids) - sampled}
        if self.runs_tools:
            stats["tool_seconds"] = self.counts.get("tool_seconds", 0.0)
            stats.update({f"tool_errors/{kind}": self.counts.get(f"tool_errors/{kind}", 0.0) for kind in ERROR_KINDS})
        stats.update({f"ended/{how}": float(self.ended == how) for how in endings})
        stats.update({name: value for name, value in self.counts.items() if name.startswith("agent/")})
        return dict(sorted(stats.items()))


class MultiTurnWorkflow(RolloutWorkflow):
    """`num_generations` multi-turn episodes of each prompt row (its conversation, `PROMPT_COLUMN`, rendered with the
    tools by `chat`), each with an environment from `make_environment`, scored by `scorer` on the final answer."""

    def __init__(self, scorer: Scorer, chat: ChatTokens, make_environment: Callable[[], Environment],
                 sampling: SamplingConfig, num_generations: int, max_turns: int, max_total_tokens: int) -> None:
        self.scorer, self.chat, self.make_environment = scorer, chat, make_environment
        self.sampling, self.num_generations = sampling, num_generations
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.closer = chat.turn_stop_id()

    async def arun_episode(self, pool: RolloutPool, sample: Dict[str, Any]) -> Optional[Trajectory]:
        messages, first_turn = conversation(sample), self._turn_sampling(0)
        environments = [self.make_environment() for _ in range(self.num_generations)]
        for environment in environments:
            environment.reset(sample)
        tools = environments[0].tools()
        prompt = self.chat.prompt_ids(messages, tools, sample.get(IMAGES) or ())
        images = prompt_images(sample)   # every turn is generated with them
        session = uuid.uuid4().hex   # every turn of the group on one copy of the model, which caches the prompt
        first = await pool.agenerate(prompt, first_turn, self.num_generations, session, **images)
        seats = [pool.take_seat() for _ in range(self.num_generations)]   # before any episode's tools run
        episodes = await asyncio.gather(*(seated(pool, seats[i], self._play(pool, environments[i], messages, prompt,
                                                                              tools, first, i, session, seats[i], images))
                                          for i in range(self.num_generations)))
        return await assemble(self.scorer, sample, messages, [prompt] * len(episodes), episodes, first.version)

    def _turn_sampling(self, used: int) -> SamplingConfig:
        budget = self.max_total_tokens - used if self.max_total_tokens else self.sampling.max_new_tokens
        return dataclasses.replace(self.sampling, max_new_tokens=min(self.sampling.max_new_tokens, budget))

    async def _play(self, pool: RolloutPool, environment: Environment, prompt_messages: List[Message],
                    prompt: List[int], tools: Any, first: Completions, row: int, session: str,
                    seat: Optional[int], images: Dict[str, Any]) -> Episode:
        episode, out = Episode(), first
        history = list(prompt_messages)
        while True:
            turn, logprobs, versions = out.rows[row]
            episode.add(turn, True, logprobs, versions)
            stopped = bool(turn) and turn[-1] in self.chat.stop_ids
            text = self.chat.tokenizer.decode(turn[:-1] if stopped else turn, skip_special_tokens=False)
            episode.final_text = self.chat.tokenizer.decode(turn, skip_special_tokens=True)
            episode.messages.append({"role": "assistant", "content": text})
            if not stopped:   # cut at max_new_tokens: no template closes the turn, so nothing can follow it
                episode.ended = "truncated"
                return episode
            if turn[-1] != self.closer:   # a stop token that ends the sequence, not the turn: the model is done
                return episode
            step = await asyncio.to_thread(environment.step, text)
            episode.reward += step.reward
            for name, value in step.counts.items():
                episode.counts[name] = episode.counts.get(name, 0.0) + value
            if step.done:
                return episode
            if len(episode.turn_starts) >= self.max_turns:
                episode.ended = "max_turns"
                return episode
            added = self.chat.after_turn(history, turn[-1], step.observation, tools)
            history += [{"role": "assistant", "content": text}, *step.observation]
            episode.messages += step.observation
            episode.add(added, False)
            if self.max_total_tokens and len(episode.ids) >= self.max_total_tokens:
                episode.ended = "max_total_tokens"
                return episode
            out, row = await pool.agenerate(prompt + episode.ids, self._turn_sampling(len(episode.ids)), 1, session,
                                              seat, **images), 0


async def seated(pool: RolloutPool, seat: Optional[int], play: Awaitable[Episode]) -> Episode:
    """`play`'s episode; its `seat` is left however it ends."""
    try:
        return await play
    finally:
        pool.leave_seat(seat)


async def assemble(scorer: Scorer, sample: Dict[str, Any], messages: List[Message], prompts: List[List[int]],
                   episodes: List[Episode], version: int, endings: Sequence[str] = ENDINGS) -> Trajectory:
    """The group's episodes, each after its own prompt, as one `Trajectory` of unpadded samples, scored by `scorer` on
    the final answers plus each episode's own reward (`environment`)."""
    n = len(episodes)
    reported = all(e.logprobs is not None for e in episodes)
    image_inputs = prompt_images(sample).get(IMAGE_INPUTS, {})   # the group's, shared by its samples
    samples = [RolloutSample(prompt, e.ids, e.sampled, e.logprobs if reported else None,
                             [v if v >= 0 else version for v in e.versions], tuple(e.turn_starts), stats=e.stats(endings),
                             image_inputs=image_inputs)
               for prompt, e in zip(prompts, episodes)]
    fields = {k: [v] * n for k, v in sample.items() if k not in PROMPT_FIELDS}
    total, components = await scorer.ascore([scorer.decode(p) for p in prompts], [e.final_text for e in episodes],
                                            fields, samples)
    components = {**components, "environment": [e.reward for e in episodes]}
    total = [t + e.reward for t, e in zip(total, episodes)]
    return scored(samples, [messages] * n, [e.messages for e in episodes], (total, components), version)


def conversation(sample: Dict[str, Any]) -> List[Message]:
    """The prompt row's conversation (prepared from `messages`); a row prepared from plain text is refused."""
    given = sample.get(PROMPT_COLUMN)
    messages = json.loads(given) if isinstance(given, str) else given
    if not isinstance(messages, list):
        raise ValueError("multi-turn rollouts need conversational prompts (rows with `messages`), prepared with "
                         "prepare_dataset.py --type prompt")
    return messages
