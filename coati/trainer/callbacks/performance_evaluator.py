"""A callback that times each phase of a run and reports samples/s and tokens/s."""
import time
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from coati.dataset.collators import batch_rows, packed_tokens
from coati.utils.comm import is_rank_0, world_size

from .base import Callback


def count_samples_and_tokens(batch: Any) -> Tuple[int, int]:
    """Samples and non-pad tokens in an `Experience`, a dict batch, or a list of dict batches.

    Every `*attention_mask` tensor counts towards tokens (a preference batch has two); the first
    one's rows are the samples. A packed batch counts the tokens of its rows (`packed_tokens`) and its dataset rows.
    """
    if isinstance(batch, (list, tuple)):
        counts = [count_samples_and_tokens(item) for item in batch]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)
    fields = batch if isinstance(batch, dict) else vars(batch)
    if any(k.endswith("seq_lens") for k in fields):
        return batch_rows(fields), packed_tokens(fields)
    masks = [v for k, v in fields.items() if k.endswith("attention_mask") and isinstance(v, torch.Tensor)]
    if not masks:
        return 0, 0
    return int(masks[0].size(0)), int(sum(int(m.sum()) for m in masks))


class _PhaseTimer:
    """Wall time, samples and tokens of one phase, over the calls after the first `ignore` ones."""

    def __init__(self, ignore: int) -> None:
        self.ignore = ignore
        self.calls = 0
        self.seconds = 0.0
        self.samples = 0
        self.tokens = 0
        self._start: Optional[float] = None

    def start(self) -> None:
        _synchronize()
        self._start = time.perf_counter()

    def end(self, batch: Any) -> None:
        if self._start is None:
            return
        _synchronize()
        self.calls += 1
        if self.calls > self.ignore:
            samples, tokens = count_samples_and_tokens(batch)
            self.seconds += time.perf_counter() - self._start
            self.samples += samples
            self.tokens += tokens
        self._start = None

    def report(self, num_ranks: int) -> Dict[str, float]:
        rate = (lambda n: n * num_ranks / self.seconds) if self.seconds > 0 else (lambda n: 0.0)
        return {"seconds": self.seconds, "samples_per_s": rate(self.samples), "tokens_per_s": rate(self.tokens)}


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class PerformanceEvaluator(Callback):
    """Times experience making and learning, and reports throughput at the end of `fit`.

    Rates are this rank's counts times the world size over this rank's time (no collective is run,
    so a failing peer cannot make the report hang). `ignore_steps` leaves out warm-up calls. It is ColossalChat's
    class and keeps its hooks, `on_learn_batch_start/end`, which coati fires after each micro-batch (on-policy) and
    optimizer step (supervised) and which ColossalChat's own loops call.
    """

    def __init__(self, ignore_steps: int = 0, print_fn: Optional[Callable[[str], None]] = None) -> None:
        self.make_experience = _PhaseTimer(ignore_steps)
        self.learn = _PhaseTimer(ignore_steps)
        self.print_fn = print_fn
        self._fit_start: Optional[float] = None
        self.fit_seconds = 0.0

    def on_fit_start(self) -> None:
        self._fit_start = time.perf_counter()

    def on_make_experience_start(self) -> None:
        self.make_experience.start()

    def on_make_experience_end(self, experience: Any) -> None:
        self.make_experience.end(experience)

    def on_learn_batch_start(self) -> None:
        self.learn.start()

    def on_learn_batch_end(self, experience: Any) -> None:
        self.learn.end(experience)

    def on_fit_end(self) -> None:
        if self._fit_start is not None:
            self.fit_seconds = time.perf_counter() - self._fit_start
        if self.print_fn is not None and is_rank_0():
            self.print_fn(self.format_summary())

    def summary(self) -> Dict[str, float]:
        """Flat `phase/metric` numbers: seconds, samples_per_s and tokens_per_s for each phase timed after its
        warm-up (a one-step run has nothing to report but its seconds)."""
        phases = {"make_experience": self.make_experience, "learn": self.learn}
        out = {"fit/seconds": self.fit_seconds}
        for name, timer in phases.items():
            if timer.calls > timer.ignore:
                out.update({f"{name}/{k}": v for k, v in timer.report(world_size()).items()})
        return out

    def format_summary(self) -> str:
        return "performance: " + ", ".join(f"{k}={v:.4g}" for k, v in self.summary().items())

