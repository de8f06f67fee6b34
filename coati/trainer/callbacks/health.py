"""Health alarms while an on-policy run trains: the failures users otherwise find hours later in a plot.

`HealthMonitor` watches the reduced metrics of every log (`on_log`, the same on every rank) and raises each alarm
once, as one `warning: alarm <name>: ...` line naming the metric, its value and the threshold, logged beside the
metrics as `alarm/<name>` = 1 and listed in `fired`. With `stop_on` naming it, the run ends after the current
episode with a checkpoint (`stop_training`), and the script exits with `ALARM_EXIT_CODE` and one line.
"""
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from coati.utils.errors import warn_user

from .base import Callback

ALARM_EXIT_CODE = 4
REWARD = "train/reward"


@dataclass(frozen=True)
class AlarmThresholds:
    """When each alarm fires. Fractions are of the metric's first logged value; `patience` train logs (and
    `eval_patience` evaluations) in a row must break a bound before its alarm fires."""

    eval_drop: float = 0.15
    """an eval metric (`eval/reward`, `eval/rewards/<fn>`) fell by more than this fraction of its first value"""
    eval_min_drop: float = 0.05
    """... and by at least this much (about two standard errors of an accuracy on 256 held-out rows: noise, or a
    metric near 0, is not a fall)"""
    eval_patience: int = 2
    """evaluations in a row that must show the fall (a dip that the next evaluation undoes is not one)"""
    entropy_floor: float = 0.1
    """`train/policy_entropy` below this fraction of its first value"""
    length_floor: float = 0.2
    """`train/completions/mean_length_sampled` below this fraction of its first value"""
    length_ceiling: float = 0.9
    """`train/completions/clipped_frac` (completions cut at --max_new_tokens) at or above this ..."""
    length_rise: float = 0.2
    """... having risen by at least this from its first value"""
    zero_std_ceiling: float = 0.95
    """`train/frac_reward_zero_std` (groups with no reward spread, so no learning signal) above this"""
    kl_ceiling: float = 0.5
    """`train/kl_per_completion_token` (nats per completion token, to the reference) above this"""
    ratio_drift: float = 0.2
    """`train/behaviour_ratio` (trainer over engine probabilities of the sampled tokens) further than this from 1"""
    grad_spike: float = 20.0
    """`train/grad_norm` above this multiple of the median of the norms logged before (from the 5th on)"""
    patience: int = 3


Check = Callable[[str, List[float], AlarmThresholds], Optional[Tuple[float, str]]]
"""A train-metric alarm's test on the metric's history (first value first): (value, threshold text) when it is
broken at the latest value, else None."""


def _below_fraction(attribute: str) -> Check:
    def check(metric: str, history: List[float], limits: AlarmThresholds) -> Optional[Tuple[float, str]]:
        floor = getattr(limits, attribute) * history[0]
        return (history[-1], f"< {floor:.4g} ({getattr(limits, attribute):g} of its first value {history[0]:.4g})") \
            if history[0] > 0 and history[-1] < floor else None
    return check


def _clipped_at_limit(metric: str, history: List[float], limits: AlarmThresholds) -> Optional[Tuple[float, str]]:
    value, bound = history[-1], max(limits.length_ceiling, history[0] + limits.length_rise)
    return (value, f">= {bound:.4g} (up from {history[0]:.4g})") if value >= bound else None


def _above(attribute: str) -> Check:
    def check(metric: str, history: List[float], limits: AlarmThresholds) -> Optional[Tuple[float, str]]:
        bound = getattr(limits, attribute)
        return (history[-1], f"> {bound:g}") if history[-1] > bound else None
    return check


def _ratio_drift(metric: str, history: List[float], limits: AlarmThresholds) -> Optional[Tuple[float, str]]:
    value = history[-1]
    return (value, f"outside 1 ± {limits.ratio_drift:g}") if abs(value - 1.0) > limits.ratio_drift else None


def _grad_spike(metric: str, history: List[float], limits: AlarmThresholds) -> Optional[Tuple[float, str]]:
    """A norm `grad_spike` times the median of the norms before it, once 4 nonzero ones are known: a GRPO step whose
    groups all tied has no gradient (norm 0), which says nothing of its scale."""
    before = [norm for norm in history[:-1] if norm > 0]
    if len(before) < 4:
        return None
    bound = limits.grad_spike * statistics.median(before)
    return (history[-1], f"> {bound:.4g} ({limits.grad_spike:g} x the median before)") if history[-1] > bound else None


TRAIN_ALARMS: Dict[str, Tuple[str, Check, bool]] = {
    "entropy_collapse": ("train/policy_entropy", _below_fraction("entropy_floor"), True),
    "length_collapse": ("train/completions/mean_length_sampled", _below_fraction("length_floor"), True),
    "length_at_limit": ("train/completions/clipped_frac", _clipped_at_limit, True),
    "zero_std_groups": ("train/frac_reward_zero_std", _above("zero_std_ceiling"), True),
    "kl_runaway": ("train/kl_per_completion_token", _above("kl_ceiling"), True),
    "engine_ratio_drift": ("train/behaviour_ratio", _ratio_drift, True),
    "grad_spike": ("train/grad_norm", _grad_spike, False),
}
"""name -> (the metric it watches, its test, whether it waits for `patience` logs in a row)."""
WATCHED_TRAIN_METRICS = {metric for metric, _, _ in TRAIN_ALARMS.values()} | {REWARD}
"""The train metrics whose history is kept (and checkpointed): only what the alarms read."""
EVAL_ALARMS = ("eval_drop", "eval_falls_reward_rises")
ALARMS = tuple(TRAIN_ALARMS) + EVAL_ALARMS


