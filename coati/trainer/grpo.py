"""GRPO: group-relative policy optimisation with verifiable rewards, no critic (Shao et al. 2024)."""
from dataclasses import replace
from typing import Any, Dict, Iterator, Optional, Sequence

import torch

from coati.experience.experience import Experience, GRPOExperienceMaker
from coati.models.logprobs import action_logps
from coati.models.loss import PolicyLoss, aggregate, kl_penalty, token_entropy
from coati.utils.ckpt_io import load_checkpoint, save_checkpoint

from .base import OLTrainer, apply_gradients, move_to_device
from .callbacks import Callback, fire


class GRPOTrainer(OLTrainer):
    """Each episode draws prompt batches (`num_collect_steps`), makes experience with `experience_maker`,
    then takes `num_update_steps` passes of optimizer steps over it. The loss is `policy_loss` plus
    `kl_coef` times the KL to the reference (the maker's k1/k2/k3 estimator) minus `entropy_coef`
    times the entropy.
    Checkpoints every `save_interval` episodes hold the actor, optimizer, scheduler, episode, the
    prompt sampler's position and RNG, so a resumed run continues identically."""

    def __init__(
        self,
        actor: torch.nn.Module,
        actor_optim: torch.optim.Optimizer,
        actor_booster: Any,
        experience_maker: GRPOExperienceMaker,
        prompt_dataloader: Any,
        *,
        lr_scheduler: Optional[Any] = None,
        policy_loss: Optional[PolicyLoss] = None,
        kl_coef: float = 0.0,
        entropy_coef: float = 0.0,
        grad_clip: float = 0.0,
        save_interval: int = 0,
        save_dir: Optional[str] = None,
        keep_last: int = 0,
        eval_dataloader: Optional[Any] = None,
        eval_interval: int = 0,
        callbacks: Sequence[Callback] = (),
        coordinator: Optional[Any] = None,
    ) -> None:
        super().__init__(actor_booster, None, [], callbacks, coordinator=coordinator)
        self.actor, self.optimizer, self.lr_scheduler = actor, actor_optim, lr_scheduler
        self.maker, self.prompt_dataloader = experience_maker, prompt_dataloader
        self.policy_loss = policy_loss or PolicyLoss()
        self.kl_coef, self.entropy_coef = kl_coef, entropy_coef
        self.grad_clip = grad_clip
        self.save_interval, self.save_dir, self.keep_last = save_interval, save_dir, keep_last
        self.device = next(actor.parameters()).device
        self.prompt_epoch, self._prompts_seen = 0, 0
        self._prompt_iter: Optional[Iterator] = None
        self.eval_dataloader, self.eval_interval = eval_dataloader, eval_interval
        self.eval_history: Dict[int, Dict[str, float]] = {}
        self._num_episodes = 0

    def _episodes(self, num_episodes: int, num_collect_steps: int, num_update_steps: int) -> None:
        """The held-out evaluation before the first episode, then the episodes."""
        self._num_episodes = num_episodes
        if self.eval_dataloader is not None and self.start_episode == 0:
            self.evaluate(step=0)
        super()._episodes(num_episodes, num_collect_steps, num_update_steps)

    # ---- prompts ------------------------------------------------------------------------------
    def _next_prompts(self) -> Dict[str, Any]:
        """The next prompt batch; a new epoch (reshuffled) when one runs out."""
        while True:
            if self._prompt_iter is None:
                self.prompt_dataloader.sampler.set_epoch(self.prompt_epoch)
                self._prompt_iter = iter(self.prompt_dataloader)
            try:
                batch = next(self._prompt_iter)
            except StopIteration:
                self.prompt_epoch, self._prompts_seen, self._prompt_iter = self.prompt_epoch + 1, 0, None
                self.prompt_dataloader.sampler.set_start_index(0)
                continue
            self._prompts_seen += batch["input_ids"].size(0)
            return move_to_device(batch, self.device)

    # ---- the algorithm ------------------------------------------------------------------------
    def _make_experience(self, collect_step: int) -> Experience:
        self.actor.eval()
        experience = self.maker.make(self._next_prompts())
        lengths = experience.action_mask.sum(-1).float()
        rows = experience.rewards.numel()
        metrics = {"reward": (experience.rewards.sum().item(), rows),
                   "completion_length": (lengths.sum().item(), rows),
                   "tied_group_fraction": (experience.info["tied_fraction"] * rows, rows)}
        for name, values in experience.info["reward_components"].items():
            metrics[f"rewards/{name}"] = (float(sum(values)), rows)
        if experience.kl is not None:
            per_row = experience.kl.sum(-1) / experience.action_mask.sum(-1).clamp(min=1)
            metrics["kl"] = (per_row.sum().item(), rows)
        self._record(metrics)
        return experience

    def _learn_step(self, experience: Experience) -> None:
        self.actor.train()
        mask = experience.loss_mask if experience.loss_mask is not None else experience.action_mask
        logps, logits = action_logps(self.actor, experience.sequences, experience.attention_mask,
                                     experience.prompt_length, return_logits=True)
        loss, stats = self.policy_loss(logps, experience.action_log_probs, experience.advantages, mask)
        metrics = {"policy_loss": (loss.item(), 1), **{k: (v.item(), 1) for k, v in stats.items()}}
        if self.kl_coef > 0 and experience.ref_log_probs is not None:
            kl = aggregate(kl_penalty(logps, experience.ref_log_probs, self.maker.settings.kl_estimator), mask)
            loss = loss + self.kl_coef * kl
            metrics["kl_loss"] = (kl.item(), 1)
        entropy = aggregate(token_entropy(logits), mask)
        metrics["entropy"] = (entropy.item(), 1)
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * entropy
        self.actor_booster.backward(loss, self.optimizer)
        apply_gradients(self.optimizer, self.lr_scheduler, self.grad_clip)
        metrics["loss"] = (loss.item(), 1)
        metrics["lr"] = (float(self.optimizer.param_groups[0]["lr"]), 1)
        self._record(metrics)

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, step: int) -> Dict[str, float]:
        """Greedy completions of the held-out prompts scored by the reward function: eval/reward and
        eval/rewards/<component> (with `math_answer`, exact-answer accuracy), logged at `step` and kept
        in `eval_history`. Runs before training, every `eval_interval` episodes, and after the last."""
        self.actor.eval()
        greedy = replace(self.maker.settings.sampling, do_sample=False)
        for batch in self.eval_dataloader:
            batch = move_to_device(batch, self.device)
            out = self.maker.engine.generate(batch["input_ids"], batch["attention_mask"], greedy)
            total, components = self.maker.score(batch, out)
            rows = len(total)
            self._record({"reward": (float(sum(total)), rows),
                          **{f"rewards/{k}": (float(sum(v)), rows) for k, v in components.items()}})
        self.eval_history[step] = self._flush_metrics(step, prefix="eval/")
        return self.eval_history[step]

    # ---- checkpoints --------------------------------------------------------------------------
    def _after_episode(self, episode: int) -> None:
        done = episode + 1
        due = self.eval_interval and done % self.eval_interval == 0
        if self.eval_dataloader is not None and (due or done == self._num_episodes):
            self.evaluate(step=done)
        if self.save_dir and self.save_interval and done % self.save_interval == 0:
            path = save_checkpoint(self.save_dir, self.actor_booster, self.actor, self.optimizer, self.lr_scheduler,
                                   epoch=self.prompt_epoch, step=done,
                                   batch_size=self.prompt_dataloader.batch_size, coordinator=self.coordinator,
                                   sample_start_index=self._prompts_seen, keep_last=self.keep_last)
            self.coordinator.print_on_master(f"saved checkpoint {path}")
            fire(self.callbacks, "on_checkpoint_saved", str(path))

    def load_checkpoint(self, path: str) -> None:
        """Restore actor, optimizer, scheduler, RNG, the episode and the prompt sampler's position."""
        self.prompt_epoch, self.start_episode, self._prompts_seen = load_checkpoint(
            path, self.actor_booster, self.actor, self.optimizer, self.lr_scheduler)
        self.prompt_dataloader.sampler.set_start_index(self._prompts_seen)
