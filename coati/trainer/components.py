"""The on-policy update and what an algorithm adds to it, as parts the loop holds: the **objective** (the actor's
loss on one micro-batch; `PolicyGradient` is the built-in, OBJECTIVES the registry), terms added to it (GRPO's KL
to the reference, PPO's pretraining loss), an update pass's micro-batches (`micro_batches`), guarded and
accumulated optimizer steps (`OptimizerStep`), and PPO's critic with its own step. The loop calls them at fixed points; an algorithm is the set of parts it brings, not a
subclass that overrides the loop."""
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from coati.experience.controllers import KLController
from coati.experience.experience import Experience
from coati.models.critic import action_values
from coati.models.logprobs import action_logps, kl_penalty, logps_at, model_label_logps
from coati.models.loss import PolicyLoss, ValueLoss, masked_mean, masked_var, token_entropy
from coati.utils.ckpt_io import ModelState
from coati.utils.registry import DISTILL_LOSSES, KL_ESTIMATORS

from .base import NonFiniteGuard, apply_gradients
from .sources import CyclingLoader

Metrics = Dict[str, Tuple[float, float]]
Aggregate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

POLICY_LOSS_METRICS = {"clip_ratio/region": ("clip_ratio", "clip_ratio/region_mean"), "clip_ratio/low": ("clip_ratio/low_mean",),
                       "clip_ratio/high": ("clip_ratio/high_mean",), "clip_ratio/dual": ("clip_ratio/dual_mean",),
                       "token_loss": ("loss_per_completion_token",),
                       "skipped": ("policy_skipped",)}
"""`PolicyLoss` stats -> the logged names of the published GRPO module (the others keep their own)."""
POLICY_LOSS_MINIMA = {"clip_ratio/low": "clip_ratio/low_min", "behaviour_ratio_min": "behaviour_ratio/min"}
"""`PolicyLoss` stats whose minimum over a step's micro-batches is logged, under the name given."""
POLICY_LOSS_MAXIMA = {"clip_ratio/high": "clip_ratio/high_max", "behaviour_ratio_max": "behaviour_ratio/max"}
"""`PolicyLoss` stats whose maximum over a step's micro-batches is logged (`behaviour_ratio_min/max` only so)."""


class LossTerm:
    """A term added to the actor's loss on every micro-batch. `name` keys its checkpoint state."""

    name = "term"

    def __call__(self, experience: Experience, logps: torch.Tensor, mask: torch.Tensor, aggregate: Aggregate,
                 logits: Optional[torch.Tensor] = None) -> Tuple[Optional[torch.Tensor], Metrics]:
        """The term (None: nothing this time) and its metrics, from the actor's completion log-probs `logps` (and
        logits, (batch, N, vocab)) under `mask`; `aggregate(token_values, mask)` reduces per-token values as the
        policy loss does."""
        raise NotImplementedError

    def extras(self) -> Dict[str, float]:
        """Values logged with each window of training metrics as they are at its end."""
        return {}

    def state(self) -> Dict[str, Any]:
        return {}

    def restore(self, state: Dict[str, Any]) -> None:
        """Continue from a checkpoint's `state()`."""


class KLTerm(LossTerm):
    """beta times the KL to the frozen reference (`estimator`: k1/k2/k3), aggregated like the policy loss; beta is
    the controller's value (fixed, or adapted after every episode). Logged as `loss/kl`, and beta as `beta` and
    `kl_coeff` (the published GRPO module's names). With `in_loss` False (the KL is in the rewards), it adds nothing
    and logs beta alone."""

    name = "kl"

    def __init__(self, controller: KLController, estimator: str, in_loss: bool = True) -> None:
        self.controller, self.estimator, self.in_loss = controller, KL_ESTIMATORS.get(estimator), in_loss

    def __call__(self, experience: Experience, logps: torch.Tensor, mask: torch.Tensor, aggregate: Aggregate,
                 logits: Optional[torch.Tensor] = None) -> Tuple[Optional[torch.Tensor], Metrics]:
        beta = self.controller.value
        if beta <= 0 or experience.ref_log_probs is None or not self.in_loss:
            return None, {}
        kl = aggregate(kl_penalty(logps, experience.ref_log_probs, self.estimator), mask)
        return beta * kl, {"loss/kl": (beta * kl.item(), 1)}

    def extras(self) -> Dict[str, float]:
        return {"train/beta": self.controller.value, "train/kl_coeff": self.controller.value}


