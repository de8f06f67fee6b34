"""The one rollout sample a workflow makes (`RolloutSample`, unpadded), the one collate that pads samples into a
batch, one batch of on-policy experience, and the experience makers of GRPO and PPO that produce it."""
import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from coati.config import GRPOConfig, PPOConfig, RolloutConfig
from coati.models.critic import action_values
from coati.models.generation import GenerationEngine
from coati.models.logprobs import action_logps, kl_penalty
from coati.models.loss import masked_mean, masked_var
from coati.models.vision import joined_image_inputs
from coati.rewards.registry import table_columns
from coati.utils.registry import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS

from .advantages import AdvantageConfig, compute_gae, tied_groups
from .controllers import KL_DEFAULTS, KLController, TemperatureController
from .shaping import shape_rewards

if TYPE_CHECKING:
    from .scorer import Scorer


@dataclass(frozen=True)
class RolloutSample:
    """One finished sample as its workflow made it, unpadded, from the workflow to the learner: the prompt's token
    ids, then every token after it (`completion_ids`: the model's, and in a multi-turn episode the environment's),
    `completion_mask` over those the model sampled (the ones trained on, TRL's name), their log-probs under the
    generating weights (`logprobs`, 0 on the environment's; None from an engine that reports none) and the weights
    version that made each (`token_versions`), and where each model turn starts (`turn_starts`). Once scored: the
    total `reward` and each reward's value (`reward_components`); for logs, the `prompt` and `completion` as text (or
    messages, for conversational data) and counts of how it was made (`stats`, logged as `rollout/<name>`); with
    images, the prompt's `image_inputs`."""

    prompt_ids: List[int]
    completion_ids: List[int]
    completion_mask: List[bool]
    logprobs: Optional[List[float]]
    token_versions: List[int]
    turn_starts: Tuple[int, ...] = (0,)
    reward: float = 0.0
    reward_components: Dict[str, Any] = field(default_factory=dict)
    prompt: Any = ""
    completion: Any = ""
    stats: Dict[str, float] = field(default_factory=dict)
    image_inputs: Dict[str, torch.Tensor] = field(default_factory=dict)
    """A vision-language prompt's image inputs (`ImageProcessing.pixel_inputs`), shared by its group's samples."""

    @property
    def sampled_ids(self) -> List[int]:
        """The token ids the model sampled (a multi-turn episode's environment tokens left out)."""
        return [token for token, sampled in zip(self.completion_ids, self.completion_mask) if sampled]

    @property
    def attended_ids(self) -> List[int]:
        """The prompt and the completion through its last sampled token: what a batch attends to."""
        last = max((i + 1 for i, sampled in enumerate(self.completion_mask) if sampled), default=0)
        return self.prompt_ids + self.completion_ids[:last]


class Collated(NamedTuple):
    """Samples as one padded batch: prompts left-padded to `prompt_length`, completions right-padded. A row holds its
    prompt and its completion through the last sampled token (`attention_mask`); what follows, such as a tool's answer
    that a token budget cut off, is padding, so a reward model reads its score at the last sampled token.
    `action_mask` marks the sampled tokens; `behaviour_log_probs` are there where every sample has log-probs;
    `token_versions` are each token's weights version (0 on padding)."""

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    prompt_length: int
    behaviour_log_probs: Optional[torch.Tensor]
    token_versions: torch.Tensor


