"""Direct preference optimisation from pairs: DPO, IPO, SimPO and ORPO, as the loss each is."""
import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from coati.dataset.collators import batch_rows
from coati.models.logprobs import pair_sequence_logps
from coati.models.loss import DPOLoss, ORPOLoss, PreferenceLossOutput
from coati.models.reference import REF_COLUMNS, pair_logps
from coati.utils.errors import CoatiUsageError

from .base import Batch, BatchResult, SLTrainer


class PreferenceTrainer(SLTrainer):
    """What the DPO family shares: a loss module (`default_loss()` unless given) and an optional frozen
    reference policy `ref_model`; subclasses say how a batch is scored."""

    default_loss: Callable[[], torch.nn.Module] = DPOLoss

    def __init__(
        self,
        model: torch.nn.Module,
        booster: Any,
        optimizer: torch.optim.Optimizer,
        plugin: Any,
        lr_scheduler: Optional[Any] = None,
        ref_model: Optional[torch.nn.Module] = None,
        loss_fn: Optional[torch.nn.Module] = None,
        max_epochs: int = 1,
        start_epoch: int = 0,
        rpo_alpha: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(booster, max_epochs, model, optimizer, plugin, start_epoch, lr_scheduler=lr_scheduler, **kwargs)
        self.ref_model = ref_model
        self.loss_fn = loss_fn or self.default_loss()
        self.rpo_alpha = rpo_alpha

    def _require_reference(self) -> torch.nn.Module:
        if self.ref_model is None:
            raise CoatiUsageError(f"{type(self.loss_fn).__name__} needs a reference model or precomputed reference log-probs")
        return self.ref_model


class DPOTrainer(PreferenceTrainer):
    """Chosen and rejected go through the policy in one concatenated forward; `loss_fn` (a `DPOLoss` by
    default; `SimPOLoss` and `ORPOLoss` need no reference) turns their log-probs into per-pair losses.
    Reference log-probs come from the batch when precomputed (`chosen_ref_logps`), else from the frozen
    `ref_model`; `rpo_alpha` adds RPO's NLL on chosen (`with_chosen_nll`). Logs TRL's names: loss, rewards/chosen,
    rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen, logps/rejected, and any extras of the loss."""

    def _reference(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        if all(c in batch for c in REF_COLUMNS):
            return batch[REF_COLUMNS[0]], batch[REF_COLUMNS[1]]
        scores = pair_logps(self._require_reference(), batch)
        return scores[REF_COLUMNS[0]], scores[REF_COLUMNS[1]]

    def _compute_batch(self, batch: Batch) -> BatchResult:
        pairs = batch_rows(batch)
        logps, tokens = pair_sequence_logps(self.model, batch)
        scale = tokens.clamp(min=1) if self.loss_fn.length_normalized else torch.ones_like(logps)
        policy = logps / scale
        if self.loss_fn.needs_reference:
            ref_chosen, ref_rejected = self._reference(batch)
            out = self.loss_fn(policy[:pairs], policy[pairs:], ref_chosen / scale[:pairs], ref_rejected / scale[pairs:])
        else:
            out = self.loss_fn(policy[:pairs], policy[pairs:])
        if self.rpo_alpha:
            out = with_chosen_nll(out, logps[:pairs] / tokens[:pairs].clamp(min=1), self.rpo_alpha)
        loss = out.losses.sum()
        return BatchResult(loss, pair_metrics(loss, out, policy[:pairs].detach(), policy[pairs:].detach()))


def with_chosen_nll(out: PreferenceLossOutput, chosen_token_logps: torch.Tensor, alpha: float) -> PreferenceLossOutput:
    """RPO (Pang et al. 2024): each pair's loss plus `alpha` times its chosen response's per-token NLL (logged as
    nll_loss)."""
    nll = -chosen_token_logps
    return dataclasses.replace(out, losses=out.losses + alpha * nll, extras={**out.extras, "nll_loss": nll.detach()})


def pair_metrics(loss: torch.Tensor, out: PreferenceLossOutput, chosen_logps: torch.Tensor,
                 rejected_logps: torch.Tensor) -> Dict[str, Tuple[float, int]]:
    """(total, count) per metric for the stats tracker, under TRL's names."""
    pairs = chosen_logps.numel()
    margins = out.chosen_rewards - out.rejected_rewards
    totals = {
        "loss": loss.item(),
        "rewards/chosen": out.chosen_rewards.sum().item(),
        "rewards/rejected": out.rejected_rewards.sum().item(),
        "rewards/margins": margins.sum().item(),
        "rewards/accuracies": (margins > 0).sum().item(),
        "logps/chosen": chosen_logps.sum().item(),
        "logps/rejected": rejected_logps.sum().item(),
        **{name: values.sum().item() for name, values in out.extras.items()},
    }
    return {name: (total, pairs) for name, total in totals.items()}


class ORPOTrainer(DPOTrainer):
    """ORPO: the SFT loss on chosen plus an odds-ratio term, with no reference model (`ORPOLoss`); logs
    nll_loss and log_odds_ratio besides the DPO metrics."""

    default_loss = ORPOLoss