class PtxTerm(LossTerm):
    """InstructGPT's PPO-ptx: `coef` times the language-modelling loss of `actor` on the next supervised batch of
    `batches`, which keeps the policy close to its supervised behaviour. Logged as `loss/ptx` (unweighted); the
    batches' position is kept in checkpoints."""

    name = "ptx"

    def __init__(self, actor: torch.nn.Module, batches: CyclingLoader, coef: float) -> None:
        self.actor, self.batches, self.coef = actor, batches, coef

    def __call__(self, experience: Experience, logps: torch.Tensor, mask: torch.Tensor, aggregate: Aggregate,
                 logits: Optional[torch.Tensor] = None) -> Tuple[Optional[torch.Tensor], Metrics]:
        batch = self.batches.next()
        token_logps, label_mask = model_label_logps(self.actor, batch)
        loss = -masked_mean(token_logps, label_mask)
        return self.coef * loss, {"loss/ptx": (loss.item(), 1)}

    def state(self) -> Dict[str, Any]:
        return {"epoch": self.batches.epoch, "seen": self.batches.seen}

    def restore(self, state: Dict[str, Any]) -> None:
        self.batches.restore(state["epoch"], state["seen"])


class DistillTerm(LossTerm):
    """`coef` times a `DISTILL_LOSSES` entry (`loss`, with GKD's `beta`) between the actor's distribution and the
    teacher's on the teacher's top-k tokens at each completion position (`coati.experience.distillation`),
    aggregated like the policy loss. Logged as `loss/distill` (unweighted)."""

    name = "distill"

    def __init__(self, loss: str, coef: float, beta: float = 0.5) -> None:
        self.loss, self.coef, self.beta = DISTILL_LOSSES.get(loss), coef, beta

    def __call__(self, experience: Experience, logps: torch.Tensor, mask: torch.Tensor, aggregate: Aggregate,
                 logits: Optional[torch.Tensor] = None) -> Tuple[Optional[torch.Tensor], Metrics]:
        if experience.teacher_top_ids is None or logits is None:
            return None, {}
        student = logps_at(logits, experience.teacher_top_ids)
        loss = aggregate(self.loss(student, experience.teacher_top_logps, self.beta), mask)
        return self.coef * loss, {"loss/distill": (loss.item(), 1)}


def policy_loss_metrics(stats: Dict[str, torch.Tensor]) -> Dict[str, Tuple[float, float]]:
    """One step's `PolicyLoss` stats as metrics under their published names (POLICY_LOSS_METRICS)."""
    metrics = {}
    for name, value in stats.items():
        if name.startswith("behaviour_ratio_"):
            continue
        for logged in POLICY_LOSS_METRICS.get(name, (name,)):
            metrics[logged] = (value.item(), 1)
    return metrics


@dataclass
class ObjectiveOutput:
    """An objective's result on one micro-batch: the `loss` to backward (graph attached), `metrics` logged as means
    over the log window ((total, count) by name), and values logged as their minimum or maximum over an optimizer
    step's micro-batches (`minima`, `maxima`)."""

    loss: torch.Tensor
    metrics: Metrics = field(default_factory=dict)
    minima: Dict[str, float] = field(default_factory=dict)
    maxima: Dict[str, float] = field(default_factory=dict)


@dataclass
class ObjectiveConfig:
    """What an objective is built from: the policy loss (`--policy_loss`, its clip range and aggregation), the entropy
    bonus weight, the loss terms the algorithm adds (the trainer's own list: GRPO's KL, PPO's ptx), and the
    objective's own hyperparameters (`--objective_option NAME=VALUE ...`)."""

    policy_loss: PolicyLoss
    entropy_coef: float = 0.0
    loss_terms: List[LossTerm] = field(default_factory=list)
    options: Dict[str, Any] = field(default_factory=dict)


