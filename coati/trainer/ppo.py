"""PPO with a critic, a frozen reference and a reward model or reward function (Ouyang et al. 2022)."""
from typing import Any, Optional

import torch

from coati.experience.experience import PPOExperienceMaker
from coati.models.loss import ValueLoss

from .components import CriticUpdate, PtxTerm
from .rollout import RolloutTrainer
from .sources import CyclingLoader


class PPOTrainer(RolloutTrainer):
    """`RolloutTrainer` with PPO's experience (critic values, KL-penalised token rewards, GAE) and its critic as a
    `CriticUpdate` part: trained by clipped `value_loss` on its own booster, optimizer and scheduler.

    With `ptx_dataloader` (supervised batches) and `ptx_coef` > 0, the actor's loss also carries
    `ptx_coef` times the language-modelling loss on one such batch per step (InstructGPT's PPO-ptx, a `PtxTerm`),
    which keeps the policy close to its supervised behaviour. The maker's KL weight, when adaptive, moves after
    every episode. Takes `RolloutTrainer`'s arguments."""

    maker: PPOExperienceMaker

    def __init__(self, *args: Any, critic: torch.nn.Module, critic_optim: torch.optim.Optimizer, critic_booster: Any,
                 critic_lr_scheduler: Optional[Any] = None, value_loss: Optional[ValueLoss] = None,
                 ptx_dataloader: Optional[Any] = None, ptx_coef: float = 0.0, **kwargs: Any) -> None:
        update = CriticUpdate(critic, critic_optim, critic_booster, critic_lr_scheduler, value_loss,
                              kwargs.get("accumulation_steps", 1))
        super().__init__(*args, critic_booster=critic_booster, critic=update, **kwargs)
        if ptx_dataloader is not None and ptx_coef > 0:
            self.loss_terms.append(PtxTerm(self.actor, CyclingLoader(ptx_dataloader, self.device), ptx_coef))
        if self.maker.kl_controller.target > 0:
            self._adapt("kl_ctl", self.maker.kl_controller)
