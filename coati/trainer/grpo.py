"""GRPO: group-relative policy optimisation with verifiable rewards, no critic (Shao et al. 2024)."""
from typing import Dict, Optional, Tuple

import torch

from coati.experience.controllers import KLController
from coati.experience.experience import Experience, GRPOExperienceMaker
from coati.models.loss import kl_penalty

from .rollout import RolloutTrainer


class GRPOTrainer(RolloutTrainer):
    """`RolloutTrainer` with GRPO's experience (groups of `num_generations` completions per prompt, group-
    normalised advantages) and, with a KL weight beta > 0, beta times the KL to the reference (the maker's
    k1/k2/k3 estimator) added to the loss. beta is `kl_controller`'s (default: `kl_coef`, fixed); the maker's
    MaxEnt temperature, if it has one, adapts after every episode too. Takes `RolloutTrainer`'s arguments."""

    maker: GRPOExperienceMaker

    def __init__(self, *args, kl_coef: float = 0.0, kl_controller: Optional[KLController] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kl_controller = kl_controller or KLController(kl_coef)
        if self.kl_controller.target > 0:
            self._adapt("kl_ctl", self.kl_controller)
        if self.maker.temperature is not None:
            self._adapt("maxent", self.maker.temperature)

    @property
    def kl_coef(self) -> float:
        """The KL weight in use."""
        return self.kl_controller.value

    def _step_extras(self) -> Dict[str, float]:
        """The KL coefficient, under both of the published module's names."""
        return {**super()._step_extras(), "train/beta": self.kl_coef, "train/kl_coeff": self.kl_coef}

    def _group_size(self) -> int:
        return self.maker.config.num_generations

    def _extra_actor_loss(self, experience: Experience, logps: torch.Tensor,
                          mask: torch.Tensor) -> Tuple[Optional[torch.Tensor], Dict[str, Tuple[float, float]]]:
        if self.kl_coef <= 0 or experience.ref_log_probs is None:
            return None, {}
        kl = self.policy_loss.aggregate(kl_penalty(logps, experience.ref_log_probs, self.maker.config.kl_estimator), mask)
        return self.kl_coef * kl, {"loss/kl": (self.kl_coef * kl.item(), 1)}