def watched_eval_metrics(metrics: Dict[str, float]) -> List[str]:
    """The eval metrics an evaluation is judged by: the total reward and each function's (not their diagnostics)."""
    return [k for k in metrics if k == "eval/reward" or (k.startswith("eval/rewards/") and k.count("/") == 2)]


@dataclass
class HealthMonitor(Callback):
    """Raises the alarms above from the metrics of each log; `stop_on`: the alarms that end the run."""

    limits: AlarmThresholds = field(default_factory=AlarmThresholds)
    stop_on: Sequence[str] = ()
    fired: Dict[str, str] = field(default_factory=dict)
    """alarm name -> its warning, in the order they fired"""
    stopped_by: Optional[str] = None
    _history: Dict[str, List[float]] = field(default_factory=dict)
    _broken: Dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.stop_on) - set(ALARMS) - {"all"})
        if unknown:
            raise ValueError(f"unknown alarm {', '.join(unknown)}; choose from all, {', '.join(ALARMS)}")

    def on_log(self, step: int, metrics: Dict[str, float]) -> None:
        for name in WATCHED_TRAIN_METRICS.intersection(metrics) | set(watched_eval_metrics(metrics)):
            self._history.setdefault(name, []).append(float(metrics[name]))
        raised = self._train_alarms(metrics) + self._eval_alarms(metrics)
        for name, message in raised:
            self._raise(name, message, step, metrics)

    def state_dict(self) -> Dict[str, Any]:
        return {"history": self._history, "broken": self._broken, "fired": self.fired}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._history, self._broken, self.fired = state["history"], state["broken"], state["fired"]

    def _train_alarms(self, metrics: Dict[str, float]) -> List[Tuple[str, str]]:
        raised = []
        for name, (metric, check, patient) in TRAIN_ALARMS.items():
            if metric not in metrics or name in self.fired:
                continue
            broken = check(metric, self._history[metric], self.limits)
            self._broken[name] = self._broken.get(name, 0) + 1 if broken else 0
            if broken and self._broken[name] >= (self.limits.patience if patient else 1):
                raised.append((name, f"{metric} = {broken[0]:.4g} {broken[1]}"))
        return raised

    def _eval_alarms(self, metrics: Dict[str, float]) -> List[Tuple[str, str]]:
        raised = []
        for metric in watched_eval_metrics(metrics):
            history = self._history[metric]
            drop = history[0] - history[-1]
            fell = drop >= self.limits.eval_min_drop
            relative = drop / abs(history[0]) if history[0] else float("inf")
            where = f"{metric} = {history[-1]:.4g}, down {drop:.4g} from its first {history[0]:.4g}"
            reward = self._history.get(REWARD, [])
            if self._persists("eval_falls_reward_rises", metric, fell and _rose(reward)):
                raised.append(("eval_falls_reward_rises", f"{where} while {REWARD} rose from {_first_mean(reward):.4g} "
                                                          f"to {_recent_mean(reward):.4g}"))
            if self._persists("eval_drop", metric, fell and relative > self.limits.eval_drop):
                raised.append(("eval_drop", f"{where} (> {self.limits.eval_drop:g} of it)"))
        return raised

    def _persists(self, alarm: str, metric: str, broken: bool) -> bool:
        """Whether `alarm` on an eval `metric` has now been broken on `eval_patience` evaluations in a row."""
        key = f"{alarm}:{metric}"
        self._broken[key] = self._broken.get(key, 0) + 1 if broken else 0
        return alarm not in self.fired and self._broken[key] >= self.limits.eval_patience

    def _raise(self, name: str, message: str, step: int, metrics: Dict[str, float]) -> None:
        if name in self.fired:
            return
        line = f"alarm {name} at step {step}: {message}"
        if name in self.stop_on or "all" in self.stop_on:
            self.stopped_by = self.stopped_by or name
            self.stop_training = True
            line += "; stopping after this episode (--stop_on_alarm)"
        self.fired[name] = line
        metrics[f"alarm/{name}"] = 1.0
        warn_user(line)


def _rose(history: List[float], window: int = 3) -> bool:
    """Whether a noisy series went up: the mean of its last `window` values above that of its first by more than
    the series' own spread (a flat, noisy reward does not rise; a trend does)."""
    return len(history) >= 2 * window and _recent_mean(history, window) - _first_mean(history, window) > \
        statistics.pstdev(history)


def _first_mean(history: List[float], window: int = 3) -> float:
    return statistics.fmean(history[:window])


def _recent_mean(history: List[float], window: int = 3) -> float:
    return statistics.fmean(history[-window:])
