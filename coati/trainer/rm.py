"""Reward-model training on preference pairs with a pairwise loss (LogSigLoss by default)."""
from typing import Any, Callable, Optional

import torch

from coati.dataset.collators import batch_rows
from coati.models.loss import LogSigLoss
from coati.models.reward_model import pair_rewards
from coati.utils.errors import CoatiUsageError

from .base import Batch, BatchResult, SLTrainer

PairLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class RewardModelTrainer(SLTrainer):
    """Chosen and rejected go through the model in one concatenated forward; the loss sums over pairs
    and is normalised over the whole step. Tracks loss, chosen/rejected reward, margin and accuracy
    (chosen reward above rejected), in training and in evaluation.

    The signature is ColossalChat's: `loss_fn=None` is `LogSigLoss(beta=beta)`. A `loss_fn` may return one
    loss per pair, or reduce them to their mean or sum: the reduction is measured once (`measure_reduction`)
    and undone, so gradients and logged losses are per pair either way; any other reduction is refused by
    name. A batch with TRL's `margin` column trains on -log sigmoid(r_c - r_r - margin) (the loss of chosen - margin);
    `center_rewards_coefficient` adds TRL's (Eisenstein et al. 2023) coef * (r_c + r_r)^2 per pair, which keeps
    rewards centred on zero. Keyword arguments beyond these go to `SLTrainer`
    (`log_interval`, `output_dir`, `grad_clip`, `max_steps`, `callbacks`, ...)."""

    def __init__(
        self,
        model: torch.nn.Module,
        booster: Any,
        optimizer: torch.optim.Optimizer,
        plugin: Any,
        lr_scheduler: Optional[Any] = None,
        tokenizer: Optional[Any] = None,
        loss_fn: Optional[PairLoss] = None,
        max_epochs: int = 1,
        beta: float = 0.1,
        accumulation_steps: int = 1,
        start_epoch: int = 0,
        save_interval: int = 0,
        save_dir: Optional[str] = None,
        coordinator: Optional[Any] = None,
        center_rewards_coefficient: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(booster, max_epochs, model, optimizer, plugin, start_epoch, lr_scheduler=lr_scheduler,
                         accumulation_steps=accumulation_steps, save_interval=save_interval, save_dir=save_dir,
                         coordinator=coordinator, **kwargs)
        self.tokenizer, self.beta, self.center_rewards_coefficient = tokenizer, beta, center_rewards_coefficient
        self.loss_fn = loss_fn or LogSigLoss(beta=beta, reduction="none")
        self._reduction: Optional[str] = None

    def fit(self, train_preference_dataloader: Any, eval_preference_dataloader: Optional[Any] = None,
            log_dir: Optional[str] = None, use_wandb: bool = False, metrics_logger: Optional[Any] = None) -> None:
        """Train on `train_preference_dataloader`, evaluating on `eval_preference_dataloader` each epoch."""
        super().fit(train_preference_dataloader, eval_preference_dataloader, log_dir, use_wandb, metrics_logger)

    def _compute_batch(self, batch: Batch) -> BatchResult:
        pairs = batch_rows(batch)
        rewards = pair_rewards(self.model, batch)
        chosen, rejected = rewards[:pairs], rewards[pairs:]
        margin = batch.get("margin")       # TRL's: the pair's loss is that of chosen - margin against rejected
        loss = self._summed_loss(chosen if margin is None else chosen - margin.to(chosen), rejected)
        if self.center_rewards_coefficient:
            loss = loss + self.center_rewards_coefficient * ((chosen + rejected) ** 2).sum()
        margin = (chosen - rejected).detach()
        metrics = {
            "loss": (loss.item(), pairs),
            "chosen_rewards": (chosen.sum().item(), pairs),
            "rejected_rewards": (rejected.sum().item(), pairs),
            "margin": (margin.sum().item(), pairs),
            "accuracy": ((margin > 0).sum().item(), pairs),
        }
        return BatchResult(loss, metrics)

    def _summed_loss(self, chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
        """The sum over pairs of `loss_fn`'s per-pair losses, whatever reduction it applies."""
        value, pairs = self.loss_fn(chosen, rejected), chosen.numel()
        if value.dim() == 1 and value.numel() == pairs:
            return value.sum()
        if value.dim() != 0:
            raise CoatiUsageError(f"loss_fn {_name(self.loss_fn)} returned a tensor of shape {tuple(value.shape)} for "
                                  f"{pairs} pairs; return one loss per pair, or their mean or sum")
        if self._reduction is None:
            self._reduction = measure_reduction(self.loss_fn, chosen, rejected, value)
        return value * pairs if self._reduction in ("mean", None) else value


def _name(loss_fn: PairLoss) -> str:
    return getattr(loss_fn, "__name__", type(loss_fn).__name__)


def measure_reduction(loss_fn: PairLoss, chosen: torch.Tensor, rejected: torch.Tensor,
                      value: torch.Tensor) -> Optional[str]:
    """'mean' or 'sum': how `loss_fn` reduced the per-pair losses of `chosen`/`rejected` to the scalar `value`,
    told by calling it on each pair alone; None when both fit (one pair, or all losses 0). Anything else
    (a max, a loss that mixes pairs) is refused by name."""
    with torch.no_grad():
        each = torch.stack([loss_fn(c.detach(), r.detach()).reshape(())
                            for c, r in zip(chosen.split(1), rejected.split(1))]).double()
    single = float(value.detach())
    fits = [name for name, total in (("mean", each.mean()), ("sum", each.sum()))
            if abs(float(total) - single) <= 1e-4 * max(abs(single), 1e-6)]
    if not fits:
        raise CoatiUsageError(f"loss_fn {_name(loss_fn)} reduces its per-pair losses neither to their mean nor to "
                              "their sum; return one loss per pair (reduction='none') so the trainer can normalise it")
    return fits[0] if len(fits) == 1 else None