Objective = Callable[[torch.nn.Module, Experience], ObjectiveOutput]
"""`objective(actor, experience micro-batch) -> ObjectiveOutput`. OBJECTIVES holds factories `(ObjectiveConfig) ->
objective`; a factory with `needs_reference = True` gets a frozen reference model's log-probs in the experience
(`ref_log_probs`) even without `--kl_coef`."""


class PolicyGradient:
    """The actor's loss of PPO and GRPO: `policy_loss` (against the experience's log-probs, or this forward's own,
    detached, where it has none, and its advantages, over its loss mask), minus `entropy_coef` times the entropy,
    plus each of `loss_terms`, all aggregated alike."""

    needs_reference = False

    def __init__(self, config: ObjectiveConfig) -> None:
        self.policy_loss, self.entropy_coef, self.loss_terms = config.policy_loss, config.entropy_coef, config.loss_terms

    def __call__(self, actor: torch.nn.Module, experience: Experience) -> ObjectiveOutput:
        mask = experience.loss_mask if experience.loss_mask is not None else experience.action_mask
        logps, logits = action_logps(actor, experience.sequences, experience.attention_mask, experience.prompt_length,
                                     return_logits=True, packed=experience.packed, images=experience.images())
        old_logps = experience.action_log_probs if experience.action_log_probs is not None else logps.detach()
        loss, stats = self.policy_loss(logps, old_logps, experience.advantages, mask, experience.behaviour_log_probs)
        entropy = self.policy_loss.aggregate(token_entropy(logits), mask)
        metrics = {"loss/policy": (loss.item(), 1), **policy_loss_metrics(stats), "policy_entropy": (entropy.item(), 1)}
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * entropy
        for term in self.loss_terms:
            extra, extra_metrics = term(experience, logps, mask, self.policy_loss.aggregate, logits=logits)
            metrics.update(extra_metrics)
            if extra is not None:
                loss = loss + extra
        return ObjectiveOutput(loss, {**metrics, "loss": (loss.item(), 1)},
                               {logged: stats[name].item() for name, logged in POLICY_LOSS_MINIMA.items() if name in stats},
                               {logged: stats[name].item() for name, logged in POLICY_LOSS_MAXIMA.items() if name in stats})


def micro_batches(experience: Experience, rows: int) -> List[Experience]:
    """An update pass's micro-batches of `experience`: consecutive parts of at most `rows` rows (the whole batch when
    `rows` is 0 or covers it)."""
    total = experience.sequences.size(0)
    if rows <= 0 or rows >= total:
        return [experience]
    return [experience.rows(start, min(start + rows, total)) for start in range(0, total, rows)]


