"""Reward-model training on preference pairs with a pairwise loss (LogSigLoss by default)."""
from typing import Any, Callable, Optional

import torch

from coati.dataset.collators import both_sides
from coati.models.loss import LogSigLoss
from coati.models.reward_model import sequence_rewards

from .base import Batch, BatchResult, SLTrainer


class RewardModelTrainer(SLTrainer):
    """Chosen and rejected go through the model in one concatenated forward; the loss sums over pairs
    and is normalised over the whole step. Tracks loss, chosen/rejected reward, margin and accuracy
    (chosen reward above rejected), in training and in evaluation."""

    def __init__(
        self,
        model: torch.nn.Module,
        booster: Any,
        optimizer: torch.optim.Optimizer,
        plugin: Any,
        lr_scheduler: Optional[Any] = None,
        tokenizer: Optional[Any] = None,
        loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
        max_epochs: int = 1,
        start_epoch: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(booster, max_epochs, model, optimizer, plugin, start_epoch, lr_scheduler=lr_scheduler, **kwargs)
        self.tokenizer = tokenizer
        self.loss_fn = loss_fn or LogSigLoss(reduction="none")

    def _compute_batch(self, batch: Batch) -> BatchResult:
        pairs = batch["chosen_input_ids"].size(0)
        rewards = sequence_rewards(self.model, both_sides(batch, "input_ids"), both_sides(batch, "attention_mask"))
        chosen, rejected = rewards[:pairs], rewards[pairs:]
        loss = self.loss_fn(chosen, rejected).sum()
        margin = (chosen - rejected).detach()
        metrics = {
            "loss": (loss.item(), pairs),
            "chosen_rewards": (chosen.sum().item(), pairs),
            "rejected_rewards": (rejected.sum().item(), pairs),
            "margin": (margin.sum().item(), pairs),
            "accuracy": ((margin > 0).sum().item(), pairs),
        }
        return BatchResult(loss, metrics)
