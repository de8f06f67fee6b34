"""Non-finite losses and gradients stop a run (or, within a budget, skip the step): a NaN is never trained on,
checkpointed or exported."""
import math
from typing import Optional

import torch
import torch.distributed as dist

from coati.utils.comm import is_distributed
from coati.utils.errors import NonFiniteError, warn_user


def all_ranks_finite(value: torch.Tensor) -> bool:
    """True when `value` is finite on every rank (one small all-reduce), so all ranks take the same branch."""
    bad = torch.tensor([0.0 if bool(torch.isfinite(value.detach()).all()) else 1.0], device=value.device)
    if is_distributed():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad.item() == 0.0


class NonFiniteGuard:
    """Decides, per optimizer step, whether it may be applied: a non-finite loss (on any rank) or gradient
    norm is skipped while fewer than `max_skips` steps have been skipped, and raises `NonFiniteError`
    otherwise. `skipped` counts the steps skipped so far (checkpoints keep it)."""

    def __init__(self, max_skips: int = 0) -> None:
        if max_skips < 0:
            raise ValueError("max_skips must be >= 0")
        self.max_skips, self.skipped = max_skips, 0

    def problem(self, loss: torch.Tensor, grad_norm: Optional[float], model: str = "") -> Optional[str]:
        """What is not finite in this step (`model`'s 'loss' or 'gradient norm'), or None."""
        prefix = f"{model} " if model else ""
        if not all_ranks_finite(loss):
            return f"{prefix}loss"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return f"{prefix}gradient norm"
        return None

    def skip(self, where: str, what: str) -> None:
        """Count one skipped step at `where` ('step 12', 'episode 3'), or raise when the budget is spent."""
        if self.skipped >= self.max_skips:
            budget = (f"after skipping {self.skipped} such steps (--skip_nonfinite {self.max_skips})"
                      if self.max_skips else "(--skip_nonfinite N skips up to N such steps)")
            raise NonFiniteError(f"{where}: the {what} is NaN or infinite; the run stops {budget} and this step "
                                 "was neither applied nor saved. Lower --lr, check the data, or resume from the last "
                                 "checkpoint")
        self.skipped += 1
        warn_user(f"{where}: the {what} is NaN or infinite; step skipped ({self.skipped} of --skip_nonfinite "
                  f"{self.max_skips})")
