"""Every training loss in one place. Each returns per-item losses with `reduction='none'`, else their mean."""
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
