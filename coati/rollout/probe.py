"""The sync probe: after every publish, an engine with weights of its own scores a fixed batch of token sequences, and
the scores are compared with the trainer's own log-probs of the same tokens, before any rollout of that version is
generated on it.

Two failures stop the run with one line naming the version: the engine's log-probs differ from the trainer's by more
than `tolerance` (mean absolute difference over the probe's tokens: it serves other weights), or they are exactly
those of the previous version while the trainer's moved (the publish did nothing). The tolerance allows for the
numeric difference between two engines on the same weights: 1.3e-7 between vLLM and the trainer in fp32 on this CPU;
more in bf16 (not measured here, hence the wide default).
"""
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from coati.utils.errors import CoatiUsageError

DEFAULT_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3, torch.bfloat16: 0.05, torch.float16: 0.05}
"""Mean absolute log-prob difference allowed by the trainer's dtype (`--engine_probe_tolerance` 0)."""


class EngineSyncError(CoatiUsageError):
    """The engine does not serve the weights the trainer published."""


@torch.no_grad()
def sequence_token_logps(model: torch.nn.Module, sequences: Sequence[Sequence[int]]) -> List[List[float]]:
    """`model`'s log-prob of each token of each sequence after its first, one sequence at a time (no padding)."""
    device = next(model.parameters()).device
    scores = []
    for sequence in sequences:
        ids = torch.tensor([list(sequence)], device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
        scores.append(torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0].tolist())
    return scores


@dataclass
class ProbeCheck:
    """One publish's probe: the `sequences`, the trainer's log-probs of them under `version`'s weights (`expected`)
    and under the previous version's (`previous`, None at the first publish), and the seconds the trainer took to
    compute `expected` (counted in the probe's time, not the sync's)."""

    sequences: List[List[int]]
    expected: List[List[float]]
    previous: Optional[List[List[float]]]
    version: int
    tolerance: float
    seconds: float = 0.0

    def verify(self, served: List[List[float]], served_before: Optional[List[List[float]]]) -> float:
        """The mean absolute difference of the engine's log-probs (`served`; `served_before` at the previous version)
        from the trainer's; raises `EngineSyncError` where the engine does not serve this version's weights."""
        difference = mean_abs_difference(served, self.expected)
        if difference > self.tolerance:
            raise EngineSyncError(f"the engine does not serve weights version {self.version}: its log-probs of the "
                                  f"sync probe differ from the trainer's by {difference:.3g} on average "
                                  f"(--engine_probe_tolerance {self.tolerance:g})")
        moved = self.previous is not None and self.previous != self.expected
        if moved and served_before is not None and served == served_before:
            raise EngineSyncError(f"the engine did not load weights version {self.version}: its log-probs of the sync "
                                  "probe are those of the previous version, while the trainer's changed")
        return difference


def mean_abs_difference(a: List[List[float]], b: List[List[float]]) -> float:
    flat_a, flat_b = torch.tensor(sum(a, [])), torch.tensor(sum(b, []))
    return float((flat_a - flat_b).abs().mean()) if flat_a.numel() else 0.0


class SyncProbe:
    """The probe of a run: fixed `sequences` (a few prompts of its dataset) and a `tolerance` (0: by the trainer's
    dtype, `DEFAULT_TOLERANCE`). `check(model, version)` makes the `ProbeCheck` of a publish."""

    def __init__(self, sequences: Sequence[Sequence[int]], tolerance: float = 0.0) -> None:
        self.sequences = [list(s) for s in sequences]
        self.tolerance = tolerance
        self._last: Optional[List[List[float]]] = None

    def check(self, model: torch.nn.Module, version: int) -> ProbeCheck:
        start = time.perf_counter()
        expected = sequence_token_logps(model, self.sequences)
        tolerance = self.tolerance or DEFAULT_TOLERANCE.get(next(model.parameters()).dtype, 0.05)
        check = ProbeCheck(self.sequences, expected, self._last, version, tolerance, time.perf_counter() - start)
        self._last = expected
        return check
