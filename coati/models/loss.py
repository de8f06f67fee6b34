"""Every training loss in one place. Each returns per-item losses with `reduction='none'`, else their mean."""
from dataclasses import dataclass, field
from typing import Dict

import torch
import torch.nn.functional as F


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.mean()


class LogSigLoss(torch.nn.Module):
    """Bradley-Terry pairwise loss, -log sigmoid(r_chosen - r_rejected) (InstructGPT, Ouyang et al. 2022)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        return _reduce(-F.logsigmoid(chosen_reward - reject_reward), self.reduction)


class LogExpLoss(torch.nn.Module):
    """log(1 + exp(r_rejected - r_chosen)) (Anthropic HH, Bai et al. 2022); equal to LogSigLoss, via softplus."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        return _reduce(F.softplus(reject_reward - chosen_reward), self.reduction)


@dataclass
class PreferenceLossOutput:
    """Per-item losses and implicit rewards of a preference loss; `extras` are per-item values to log."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    extras: Dict[str, torch.Tensor] = field(default_factory=dict)


class DPOLoss(torch.nn.Module):
    """DPO (Rafailov et al. 2023): -log sigmoid(beta * [(pi_c - ref_c) - (pi_r - ref_r)]) on summed log-probs,
    with cDPO label smoothing eps (Mitchell 2023): -(1-eps) log sigmoid(h) - eps log sigmoid(-h).
    `loss_type="ipo"` (Azar et al. 2023): ([(pi_c - ref_c) - (pi_r - ref_r)] - 1 / (2 beta))^2 on length-normalised log-probs."""

    needs_reference = True

    def __init__(self, beta: float = 0.1, label_smoothing: float = 0.0, loss_type: str = "sigmoid") -> None:
        super().__init__()
        if loss_type not in ("sigmoid", "ipo"):
            raise ValueError(f"unknown DPO loss_type {loss_type!r}; expected 'sigmoid' or 'ipo'")
        self.beta, self.label_smoothing, self.loss_type = beta, label_smoothing, loss_type
        self.length_normalized = loss_type == "ipo"

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor,
                ref_rejected: torch.Tensor) -> PreferenceLossOutput:
        chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
        h = chosen_ratio - rejected_ratio
        if self.loss_type == "ipo":
            losses = (h - 1 / (2 * self.beta)) ** 2
        else:
            losses = _smoothed_logsigmoid_loss(self.beta * h, self.label_smoothing)
        return PreferenceLossOutput(losses, self.beta * chosen_ratio.detach(), self.beta * rejected_ratio.detach())


class SimPOLoss(torch.nn.Module):
    """SimPO (Meng et al. 2024), reference-free: -log sigmoid(beta * (pi_c / |y_c| - pi_r / |y_r|) - gamma),
    on length-normalised log-probs, with the same label smoothing as DPO."""

    needs_reference = False
    length_normalized = True

    def __init__(self, beta: float = 2.0, gamma: float = 0.5, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.beta, self.gamma, self.label_smoothing = beta, gamma, label_smoothing

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor) -> PreferenceLossOutput:
        losses = _smoothed_logsigmoid_loss(self.beta * (chosen - rejected) - self.gamma, self.label_smoothing)
        return PreferenceLossOutput(losses, self.beta * chosen.detach(), self.beta * rejected.detach())


class ORPOLoss(torch.nn.Module):
    """ORPO (Hong et al. 2024), reference-free: -a_c + lam * -log sigmoid(log odds(a_c) - log odds(a_r)),
    where a is the length-normalised log-prob and odds(a) = e^a / (1 - e^a); the first term is the SFT loss."""

    needs_reference = False
    length_normalized = True

    def __init__(self, lam: float = 0.1) -> None:
        super().__init__()
        self.lam = lam

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor) -> PreferenceLossOutput:
        log_odds = (chosen - rejected) - (_log1m_exp(chosen) - _log1m_exp(rejected))
        ratio_loss = -F.logsigmoid(log_odds)
        nll = -chosen
        return PreferenceLossOutput(nll + self.lam * ratio_loss, self.lam * chosen.detach(), self.lam * rejected.detach(),
                                    {"nll_loss": nll.detach(), "log_odds_ratio": log_odds.detach()})


class KTOLoss(torch.nn.Module):
    """KTO (Ethayarajh et al. 2024): with r = pi - ref (summed log-probs) and z0 the batch KL estimate,
    desirable items cost w_D (1 - sigmoid(beta (r - z0))), undesirable ones w_U (1 - sigmoid(beta (z0 - r)))."""

    def __init__(self, beta: float = 0.1, desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> None:
        super().__init__()
        self.beta, self.desirable_weight, self.undesirable_weight = beta, desirable_weight, undesirable_weight

    def forward(self, logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
                kl: torch.Tensor) -> torch.Tensor:
        """Per-item losses; `desirable` is a bool tensor, `kl` the detached, clamped KL estimate z0."""
        ratio = logps - ref_logps
        desirable_loss = self.desirable_weight * (1 - torch.sigmoid(self.beta * (ratio - kl)))
        undesirable_loss = self.undesirable_weight * (1 - torch.sigmoid(self.beta * (kl - ratio)))
        return torch.where(desirable, desirable_loss, undesirable_loss)


def _smoothed_logsigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def _log1m_exp(logp: torch.Tensor) -> torch.Tensor:
    """log(1 - e^logp) for logp < 0, kept finite as logp reaches 0."""
    return torch.log1p(-torch.exp(logp).clamp(max=1 - 1e-6))
