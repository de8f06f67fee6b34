"""KTO: preference optimisation from single completions labelled desirable or undesirable."""
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from coati.utils.comm import is_distributed
from coati.models.logprobs import sequence_logps
from coati.models.loss import KTOLoss
from coati.utils.errors import warn_user

from .base import Batch, BatchResult
from .dpo import PreferenceTrainer


KTO_WEIGHT_BOUNDS = (1.0, 4 / 3)
"""Where w_D n_D / (w_U n_U) should lie (Ethayarajh et al. 2024, eq. 8)."""


def balance_kto_weights(loss: KTOLoss, desirable: Sequence[bool]) -> Optional[float]:
    """ColossalChat's `--auto_weight`: when w_D n_D / (w_U n_U) over the training rows lies outside
    KTO_WEIGHT_BOUNDS, divide `loss.desirable_weight` by it (the ratio becomes 1) and say so. Returns the new
    weight, or None when it was left alone."""
    n_desirable = sum(bool(d) for d in desirable)
    n_undesirable = len(desirable) - n_desirable
    if not n_desirable or not n_undesirable:
        return None
    ratio = loss.desirable_weight * n_desirable / (loss.undesirable_weight * n_undesirable)
    if KTO_WEIGHT_BOUNDS[0] <= ratio <= KTO_WEIGHT_BOUNDS[1]:
        return None
    loss.desirable_weight /= ratio
    warn_user(f"--auto_weight: {n_desirable} desirable and {n_undesirable} undesirable rows gave a weighted ratio of "
              f"{ratio:.3g}, outside [1, 4/3]; desirable_weight is now {loss.desirable_weight:.4g}")
    return loss.desirable_weight


class KTOTrainer(PreferenceTrainer):
    """Scores each completion under the policy and the frozen `ref_model`; the reference point z0 is
    the policy-vs-reference KL on mismatched prompt/completion pairs of the batch (no gradient),
    averaged over all ranks and clamped at 0. Logs loss, kl, rewards/chosen and rewards/rejected
    (beta * log-ratio over desirable / undesirable items), logps/chosen and logps/rejected."""

    default_loss = KTOLoss
    no_grad_forward_first = "KTO's KL estimate (a forward without gradients)"

    @torch.no_grad()
    def _kl_estimate(self, batch: Batch) -> torch.Tensor:
        """Mean over the mismatched pairs of every rank of log pi - log ref, clamped at 0."""
        policy, _ = sequence_logps(self.model, batch, "kl_")
        reference, _ = sequence_logps(self._require_reference(), batch, "kl_")
        total = torch.stack([(policy - reference).sum(), torch.tensor(float(policy.numel()), device=policy.device)])
        if is_distributed():
            dist.all_reduce(total)
        return (total[0] / total[1]).clamp(min=0)

    def _compute_batch(self, batch: Batch) -> BatchResult:
        logps, _ = sequence_logps(self.model, batch)
        with torch.no_grad():
            ref_logps, _ = sequence_logps(self._require_reference(), batch)
        kl = self._kl_estimate(batch)
        desirable = batch["desirable"]
        loss = self.loss_fn(logps, ref_logps, desirable, kl).sum()
        rewards = self.loss_fn.beta * (logps - ref_logps).detach()
        chosen, rejected = int(desirable.sum()), int((~desirable).sum())
        metrics = {
            "loss": (loss.item(), desirable.numel()),
            "kl": (kl.item(), 1),
            "rewards/chosen": (rewards[desirable].sum().item(), chosen),
            "rewards/rejected": (rewards[~desirable].sum().item(), rejected),
            "logps/chosen": (logps.detach()[desirable].sum().item(), chosen),
            "logps/rejected": (logps.detach()[~desirable].sum().item(), rejected),
        }
        return BatchResult(loss, metrics)
