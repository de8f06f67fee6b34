"""What GRPO and PPO share on top of the on-policy loop: prompts drawn in a resumable order, rollout
metrics and sample tables, the actor's clipped policy-gradient step, held-out evaluation, and
checkpoints of every model being trained."""
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence

import torch

from coati.experience.experience import Experience, ExperienceMaker, completion_rows
from coati.distributed.comm import gather_lists
from coati.experience.metrics import rollout_metrics, tokens_in
from coati.models.loss import PolicyLoss
from coati.utils.cadence import Evaluator, Saver
from coati.utils.ckpt_io import ModelState, load_checkpoint, read_running_state, save_checkpoint
from coati.utils.stats_tracker import StatsTracker

from .base import LogCadence, OLTrainer, move_to_device
from .callbacks import Callback, fire
from .components import Accumulation, CriticUpdate, LossTerm, actor_loss
from .sources import CyclingLoader, LocalRollouts, RolloutSource

SAMPLE_TABLE = "completions"
MAX_SAMPLE_ROWS = 64


class RolloutTrainer(OLTrainer):
    """Each episode takes `num_collect_steps` batches of experience from `source` (default: `LocalRollouts`, the
    RLVR workflow on the next prompt batches, made into experience by `experience_maker`), then `num_update_steps`
    passes of `_learn_step` over them in micro-batches of `train_batch_size`.

    The actor's step is `actor_loss`: `policy_loss` minus `entropy_coef` times the entropy plus each of
    `loss_terms` (GRPO's KL term, PPO's ptx loss); `critic`, when given, learns from the same micro-batches. After
    the updates the source learns of the new weights and the controllers (`_adapt`) move. When `evaluator` says
    so (default: every `eval_interval` episodes), before the first and after the last, the held-out prompts are
    completed greedily and scored; every `sample_log_interval` episodes a sample table goes to the metrics logger.
    Checkpoints (with `save_dir`), when `saver` says so (default: every `save_interval` episodes) and after the
    last, hold every trained model (`_trained_models`), the episode, the prompt order's position, the token count,
    every part's state and RNG, so a resumed run continues identically.
    """

    def __init__(
        self,
        actor: torch.nn.Module,
        actor_optim: torch.optim.Optimizer,
        actor_booster: Any,
        experience_maker: ExperienceMaker,
        prompt_dataloader: Any,
        *,
        lr_scheduler: Optional[Any] = None,
        critic_booster: Optional[Any] = None,
        policy_loss: Optional[PolicyLoss] = None,
        entropy_coef: float = 0.0,
        grad_clip: float = 0.0,
        save_interval: int = 0,
        save_dir: Optional[str] = None,
        keep_last: int = 0,
        eval_dataloader: Optional[Any] = None,
        eval_interval: int = 0,
        sample_log_interval: int = 0,
        callbacks: Sequence[Callback] = (),
        coordinator: Optional[Any] = None,
        skip_nonfinite: int = 0,
        logging: Optional[LogCadence] = None,
        saver: Optional[Saver] = None,
        evaluator: Optional[Evaluator] = None,
        train_batch_size: int = 0,
        accumulation_steps: int = 1,
        source: Optional[RolloutSource] = None,
        loss_terms: Sequence[LossTerm] = (),
        critic: Optional[CriticUpdate] = None,
    ) -> None:
        super().__init__(actor_booster, critic_booster, [], callbacks, coordinator=coordinator,
                         skip_nonfinite=skip_nonfinite, logging=logging)
        self.actor, self.optimizer, self.lr_scheduler = actor, actor_optim, lr_scheduler
        self.maker = experience_maker
        self.policy_loss = policy_loss or PolicyLoss()
        self.entropy_coef, self.grad_clip = entropy_coef, grad_clip
        self.train_batch_size = train_batch_size
        self.actor_accumulation = Accumulation(accumulation_steps)
        self.save_dir, self.keep_last = save_dir, keep_last
        self.saver = saver or Saver(freq_steps=save_interval)
        self.evaluator = evaluator or Evaluator(freq_steps=eval_interval)
        self.device = next(actor.parameters()).device
        self.prompts = CyclingLoader(prompt_dataloader, self.device)
        self.source = source or LocalRollouts(experience_maker, self.prompts)
        self.eval_dataloader = eval_dataloader
        self.sample_log_interval = sample_log_interval
        self.eval_history: Dict[int, Dict[str, float]] = {}
        self.tokens_seen = 0
        self.prompts_trained = 0
        self.controllers: Dict[str, Any] = {}
        self.loss_terms, self.critic = list(loss_terms), critic
        self._num_episodes = 0

    # ---- the parts an algorithm brings ------------------------------------------------------------
    def _group_size(self) -> int:
        """Samples per prompt that form a group in the metrics (GRPO's num_generations)."""
        return self.maker.group_size

    def _trained_models(self) -> Dict[str, ModelState]:
        """Models besides the actor that checkpoints hold, by folder name (PPO's critic)."""
        return {"critic": self.critic.model_state()} if self.critic is not None else {}

    def _set_train_mode(self, training: bool) -> None:
        self.actor.train(training)
        if self.critic is not None:
            self.critic.model.train(training)

    def _adapt(self, name: str, controller: Any) -> None:
        """Let `controller` (a `KLController`, a `TemperatureController`) observe every episode's experience once it
        is learned, log its state, and keep that state in checkpoints under `name`."""
        self.controllers[name] = controller

    # ---- the loop's parts -------------------------------------------------------------------------
    def _release(self) -> None:
        """The rollout source is closed when training ends, however it ends."""
        self.source.close()

    def _episodes(self, num_episodes: int, num_collect_steps: int, num_update_steps: int) -> None:
        """The held-out evaluation before the first episode, then the episodes."""
        self._num_episodes = num_episodes
        self._epochs_done = int(self._epoch_progress())
        self.source.start(self.start_episode)
        if self.eval_dataloader is not None and self.start_episode == 0:
            self.evaluate(step=0)
        super()._episodes(num_episodes, num_collect_steps, num_update_steps)

    def _make_experience(self, collect_step: int) -> Experience:
        self._set_train_mode(False)
        experience = self.source.next(self.episode, self.stats)
        self._record_experience(experience, collect_step)
        return experience

    def _record_experience(self, experience: Experience, collect_step: int) -> None:
        """Rollout metrics, the token count and (when due) the sample table of one experience batch."""
        metrics = rollout_metrics(experience, self._group_size())
        metrics.update({f"time/{k}": v for k, v in experience.timing.items()})
        if self.maker.config.dynamic_sampling:
            metrics["dynamic_sampling/extra_rollouts"] = float(experience.extra_rollouts)
        drawn = (experience.sequences.size(0) + experience.extra_rollouts) // self._group_size()
        counts = gather_lists([(tokens_in(experience), drawn)])
        self.tokens_seen += sum(tokens for tokens, _ in counts)
        self.prompts_trained += sum(prompts for _, prompts in counts)
        self._record({name: (value, 1) for name, value in metrics.items()})
        if self._sample_table_due(collect_step):
            self._log_samples(experience)

    def _learn_step(self, experience: Experience) -> None:
        start = time.perf_counter()
        self._set_train_mode(True)
        self._policy_step(experience)
        self._record({"time/learning": (time.perf_counter() - start, 1)})
        if self.critic is not None:
            for record in self.critic.step(experience, self._accumulated_step):
                self._record(record)

    def _policy_step(self, experience: Experience) -> None:
        """The actor's loss on one micro-batch, backward; an optimizer step once its accumulation group is complete."""
        loss, metrics, stats = actor_loss(self.actor, experience, self.policy_loss, self.entropy_coef, self.loss_terms)
        record = (metrics, stats["clip_ratio/low"].item(), stats["clip_ratio/high"].item())
        records = self._accumulated_step(self.actor_accumulation, self.actor_booster, self.optimizer,
                                         self.lr_scheduler, loss, record, "policy")
        if records is None:
            return
        self.global_step += 1
        self._record({"learning_rate": (float(self.optimizer.param_groups[0]["lr"]), 1)})
        for metrics, low, high in records:
            self._record(metrics)
            self.stats.minimum(**{"clip_ratio/low_min": low})
            self.stats.maximum(**{"clip_ratio/high_max": high})

    def _accumulated_step(self, accumulation: Accumulation, booster: Any, optimizer: torch.optim.Optimizer,
                          lr_scheduler: Optional[Any], loss: torch.Tensor, record: Any, model: str,
                          metric: str = "grad_norm") -> Optional[List[Any]]:
        """Backward one micro-batch's `loss`, scaled for its accumulation group; once the group is complete,
        the guarded optimizer step. Returns the group's records when a step was applied, else None."""
        scale = accumulation.scale()
        booster.backward(loss * scale, optimizer)
        if not accumulation.add(loss * scale, record):
            return None
        group_loss, records = accumulation.take()
        applied = self._apply_gradients(optimizer, lr_scheduler, self.grad_clip, group_loss, self._where(), model, metric)
        return records if applied else None

    def _after_updates(self) -> None:
        """The source learns of the new weights; each controller looks at the episode's experience: its state is
        recorded, then it moves."""
        self.source.learned(self.episode + 1)
        for controller in self.controllers.values():
            self._record({k: (v, 1) for k, v in controller.observe(self.data_buffer, self._group_size()).items()})

    def _update_batches(self) -> List[Experience]:
        """The episode's experience in micro-batches of `train_batch_size` rows (whole batches with 0)."""
        batches = [part for experience in self.data_buffer for part in experience.split(self.train_batch_size)]
        self._begin_pass(len(batches))
        return batches

    def _begin_pass(self, micro_batches: int) -> None:
        """An update pass of `micro_batches` starts: gradient accumulation groups them from here."""
        self.actor_accumulation.begin(micro_batches)
        if self.critic is not None:
            self.critic.accumulation.begin(micro_batches)

    def _where(self) -> str:
        """The current position, for messages about a step."""
        return f"episode {self.episode + 1}"

    def _step_extras(self) -> Dict[str, float]:
        """Tokens trained on so far, and what the loss terms log as they are (GRPO's beta)."""
        extras = {"train/num_tokens": float(self.tokens_seen)}
        for term in self.loss_terms:
            extras.update(term.extras())
        return extras

    def _epoch_progress(self) -> float:
        """Passes over the prompt set that training has made, from the prompts trained on by every rank."""
        return self.prompts_trained / max(self.source.prompts_per_epoch(), 1)

    # ---- sample tables ----------------------------------------------------------------------------
    def _sample_table_due(self, collect_step: int) -> bool:
        return bool(self.sample_log_interval) and collect_step == 0 and (self.episode + 1) % self.sample_log_interval == 0

    def _log_samples(self, experience: Experience) -> None:
        """Every rank's samples (up to MAX_SAMPLE_ROWS) as a table at this episode's step."""
        rows = gather_lists(completion_rows(experience))
        self.metrics_logger.log_table(SAMPLE_TABLE, rows[:MAX_SAMPLE_ROWS], step=self.episode + 1)

    # ---- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, step: int) -> Dict[str, float]:
        """Greedy completions of the held-out prompts scored like rollouts: eval/reward and
        eval/rewards/<component> (with `math_answer`, exact-answer accuracy), logged at `step` and kept
        in `eval_history`. Runs before training, when the `evaluator` says so, and after the last episode."""
        self._set_train_mode(False)
        greedy = replace(self.maker.config.sampling, do_sample=False)
        stats = StatsTracker()
        for batch in self.eval_dataloader:
            batch = move_to_device(batch, self.device)
            out = self.maker.engine.generate(batch["input_ids"], batch["attention_mask"], greedy)
            _, _, (total, components) = self.maker.scorer.score_batch(batch, out)
            stats.add("reward", float(sum(total)), len(total))
            for name, values in components.items():
                stats.add(f"rewards/{name}", float(sum(values)), len(values))
        self.eval_history[step] = self._flush_metrics(step, prefix="eval/", stats=stats)
        fire(self.callbacks, "on_evaluate", step, self.eval_history[step])
        return self.eval_history[step]

    # ---- checkpoints ------------------------------------------------------------------------------
    def _after_episode(self, episode: int) -> None:
        """Evaluation, then a checkpoint, when their `Evaluator` and `Saver` say they are due (and after the last
        episode)."""
        done, last = episode + 1, episode + 1 == self._num_episodes
        epochs = int(self._epoch_progress())
        ended, self._epochs_done = epochs > self._epochs_done, epochs
        if self.eval_dataloader is not None:
            self.evaluator.evaluate(lambda: self.evaluate(step=done), epochs, done, epoch_ended=ended, last=last)
        if self.save_dir:
            self.saver.save(lambda: self._save(done), epochs, done, epoch_ended=ended, last=last)

    def _save(self, step: int) -> None:
        path = save_checkpoint(self.save_dir, self.actor_booster, self.actor, self.optimizer, self.lr_scheduler,
                               epoch=self.prompts.epoch, step=step, batch_size=self.prompts.dataloader.batch_size,
                               coordinator=self.coordinator, sample_start_index=self.prompts.seen,
                               keep_last=self.keep_last, extra_state=self._extra_state(),
                               extra_models=self._trained_models())
        self.coordinator.print_on_master(f"saved checkpoint {path}")
        fire(self.callbacks, "on_checkpoint_saved", str(path))

    def _extra_state(self) -> Dict[str, Any]:
        return {"tokens_seen": self.tokens_seen, "prompts_trained": self.prompts_trained,
                "global_step": self.global_step, "nonfinite_skipped": self.nonfinite.skipped,
                "controllers": {name: c.state() for name, c in self.controllers.items()},
                "loss_terms": {term.name: term.state() for term in self.loss_terms}, **self.source.state()}

    def _restore_extra_state(self, state: Dict[str, Any]) -> None:
        self.tokens_seen = state.get("tokens_seen", 0)
        self.global_step = state.get("global_step", 0)
        self.prompts_trained = state.get("prompts_trained", 0)
        self.nonfinite.skipped = state.get("nonfinite_skipped", 0)
        self.source.restore(state)
        saved = state.get("controllers", {})
        for name, controller in self.controllers.items():
            if name in saved:
                controller.restore(saved[name])
        terms = state.get("loss_terms", {})
        for term in self.loss_terms:
            if term.name in terms:
                term.restore(terms[term.name])

    def load_checkpoint(self, path: str) -> None:
        """Restore every trained model with its optimizer and scheduler, RNG, the episode, the prompt
        order's position and the running counts."""
        epoch, self.start_episode, seen = load_checkpoint(path, self.actor_booster, self.actor, self.optimizer,
                                                          self.lr_scheduler, extra_models=self._trained_models())
        self.prompts.restore(epoch, seen)
        self._restore_extra_state(read_running_state(path))
