"""PPO with a critic, a frozen reference and a reward model or reward function (Ouyang et al. 2022)."""
from typing import Any, NamedTuple, Optional

import torch

from coati.config import CriticSettings
from coati.experience.experience import PPOExperienceMaker
from coati.models.loss import ValueLoss

from .components import CriticUpdate, OptimizerStep
from .onpolicy import OLTrainer


class CriticParts(NamedTuple):
    """PPO's critic and what trains it: the (boosted) model, its optimizer, booster and scheduler, and its settings
    (the value clip, the warm-up episodes)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    booster: Any
    lr_scheduler: Optional[Any] = None
    settings: CriticSettings = CriticSettings()


class PPOTrainer(OLTrainer):
    """`OLTrainer` with PPO's experience (critic values, KL-penalised token rewards, GAE) and its critic as a
    `CriticUpdate` part: trained by clipped `value_loss` through its own optimizer step (booster, optimizer,
    scheduler). The maker's KL weight, when adaptive, moves after every episode. Takes `OLTrainer`'s arguments
    (the ptx loss among them), and `critic`."""

    maker: PPOExperienceMaker

    def __init__(self, *args: Any, critic: CriticParts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        step = OptimizerStep(critic.booster, critic.optimizer, critic.lr_scheduler, self.config.grad_clip,
                             self.nonfinite, self.config.steps.accumulation_steps, "critic")
        self.critic = CriticUpdate(critic.model, step, ValueLoss(critic.settings.value_clip))
        self.critic_warmup_episodes = critic.settings.critic_warmup_episodes
        if self.maker.kl_controller.target > 0:
            self._adapt("kl_ctl", self.maker.kl_controller)

    def _policy_step(self, experience: Any, where: str) -> None:
        """The policy learns only once the critic has had `critic_warmup_episodes` episodes alone (OpenRLHF's
        `--freezing_actor_steps`): advantages from an untrained critic's values push the policy at random."""
        if self.episode >= self.critic_warmup_episodes:
            super()._policy_step(experience, where)
