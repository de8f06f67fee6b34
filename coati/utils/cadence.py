"""When periodic work is due: logging (`LogCadence`, the published GRPO module's logging flags), and saving
(`Saver`) or evaluating (`Evaluator`) every so many epochs, steps or seconds (`Frequency`). Light: the
argument parsers import it."""
import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from coati.utils.ranges import at_least
from coati.utils.settings import setting

T = TypeVar("T")

LOGGING_STRATEGIES = ("steps", "no")


@dataclass(frozen=True)
class LogCadence:
    """When training metrics are logged, as the published GRPO logging module has it: with `strategy` "steps",
    every `steps` steps, and after the first step too with `first_step`; with "no", never. A logged value is
    the mean over the steps since the last log."""

    strategy: str = setting("steps", flag="--logging_strategy", choices=LOGGING_STRATEGIES,
                            help="'steps': log every --logging_steps; 'no': log no training metrics (evaluation still "
                                 "logs)")
    steps: int = setting(1, flag="--log_interval", aliases=("--logging_steps",), parse=at_least(1),
                         help="log the mean of the metrics every N episodes")
    first_step: bool = setting(False, flag="--logging_first_step", help="also log after the first step")

    def __post_init__(self) -> None:
        if self.strategy not in LOGGING_STRATEGIES:
            raise ValueError(f"unknown logging strategy {self.strategy!r}; expected one of {', '.join(LOGGING_STRATEGIES)}")

    @property
    def enabled(self) -> bool:
        return self.strategy != "no"

    def due(self, step: int) -> bool:
        """Whether the window ends at `step` (1-based)."""
        return self.enabled and (step % self.steps == 0 or (self.first_step and step == 1))



class Frequency:
    """Due every `freq_steps` steps (at steps that are multiples of it, so a resumed run keeps the same ones),
    when an epoch ends whose count is a multiple of `freq_epochs`, or once `freq_secs` seconds have passed
    since it was last due; whichever comes first. None or 0 turns a clock off. With `freq_secs`, rank 0's
    clock decides for every rank (so all save or evaluate together): `due` is then a collective."""

    def __init__(self, freq_epochs: Optional[int] = None, freq_steps: Optional[int] = None,
                 freq_secs: Optional[float] = None) -> None:
        for name, value in (("freq_epochs", freq_epochs), ("freq_steps", freq_steps), ("freq_secs", freq_secs)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.freq_epochs, self.freq_steps, self.freq_secs = freq_epochs, freq_steps, freq_secs
        self._since = time.monotonic()

    def due(self, step: int, epoch: int = 0, epoch_ended: bool = False) -> bool:
        """Whether the work is due after step `step` (1-based); `epoch` counts the epochs done, and
        `epoch_ended` says whether this step finished one."""
        by_steps = bool(self.freq_steps) and step % self.freq_steps == 0
        by_epochs = bool(self.freq_epochs) and epoch_ended and epoch % self.freq_epochs == 0
        by_secs = bool(self.freq_secs) and _agreed(time.monotonic() - self._since >= self.freq_secs)
        if by_steps or by_epochs or by_secs:
            self._since = time.monotonic()
            return True
        return False


def _agreed(decision: bool) -> bool:
    """Rank 0's `decision`, on every rank (as is, without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return decision
    box = [decision]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


class _Periodic:
    """Runs a function when its `Frequency` is due, or at the last step."""

    def __init__(self, freq_epochs: Optional[int] = None, freq_steps: Optional[int] = None,
                 freq_secs: Optional[float] = None) -> None:
        self.frequency = Frequency(freq_epochs, freq_steps, freq_secs)

    def _run(self, fn: Callable[[], T], step: int, epoch: int, epoch_ended: bool, last: bool) -> Optional[T]:
        due = self.frequency.due(step, epoch, epoch_ended)
        return fn() if due or last else None


class Saver(_Periodic):
    """When checkpoints are written (the asynchronous RLVR guide's `Saver`): every `freq_steps` steps,
    `freq_epochs` epochs or `freq_secs` seconds, and after the last step."""

    def save(self, save_fn: Callable[[], T], epoch: int, step: int, *, epoch_ended: bool = False,
             last: bool = False) -> Optional[T]:
        """`save_fn()`'s result when a checkpoint is due after `step`, else None."""
        return self._run(save_fn, step, epoch, epoch_ended, last)


class Evaluator(_Periodic):
    """When held-out evaluation runs (the asynchronous RLVR guide's `Evaluator`): every `freq_steps` steps,
    `freq_epochs` epochs or `freq_secs` seconds, and after the last step."""

    def evaluate(self, evaluate_fn: Callable[[], T], epoch: int, step: int, *, epoch_ended: bool = False,
                 last: bool = False) -> Optional[T]:
        """`evaluate_fn()`'s result when an evaluation is due after `step`, else None."""
        return self._run(evaluate_fn, step, epoch, epoch_ended, last)