class Accumulation:
    """One update pass's micro-batches grouped into optimizer steps of `steps` micro-batches (the last group of a
    pass may be shorter). Each micro-batch's loss is scaled by 1 / its group's size, so a step's gradient is
    the mean over its micro-batches; the group's loss and per-micro-batch records wait for the step."""

    def __init__(self, steps: int = 1) -> None:
        if steps < 1:
            raise ValueError(f"accumulation steps must be >= 1, got {steps}")
        self.steps = steps
        self.begin(1)

    def begin(self, total: int) -> None:
        """Start a pass of `total` micro-batches."""
        self.total, self.index = total, 0
        self._loss, self._records = 0.0, []

    def scale(self) -> float:
        """1 / the size of the group the next micro-batch belongs to."""
        start = self.index - self.index % self.steps
        return 1.0 / min(self.steps, max(self.total - start, 1))

    def add(self, scaled_loss: torch.Tensor, record: Any) -> bool:
        """Count one micro-batch (its scaled loss, detached, and what to record once stepped); whether it
        completes its group."""
        self.index += 1
        self._loss = self._loss + scaled_loss.detach()
        self._records.append(record)
        return self.index % self.steps == 0 or self.index >= self.total

    def take(self) -> Tuple[torch.Tensor, List[Any]]:
        """The completed group's loss (the mean over its micro-batches) and records; the next group starts."""
        loss, records = self._loss, self._records
        self._loss, self._records = 0.0, []
        return loss, records


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[returns - values] / Var[returns] over the masked tokens: 1 is a perfect critic, 0 no better
    than a constant."""
    mask = mask.float()
    return float(1 - masked_var(returns - values, mask) / masked_var(returns, mask).clamp(min=1e-8))


@dataclass
class AppliedStep:
    """An optimizer step that was applied: the records of the micro-batches it covered, and its gradient norm (None
    where the plugin's optimizer reports none)."""

    records: List[Any]
    grad_norm: Optional[float]


class OptimizerStep:
    """One model's optimizer steps: each micro-batch's loss goes backward through `booster`, scaled for its
    accumulation group (`accumulation_steps` micro-batches, the last group of a pass may be smaller); a complete
    group is clipped to `grad_clip`, checked by `guard` (a non-finite loss or gradient norm is skipped within the
    run's budget, else the run stops naming `model`) and applied, with the schedule's step."""

    def __init__(self, booster: Any, optimizer: torch.optim.Optimizer, lr_scheduler: Optional[Any], grad_clip: float,
                 guard: NonFiniteGuard, accumulation_steps: int = 1, model: str = "policy") -> None:
        self.booster, self.optimizer, self.lr_scheduler = booster, optimizer, lr_scheduler
        self.grad_clip, self.guard, self.model = grad_clip, guard, model
        self.accumulation = Accumulation(accumulation_steps)

    def begin(self, micro_batches: int) -> None:
        """An update pass of `micro_batches` starts: accumulation groups them from here."""
        self.accumulation.begin(micro_batches)

    def backward(self, loss: torch.Tensor, record: Any, where: str) -> Optional[AppliedStep]:
        """Backward one micro-batch's `loss` (kept with `record` until its group steps); the step once its group is
        complete and applied, else None. `where` names the position in messages about a skipped step."""
        scale = self.accumulation.scale()
        self.booster.backward(loss * scale, self.optimizer)
        if not self.accumulation.add(loss * scale, record):
            return None
        group_loss, records = self.accumulation.take()
        applied, norm = apply_gradients(self.optimizer, self.lr_scheduler, self.grad_clip, group_loss, self.guard,
                                        where, self.model)
        return AppliedStep(records, norm) if applied else None

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


class CriticUpdate:
    """PPO's critic: trained by the clipped `value_loss` towards the experience's returns through its own optimizer
    `step` (booster, optimizer, scheduler; the actor's accumulation groups), one micro-batch at a time alongside
    the actor. Logged: `loss/value`, `explained_variance`, `values`, `grad_norm/critic`, `time/critic_learning`."""

    def __init__(self, model: torch.nn.Module, step: OptimizerStep, value_loss: Optional[ValueLoss] = None) -> None:
        self.model, self.optimizer_step = model, step
        self.value_loss = value_loss or ValueLoss()

    def model_state(self) -> ModelState:
        """What a checkpoint holds of it."""
        step = self.optimizer_step
        return step.booster, self.model, step.optimizer, step.lr_scheduler

    def begin(self, micro_batches: int) -> None:
        self.optimizer_step.begin(micro_batches)

    def step(self, experience: Experience, where: str) -> List[Metrics]:
        """Backward one micro-batch's value loss; the records of the micro-batches an applied step covered, with its
        gradient norm, and this micro-batch's time."""
        start, mask = time.perf_counter(), experience.action_mask
        values = action_values(self.model, experience.sequences, experience.attention_mask, experience.prompt_length,
                               experience.packed, experience.images())
        loss = self.value_loss(values, experience.values, experience.returns - experience.values, mask)
        record = {"loss/value": (loss.item(), 1),
                  "explained_variance": (explained_variance(values.detach(), experience.returns, mask), 1),
                  "values": (masked_mean(values.detach(), mask.float()).item(), 1)}
        applied = self.optimizer_step.backward(loss, record, where)
        records = [] if applied is None else applied.records
        if applied is not None and applied.grad_norm is not None:
            records.insert(0, {"grad_norm/critic": (applied.grad_norm, 1)})
        return records + [{"time/critic_learning": (time.perf_counter() - start, 1)}]
