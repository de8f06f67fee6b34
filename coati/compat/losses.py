"""ColossalChat's preference losses under its names and call signatures (`DpoLoss`, `OddsRatioLoss`), importable as
`coati.models.DpoLoss` and `coati.models.loss.DpoLoss`: coati's `DPOLoss` and `ORPOLoss` on per-token log-probs."""
from typing import Optional

import torch

from coati.models.loss import DPOLoss, ORPOLoss, PreferenceLossOutput, masked_mean


def sequence_logps(logps: torch.Tensor, mask: Optional[torch.Tensor], mean: bool = False) -> torch.Tensor:
    """Per-sequence log-probs: `logps` as given without a mask, else their masked sum (or mean) over the tokens."""
    if mask is None:
        return logps
    return masked_mean(logps, mask, dim=-1) if mean else (logps * mask.to(logps.dtype)).sum(-1)


class DpoLoss(DPOLoss):
    """ColossalChat's DPO loss, `DpoLoss(beta=0.1, gamma=0.0)`: `DPOLoss` with SimPO's margin `gamma`. Its
    `forward` also takes ColossalChat's arguments: per-token log-probs (batch, T) with their masks, summed
    here, and reference log-probs of None for a reference-free loss."""

    def __init__(self, beta: float = 0.1, gamma: float = 0.0) -> None:
        super().__init__(beta=beta, gamma=gamma)

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: Optional[torch.Tensor] = None,
                ref_rejected: Optional[torch.Tensor] = None, chosen_mask: Optional[torch.Tensor] = None,
                reject_mask: Optional[torch.Tensor] = None) -> PreferenceLossOutput:
        chosen, rejected = sequence_logps(chosen, chosen_mask), sequence_logps(rejected, reject_mask)
        if ref_chosen is not None:
            ref_chosen = sequence_logps(ref_chosen, chosen_mask)
        if ref_rejected is not None:
            ref_rejected = sequence_logps(ref_rejected, reject_mask)
        return super().forward(chosen, rejected, ref_chosen, ref_rejected)


class OddsRatioLoss(ORPOLoss):
    """ColossalChat's ORPO loss, `OddsRatioLoss()`: `ORPOLoss` (lam 0.1). Its `forward` also takes ColossalChat's
    arguments: per-token log-probs (batch, T) with their loss masks, length-normalised here."""

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor, chosen_loss_mask: Optional[torch.Tensor] = None,
                reject_loss_mask: Optional[torch.Tensor] = None) -> PreferenceLossOutput:
        return super().forward(sequence_logps(chosen, chosen_loss_mask, mean=True),
                               sequence_logps(rejected, reject_loss_mask, mean=True))