def collate(samples: Sequence[RolloutSample], pad_token_id: int, min_width: int = 0) -> Collated:
    """The one place rollout samples are padded: for the learner's forwards and for a reward model's. Completions
    are padded to the longest, and at least to `min_width` (the run's completion limit, `max_new_tokens`: a
    single-turn batch then always has the one shape generation gives it, as verl's fixed response length, and the
    same floating-point sums step after step)."""
    prompt_length = max(len(s.prompt_ids) for s in samples)
    width = max(1, min_width, max(len(s.completion_ids) for s in samples))
    sequences = torch.full((len(samples), prompt_length + width), pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(sequences)
    action_mask = torch.zeros(len(samples), width, dtype=torch.bool)
    behaviour = torch.zeros(len(samples), width)
    token_versions = torch.zeros(len(samples), width, dtype=torch.long)
    for row, s in enumerate(samples):
        p, c, attended = len(s.prompt_ids), len(s.completion_ids), s.attended_ids
        sequences[row, prompt_length - p:prompt_length - p + len(attended)] = torch.tensor(attended)
        attention[row, prompt_length - p:prompt_length - p + len(attended)] = 1
        action_mask[row, :c] = torch.tensor(s.completion_mask, dtype=torch.bool)
        token_versions[row, :c] = torch.tensor(s.token_versions, dtype=torch.long)
        if s.logprobs is not None:
            behaviour[row, :c] = torch.tensor(s.logprobs)
    reported = all(s.logprobs is not None for s in samples)
    return Collated(sequences, attention, action_mask, prompt_length, behaviour if reported else None, token_versions)


@dataclass(frozen=True)
class Experience:
    """Rollouts and everything the update needs, built by pure stages (`ExperienceMaker.from_trajectories`: each
    returns a new one with what it adds, `dataclasses.replace`) and never changed after. Token tensors over completion columns are (batch, N);
    `sequences`/`attention_mask` hold prompt + completion. Per row, for logs and tables: the `prompts` and
    `completions` as text, each reward's value (`reward_components`), whether the completion ended with a stop
    token (`terminated`), and the weights version that generated it (`versions`; per token, `token_versions`) and
    its prompt's (pass, row) (`prompt_ids`), for asynchronous rollouts.
    `extra_rollouts` counts the completions generated beyond the batch to fill it (dynamic sampling); `timing`
    holds seconds per phase of making it, `rollout_stats` per-row counts of how each sample was made (turns, tool
    calls); `packed`: its forwards run packed (`RolloutConfig.packing`). `action_log_probs` (the old policy's) is
    None when the learning forward's own log-probs, detached, stand for them
    (`RolloutConfig.old_log_probs_at_collection`). With a distillation teacher (`coati.experience.distillation`):
    its log-probs of the sampled tokens, and its top-k log-probs and token ids per position (batch, N, k) where a
    distillation loss reads them. With a process reward model: each step's score on the token that ends it
    (`step_rewards`, weighted) and where steps end (`step_mask`). With images: each row's image inputs
    (`image_inputs`; `images(rows)` joins them for a forward)."""

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    prompt_length: int
    action_log_probs: Optional[torch.Tensor]
    rewards: torch.Tensor
    advantages: torch.Tensor
    ref_log_probs: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    returns: Optional[torch.Tensor] = None
    kl: Optional[torch.Tensor] = None
    loss_mask: Optional[torch.Tensor] = None
    behaviour_log_probs: Optional[torch.Tensor] = None
    prompts: List[str] = field(default_factory=list)
    completions: List[str] = field(default_factory=list)
    reward_components: Dict[str, List[float]] = field(default_factory=dict)
    rollout_stats: Dict[str, List[float]] = field(default_factory=dict)
    terminated: Optional[torch.Tensor] = None
    versions: Optional[torch.Tensor] = None
    token_versions: Optional[torch.Tensor] = None
    prompt_ids: List[Any] = field(default_factory=list)
    extra_rollouts: int = 0
    timing: Dict[str, float] = field(default_factory=dict)
    packed: bool = False
    teacher_log_probs: Optional[torch.Tensor] = None
    teacher_top_logps: Optional[torch.Tensor] = None
    teacher_top_ids: Optional[torch.Tensor] = None
    step_rewards: Optional[torch.Tensor] = None
    step_mask: Optional[torch.Tensor] = None
    image_inputs: List[Dict[str, torch.Tensor]] = field(default_factory=list)

    def images(self, rows: slice = slice(None)) -> Optional[Dict[str, torch.Tensor]]:
        """The image inputs of `rows` as one forward takes them, on the batch's device; None without images."""
        if not self.image_inputs:
            return None
        return joined_image_inputs(self.image_inputs[rows], self.sequences.device) or None

    def rows(self, start: int, end: int) -> "Experience":
        """Rows `start:end`: every per-row tensor, list and dict of lists is sliced, everything else (the prompt
        length, timings) is shared."""
        def part(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return value[start:end]
            if isinstance(value, list):
                return value[start:end]
            if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
                return {k: v[start:end] for k, v in value.items()}
            return value

        return Experience(**{f.name: part(getattr(self, f.name)) for f in dataclasses.fields(self)})


def through_last(mask: torch.Tensor) -> torch.Tensor:
    """True from the first column up to each row's last True: the tokens a multi-turn completion spans,
    the turns it does not train on (a user's or a tool's) included."""
    return mask.flip(-1).cummax(-1).values.flip(-1)


def in_row_chunks(forward: Callable[[slice], Any], rows: int, chunk: int) -> Any:
    """`forward(rows)` over slices of at most `chunk` rows (0: all at once), concatenated: the same values with a
    smaller peak of activation memory. A forward that returns a tuple of tensors (or Nones) gets each concatenated."""
    if not chunk or chunk >= rows:
        return forward(slice(0, rows))
    parts = [forward(slice(start, min(start + chunk, rows))) for start in range(0, rows, chunk)]
    if isinstance(parts[0], tuple):
        return tuple(None if items[0] is None else torch.cat(items) for items in zip(*parts))
    return torch.cat(parts)


@contextmanager
def timed(timing: Dict[str, float], phase: str) -> Iterator[None]:
    """Add the seconds the block takes to `timing[phase]`."""
    start = time.perf_counter()
    yield
    timing[phase] = timing.get(phase, 0.0) + time.perf_counter() - start


class ExperienceMaker:
    """What both makers share: `scorer` (the reward function on the text, plus a reward model's score when one is
    given), the `engine` rollouts and evaluation generate with, and `from_trajectories`, which takes the actor's
    and the frozen reference's log-probs of finished rollouts and lets each maker compute its advantages
    (`_with_advantages`)."""

    def __init__(self, actor: torch.nn.Module, engine: GenerationEngine, scorer: "Scorer", config: RolloutConfig,
                 ref_model: Optional[torch.nn.Module] = None, teacher: Optional[Any] = None,
                 step_scorer: Optional[Any] = None) -> None:
        self.actor, self.engine, self.scorer, self.tokenizer = actor, engine, scorer, scorer.tokenizer
        self.config, self.ref_model, self.teacher, self.step_scorer = config, ref_model, teacher, step_scorer
        self.kl_estimator = KL_ESTIMATORS.get(config.kl_estimator)

    @property
    def group_size(self) -> int:
        """Consecutive completions of one prompt whose advantages are relative to one another, a group in the metrics
        (GRPO's: all `num_generations`; 1 where advantages stand alone, as PPO's)."""
        return 1

    @property
    def num_generations(self) -> int:
        """How many completions a rollout makes of each prompt (the config's, the one setting of it)."""
        return self.config.num_generations

    @torch.no_grad()
    def from_trajectories(self, trajectories: Sequence[Any], device: torch.device,
                          timing: Optional[Dict[str, float]] = None, extra_rollouts: int = 0) -> Experience:
        """Experience from finished rollouts (`coati.rollout.Trajectory`s of `num_generations` samples each):
        the actor's log-probs now are the proximal policy's; the generators' log-probs, where the engine reported
        them (asynchronous rollouts), are its `behaviour_log_probs` for the off-policy correction. `timing` holds the
        seconds the rollouts took, by phase; `extra_rollouts` counts completions drawn beyond the batch."""
        experience = stack_trajectories(trajectories, device, self.tokenizer.pad_token_id,
                                        self.config.sampling.max_new_tokens)
        experience = dataclasses.replace(experience, timing={**experience.timing, **(timing or {})},
                                         extra_rollouts=extra_rollouts, packed=self.config.packing)
        experience = dataclasses.replace(experience, terminated=self._terminated(experience))
        experience = self._with_log_probs(experience)
        if self.step_scorer is not None:
            experience = self._with_step_rewards(experience)
        return self._with_advantages(experience)

    def _with_advantages(self, experience: Experience) -> Experience:
        """`experience` with the algorithm's advantages (and whatever else it needs: values, returns, a loss mask)."""
        raise NotImplementedError

    def _with_log_probs(self, experience: Experience) -> Experience:
        """`experience` with the actor's (and the reference's, and a teacher's) log-probs of the completions, and the
        KL between the actor's and the reference's."""
        e, timing, added = experience, dict(experience.timing), {}
        if self.config.old_log_probs_at_collection or self.ref_model is not None or self.teacher is not None:
            with timed(timing, "actor_forward"):
                added["action_log_probs"] = self._per_rows(lambda rows: action_logps(
                    self.actor, e.sequences[rows], e.attention_mask[rows], e.prompt_length, packed=e.packed,
                    images=e.images(rows)), e)
        if self.ref_model is not None:
            with timed(timing, "reference_forward"):
                added["ref_log_probs"] = self._per_rows(lambda rows: action_logps(
                    self.ref_model, e.sequences[rows], e.attention_mask[rows], e.prompt_length, packed=e.packed,
                    images=e.images(rows)), e)
            added["kl"] = kl_penalty(added["action_log_probs"], added["ref_log_probs"], self.kl_estimator) * e.action_mask
        if self.teacher is not None:
            with timed(timing, "teacher_forward"):
                added.update(self.teacher.scores(e, self._per_rows))
        return dataclasses.replace(e, timing=timing, **added)

    def _with_step_rewards(self, experience: Experience) -> Experience:
        """`experience` with the process reward model's step scores (`step_scorer`), on the tokens that end the steps;
        logged per row as `rollout/prm_step_score` (the mean over its steps) and `rollout/prm_steps`."""
        e, timing = experience, dict(experience.timing)
        with timed(timing, "prm_forward"):
            step_rewards, step_mask = self._per_rows(lambda rows: self.step_scorer(
                e.sequences[rows], e.attention_mask[rows], e.prompt_length, e.action_mask[rows], e.terminated[rows]), e)
        steps = step_mask.sum(-1)
        stats = {**e.rollout_stats, "prm_steps": steps.tolist(),
                 "prm_step_score": (step_rewards.sum(-1) / steps.clamp(min=1)).tolist()}
        return dataclasses.replace(e, timing=timing, step_rewards=step_rewards, step_mask=step_mask, rollout_stats=stats)

    def _per_rows(self, forward: Callable[[slice], Any], experience: Experience) -> Any:
        """`forward` over the experience's rows, `config.forward_batch_size` at a time."""
        return in_row_chunks(forward, experience.sequences.size(0), self.config.forward_batch_size)

    def _terminated(self, experience: Experience) -> torch.Tensor:
        """Per row: whether the completion ended with a stop token (rather than at the length limit)."""
        lengths = through_last(experience.action_mask.bool()).sum(-1, keepdim=True)
        last = experience.sequences[:, experience.prompt_length:].gather(1, (lengths - 1).clamp(min=0)).squeeze(-1)
        stops = self.config.sampling.stop_token_ids or (self.tokenizer.eos_token_id,)
        return torch.isin(last, torch.tensor(stops, device=last.device)) & (lengths.squeeze(-1) > 0)


class GRPOExperienceMaker(ExperienceMaker):
    """`num_generations` completions per prompt; advantages come from the rewards of each prompt's group (no
    critic), by the `advantage_estimator` of `ADVANTAGE_ESTIMATORS` (`maxent` at the temperature of `temperature`).
    Groups whose rewards all tie carry no signal: with `drop_tied_groups` or `dynamic_sampling` (whose rollout
    source replaces them by groups of new prompts where it can) those left stay in the batch (every rank steps
    alike) but are masked out of the loss. With `kl_in_reward`, `kl_controller`'s beta times each completion's
    summed KL to the reference is subtracted from its reward before the advantages (the logged rewards stay the
    scores)."""

    config: GRPOConfig

    def __init__(self, *args: Any, temperature: Optional[TemperatureController] = None,
                 kl_controller: Optional[KLController] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config.advantage_estimator == "maxent" and temperature is None:
            temperature = TemperatureController()
        self.temperature = temperature
        self.kl_controller = kl_controller or KLController.from_settings(KL_DEFAULTS)
        self.advantage_estimator = ADVANTAGE_ESTIMATORS.get(self.config.advantage_estimator)

    @property
    def group_size(self) -> int:
        return self.config.num_generations

    def advantage_config(self, experience: Optional[Experience] = None) -> AdvantageConfig:
        """The estimator's config now: the group size, std scaling, the user's options, MaxEnt's current tau, and the
        process reward model's step scores of `experience` where it has them."""
        options = dict(self.config.advantage_options)
        if self.temperature is not None:
            options["tau"] = self.temperature.value
        steps = (experience.step_rewards, experience.step_mask) if experience is not None else (None, None)
        return AdvantageConfig(self.config.num_generations, self.config.scale_rewards, options, *steps)

    def _with_advantages(self, experience: Experience) -> Experience:
        """`experience` with the estimator's advantages from each group's rewards (shaped first, where shapers are
        named: its `rewards` are then the shaped ones); tied groups and truncated completions masked out of the loss
        where asked."""
        config, raw = self.config, experience.rewards
        rewards = raw
        if config.reward_shaping:
            lengths = through_last(experience.action_mask.bool()).sum(-1)
            rewards = shape_rewards(raw, experience.reward_components, lengths, config.reward_shaping,
                                    config.shaping.resolved(config.sampling.max_new_tokens))
        scored = rewards
        if config.kl_in_reward and experience.kl is not None:
            scored = rewards - self.kl_controller.value * experience.kl.sum(-1)
        advantages = self.advantage_estimator(scored, self.advantage_config(experience))
        loss_mask = experience.action_mask.clone()
        if config.drop_tied_groups or config.dynamic_sampling:
            loss_mask[tied_groups(raw, config.num_generations)] = False
        if config.mask_truncated_completions:
            loss_mask[~experience.terminated] = False
        experience = dataclasses.replace(experience, rewards=rewards, advantages=advantages, loss_mask=loss_mask)
        return self.teacher.with_advantages(experience) if self.teacher is not None else experience


def stack_trajectories(trajectories: Sequence[Any], device: torch.device, pad_token_id: int = 0,
                       min_width: int = 0) -> Experience:
    """One experience batch from trajectories (`coati.rollout.Trajectory`, groups of `RolloutSample`s) collated once:
    tokens, masks, rewards, the generating log-probs as `behaviour_log_probs` where every engine reported them, and
    each row's records (`_with_records`); completions padded at least to `min_width`. Its advantages are zeros until a
    maker computes them."""
    samples = [s for t in trajectories for s in t.samples]
    batch = collate(samples, pad_token_id, min_width)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32, device=device)
    behaviour = None if batch.behaviour_log_probs is None else batch.behaviour_log_probs.to(device)
    tokens = Experience(batch.sequences.to(device), batch.attention_mask.to(device), batch.action_mask.to(device),
                        batch.prompt_length, None, rewards, torch.zeros_like(rewards), behaviour_log_probs=behaviour,
                        token_versions=batch.token_versions.to(device))
    return _with_records(tokens, trajectories, samples)


def _with_records(experience: Experience, trajectories: Sequence[Any], samples: Sequence[RolloutSample]) -> Experience:
    """`experience` with each row's records (`samples`, the trajectories' in order), for logs and sample tables: its
    text, reward components and rollout stats, and its trajectory's weights version and streamed prompt's (pass, row)."""
    versions = torch.tensor([t.version for t in trajectories for _ in t.samples], device=experience.rewards.device)
    return dataclasses.replace(experience, prompts=[s.prompt for s in samples],
                               completions=[s.completion for s in samples],
                               reward_components=per_name(s.reward_components for s in samples),
                               rollout_stats=per_name(s.stats for s in samples), versions=versions,
                               image_inputs=[s.image_inputs for s in samples] if any(s.image_inputs for s in samples) else [],
                               prompt_ids=[t.prompt_id for t in trajectories for _ in t.samples])


def per_name(rows: Iterator[Dict[str, Any]]) -> Dict[str, List[Any]]:
    """Per-sample dicts (reward components, rollout stats) as one list per name, in the samples' order; the names are
    the first sample's."""
    rows = list(rows)
    return {name: [row[name] for row in rows] for name in (rows[0] if rows else {})}


def last_token_rewards(rewards: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """(batch, N) token rewards: each sequence's reward on its last completion token, zero elsewhere."""
    last = (action_mask.long().cumsum(-1) == action_mask.long().sum(-1, keepdim=True)) & action_mask.bool()
    return last.float() * rewards.unsqueeze(-1)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the masked entries; zero where masked."""
    mask = mask.float()
    return (values - masked_mean(values, mask)) * torch.rsqrt(masked_var(values, mask) + eps) * mask


class PPOExperienceMaker(ExperienceMaker):
    """`config.num_generations` completions per prompt (default one). Token rewards are -beta times the KL to the reference
    on every token, plus the sequence's score (reward model and/or reward function) on its last token, plus a process
    reward model's step scores on the tokens that end the steps (where `step_scorer` is given), plus a distillation
    teacher's per-token reverse-KL term (where `teacher` is given); the
    critic's values turn them into GAE advantages and returns (Ouyang et al. 2022). beta is `kl_controller`'s value
    (default: none, 0)."""

    config: PPOConfig

    def __init__(self, actor: torch.nn.Module, critic: torch.nn.Module, engine: GenerationEngine, scorer: "Scorer",
                 config: PPOConfig, ref_model: Optional[torch.nn.Module] = None,
                 kl_controller: Optional[KLController] = None, step_scorer: Optional[Any] = None,
                 teacher: Optional[Any] = None) -> None:
        super().__init__(actor, engine, scorer, config, ref_model, teacher=teacher, step_scorer=step_scorer)
        self.critic = critic
        self.kl_controller = kl_controller or KLController.from_settings(KL_DEFAULTS)

    def _with_advantages(self, experience: Experience) -> Experience:
        """`experience` with the critic's values, then GAE advantages and returns of the KL-penalised token rewards."""
        e, mask, timing = experience, experience.action_mask, dict(experience.timing)
        with timed(timing, "critic_forward"):
            values = self._per_rows(lambda rows: action_values(self.critic, e.sequences[rows], e.attention_mask[rows],
                                                               e.prompt_length, e.packed, e.images(rows)), e) * mask
        token_rewards = last_token_rewards(e.rewards, mask)
        if e.step_rewards is not None:
            token_rewards = token_rewards + e.step_rewards
        stats = e.rollout_stats
        if self.teacher is not None:
            distilled, stats = self.teacher.token_rewards(e)
            token_rewards = token_rewards + distilled
        if e.kl is not None:
            token_rewards = token_rewards - self.kl_controller.value * e.kl
        advantages, returns = compute_gae(token_rewards, values, mask, self.config.gamma, self.config.lam)
        if self.config.whiten_advantages:
            advantages = whiten(advantages, mask)
        return dataclasses.replace(e, timing=timing, values=values, advantages=advantages, returns=returns,
                                   rollout_stats=stats)


def completion_rows(experience: Experience) -> List[Dict[str, Any]]:
    """One row per sample for a sample table: prompt, completion, reward, each component, advantage, and where the
    prompt came from a stream (asynchronous rollouts) its `prompt_id`, "pass:row" of the prompt set."""
    advantages = experience.advantages
    per_row = advantages if advantages.dim() == 1 else masked_mean(advantages, experience.action_mask, dim=-1)
    components = experience.reward_components
    rows = [{"prompt": p, "completion": c, "reward": float(r), **table_columns(components, i), "advantage": float(a)}
            for i, (p, c, r, a) in enumerate(zip(experience.prompts, experience.completions,
                                                 experience.rewards.tolist(), per_row.tolist()))]
    if any(prompt_id is not None for prompt_id in experience.prompt_ids):
        for row, prompt_id in zip(rows, experience.prompt_ids):
            row["prompt_id"] = None if prompt_id is None else "{}:{}".format(*prompt_id)
    return rows
