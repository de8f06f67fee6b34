"""PPO with a critic, a frozen reference and a reward model or reward function (Ouyang et al. 2022)."""
import time
from typing import Any, Dict, Optional, Tuple

import torch

from coati.experience.experience import Experience, PPOExperienceMaker
from coati.models.critic import action_values
from coati.models.logprobs import label_logps
from coati.models.loss import ValueLoss, masked_mean, masked_var
from coati.utils.ckpt_io import ModelState

from .rollout import Accumulation, RolloutTrainer
from .sources import CyclingLoader


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[returns - values] / Var[returns] over the masked tokens: 1 is a perfect critic, 0 no better
    than a constant."""
    mask = mask.float()
    return float(1 - masked_var(returns - values, mask) / masked_var(returns, mask).clamp(min=1e-8))


class PPOTrainer(RolloutTrainer):
    """`RolloutTrainer` with PPO's experience (critic values, KL-penalised token rewards, GAE) and a
    critic trained by clipped `value_loss` on its own booster, optimizer and scheduler.

    With `ptx_dataloader` (supervised batches) and `ptx_coef` > 0, the actor's loss also carries
    `ptx_coef` times the language-modelling loss on one such batch per step (InstructGPT's PPO-ptx),
    which keeps the policy close to its supervised behaviour. The maker's KL weight, when adaptive, moves after
    every episode. Takes `RolloutTrainer`'s arguments."""

    maker: PPOExperienceMaker

    def __init__(self, *args, critic: torch.nn.Module, critic_optim: torch.optim.Optimizer, critic_booster: Any,
                 critic_lr_scheduler: Optional[Any] = None, value_loss: Optional[ValueLoss] = None,
                 ptx_dataloader: Optional[Any] = None, ptx_coef: float = 0.0, **kwargs) -> None:
        super().__init__(*args, critic_booster=critic_booster, **kwargs)
        self.critic, self.critic_optim, self.critic_lr_scheduler = critic, critic_optim, critic_lr_scheduler
        self.value_loss = value_loss or ValueLoss()
        self.critic_accumulation = Accumulation(self.actor_accumulation.steps)
        self.ptx = CyclingLoader(ptx_dataloader, self.device) if ptx_dataloader is not None and ptx_coef > 0 else None
        self.ptx_coef = ptx_coef
        if self.maker.kl_controller.target > 0:
            self._adapt("kl_ctl", self.maker.kl_controller)

    def _set_train_mode(self, training: bool) -> None:
        super()._set_train_mode(training)
        self.critic.train(training)

    def _trained_models(self) -> Dict[str, ModelState]:
        return {"critic": (self.critic_booster, self.critic, self.critic_optim, self.critic_lr_scheduler)}

    def _extra_actor_loss(self, experience: Experience, logps: torch.Tensor,
                          mask: torch.Tensor) -> Tuple[Optional[torch.Tensor], Dict[str, Tuple[float, float]]]:
        if self.ptx is None:
            return None, {}
        batch = self.ptx.next()
        logits = self.actor(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        token_logps, label_mask = label_logps(logits, batch["labels"])
        ptx_loss = -masked_mean(token_logps, label_mask)
        return self.ptx_coef * ptx_loss, {"loss/ptx": (ptx_loss.item(), 1)}

    def _learn_step(self, experience: Experience) -> None:
        super()._learn_step(experience)
        start = time.perf_counter()
        self._critic_step(experience)
        self._record({"time/critic_learning": (time.perf_counter() - start, 1)})

    def _critic_step(self, experience: Experience) -> None:
        mask = experience.action_mask
        values = action_values(self.critic, experience.sequences, experience.attention_mask, experience.prompt_length)
        loss = self.value_loss(values, experience.values, experience.returns - experience.values, mask)
        record = {"loss/value": (loss.item(), 1),
                  "explained_variance": (explained_variance(values.detach(), experience.returns, mask), 1),
                  "values": (masked_mean(values.detach(), mask.float()).item(), 1)}
        records = self._accumulated_step(self.critic_accumulation, self.critic_booster, self.critic_optim,
                                         self.critic_lr_scheduler, loss, record, "critic", "grad_norm/critic")
        for record in records or []:
            self._record(record)

    def _begin_pass(self, micro_batches: int) -> None:
        super()._begin_pass(micro_batches)
        self.critic_accumulation.begin(micro_batches)

    def _extra_state(self) -> Dict[str, Any]:
        state = super()._extra_state()
        if self.ptx is not None:
            state.update(ptx_epoch=self.ptx.epoch, ptx_seen=self.ptx.seen)
        return state

    def _restore_extra_state(self, state: Dict[str, Any]) -> None:
        super()._restore_extra_state(state)
        if self.ptx is not None and "ptx_epoch" in state:
            self.ptx.restore(state["ptx_epoch"], state["ptx_seen"])
