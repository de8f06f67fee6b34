"""GRPO: group-relative policy optimisation with verifiable rewards, no critic (Shao et al. 2024)."""
from typing import Any, Optional

from coati.experience.controllers import KL_DEFAULTS, KLController
from coati.experience.experience import GRPOExperienceMaker

from .components import KLTerm
from .onpolicy import OLTrainer


class GRPOTrainer(OLTrainer):
    """`OLTrainer` with GRPO's experience (groups of `num_generations` completions per prompt, advantages from
    each group's rewards) and, with a KL weight beta > 0, beta times the KL to the reference (the maker's k1/k2/k3
    estimator) added to the loss. beta is `kl_controller`'s (default: none, 0); with the maker's `kl_in_reward`,
    the KL is in the rewards instead, weighted by the maker's controller. It and the maker's MaxEnt temperature,
    when they adapt, move after every episode. Asynchronous GRPO is this trainer with an `AsyncRollouts` source.
    Takes `OLTrainer`'s arguments."""

    maker: GRPOExperienceMaker

    def __init__(self, *args: Any, kl_controller: Optional[KLController] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        in_reward = self.maker.config.kl_in_reward
        if in_reward and kl_controller is not None and kl_controller is not self.maker.kl_controller:
            raise ValueError("with kl_in_reward the KL weight is the experience maker's: give the KLController to "
                             "GRPOExperienceMaker(kl_controller=...), not to GRPOTrainer")
        self.kl_controller = self.maker.kl_controller if in_reward else \
            kl_controller or KLController.from_settings(KL_DEFAULTS)
        self.loss_terms.insert(0, KLTerm(self.kl_controller, self.maker.config.kl_estimator, in_loss=not in_reward))
        if self.kl_controller.target > 0:
            self._adapt("kl_ctl", self.kl_controller)
        if self.maker.temperature is not None:
            self._adapt("maxent", self.maker.temperature)

    @property
    def kl_coef(self) -> float:
        """The KL weight in use."""
        return self.kl_controller.value
