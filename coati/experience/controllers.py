"""Coefficients that adapt as a run goes: the weight of the KL to the reference (adaptive KL) and MaxEnt's
temperature. Each looks at an episode's experience (every rank's), moves its value, reports its state as
metrics, and keeps that state in checkpoints, so a resumed run continues with the value it stopped at."""
import math
from dataclasses import dataclass
from typing import Any, Dict, Sequence

from coati.config import KLSettings
from coati.utils.comm import all_reduce_sums

from .advantages import maxent_weights

KL_DEFAULTS = KLSettings()
"""The KL settings' defaults, which a controller built without them takes (declared once, in `coati.config`)."""


@dataclass
class KLController:
    """The weight beta of the KL to the reference (GRPO's loss term, PPO's reward penalty).

    Fixed when `target` is 0. Otherwise, after each episode (Ziegler et al. 2019, as in InstructGPT):
    e = clip(KL / target - 1, -max_step, max_step), beta <- beta * (1 + e * n / horizon), where KL is the mean
    over the episode's n completions (every rank's) of their summed per-token KL."""

    value: float
    target: float = KL_DEFAULTS.kl_target
    horizon: int = KL_DEFAULTS.kl_horizon
    max_step: float = KL_DEFAULTS.kl_max_step
    error: float = 0.0

    @classmethod
    def from_settings(cls, settings: KLSettings) -> "KLController":
        """The KL coefficient its settings section describes: `kl_coef`, adapted towards `kl_target` when one is
        given."""
        return cls(settings.kl_coef, settings.kl_target, settings.kl_horizon, settings.kl_max_step)

    def __post_init__(self) -> None:
        if self.target < 0 or self.horizon < 1 or self.max_step <= 0:
            raise ValueError("the KL target must be >= 0, the horizon >= 1 and the step > 0")
        if self.target > 0 and self.value <= 0:
            raise ValueError("an adaptive KL coefficient needs a starting value above 0")

    def update(self, kl: float, completions: int) -> None:
        """Move beta towards the value that keeps the KL at `target`, after `completions` measured at mean `kl`."""
        if self.target <= 0:
            return
        self.error = min(max(kl / self.target - 1.0, -self.max_step), self.max_step)
        self.value *= 1.0 + self.error * completions / self.horizon

    def observe(self, experiences: Sequence[Any], group_size: int) -> Dict[str, float]:
        """The controller's state while the episode was learned; then the update from its KL."""
        metrics = self.metrics()
        if self.target > 0:
            local = [(e.kl.sum().item(), e.kl.size(0)) for e in experiences if e.kl is not None]
            total, count = all_reduce_sums([sum(t for t, _ in local), sum(c for _, c in local)])
            if count:
                self.update(total / count, int(count))
        return metrics

    def metrics(self) -> Dict[str, float]:
        metrics = {"kl_ctl/value": self.value}
        if self.target > 0:
            metrics.update({"kl_ctl/target": self.target, "kl_ctl/error": self.error})
        return metrics

    def state(self) -> Dict[str, float]:
        return {"value": self.value, "error": self.error}

    def restore(self, state: Dict[str, float]) -> None:
        self.value, self.error = state["value"], state["error"]


@dataclass
class TemperatureController:
    """MaxEnt's temperature tau (the `maxent` advantage estimator: weights softmax(r / tau) within a group).

    Fixed when `target_entropy` is 0. Otherwise, after each episode, log tau += lr * (target_entropy - H), where H is
    the mean over every rank's groups of the weights' entropy divided by log(group size) (1: uniform weights,
    0: one completion takes all): weights more peaked than the target raise tau, flatter ones lower it."""

    value: float = 1.0
    target_entropy: float = 0.0
    lr: float = 0.1

    def __post_init__(self) -> None:
        if self.value <= 0 or not 0 <= self.target_entropy <= 1 or self.lr <= 0:
            raise ValueError("tau must be > 0, the target entropy in [0, 1] and the rate > 0")

    def observe(self, experiences: Sequence[Any], group_size: int) -> Dict[str, float]:
        """tau, the weights' normalised entropy, and the weighted and plain mean rewards (the objective MaxEnt
        optimises against the one plain GRPO does) over the episode; then tau's update."""
        sums = [0.0, 0.0, 0.0, 0.0]
        for experience in experiences:
            groups = experience.rewards.view(-1, group_size).double()
            weights = maxent_weights(experience.rewards, group_size, self.value).view(-1, group_size).double()
            entropy = -(weights * weights.clamp(min=1e-30).log()).sum(-1) / math.log(group_size)
            parts = [entropy.sum(), (weights * groups).sum(), groups.mean(-1).sum(), float(groups.size(0))]
            sums = [s + float(p) for s, p in zip(sums, parts)]
        entropy, weighted, plain, groups = all_reduce_sums(sums)
        if not groups:
            return {"maxent/tau": self.value}
        metrics = {"maxent/tau": self.value, "maxent/weight_entropy": entropy / groups,
                   "maxent/weighted_reward": weighted / groups, "maxent/plain_reward": plain / groups}
        if self.target_entropy > 0:
            self.value *= math.exp(self.lr * (self.target_entropy - entropy / groups))
        return metrics

    def state(self) -> Dict[str, float]:
        return {"value": self.value}

    def restore(self, state: Dict[str, float]) -> None:
        self.value = state["value"]

