"""What every coati trainer stands on (`_TrainerCore`: callbacks, metrics, guarded optimizer steps) and the
supervised loop, `SLTrainer`; the on-policy loop, `OLTrainer`, is in `onpolicy.py`. A guarded step never trains on a
NaN: a non-finite loss or gradient stops the run (or, within a budget, skips the step; `NonFiniteGuard`), so none is
checkpointed or exported.

An `SLTrainer` subclass holds only its algorithm: what one micro-batch's loss and metrics are. Accumulation,
clipping, logging, checkpoints, resume, progress bars and callbacks live here.
"""
import json
import math
from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import coati.utils.lean_import  # noqa: F401  (before colossalai.booster: no compile-worker processes)
from colossalai.accelerator import get_accelerator
from colossalai.booster import Booster
from colossalai.booster.plugin import HybridParallelPlugin, Plugin
from colossalai.cluster import DistCoordinator
from colossalai.interface import OptimizerWrapper
from torch.utils.data import DataLoader
from tqdm import tqdm

from coati.config import CheckpointSettings, EpochSettings, EvalSettings, StepSettings, SupervisedConfig
from coati.dataset.collators import batch_rows
from coati.dataset.sampler import held_out_batches
from coati.utils.comm import is_distributed, is_rank_0
from coati.distributed.plugins import trainer_clips_gradients
from coati.trainer.callbacks.base import Callback, fire
from coati.utils.cadence import LogCadence, Saver
from coati.utils.ckpt_io import load_checkpoint, read_running_state, save_checkpoint
from coati.utils.errors import CoatiUsageError, NonFiniteError, warn_user
from coati.utils.metrics_logger import MetricsLogger, StatsLogger
from coati.utils.stats_tracker import StatsTracker

Batch = Dict[str, Any]


@dataclass
class BatchResult:
    """One micro-batch's contribution: `loss` is the SUM of per-item losses (graph attached); the
    loop divides it by the item count of the whole accumulated step across ranks. `metrics` maps a
    name to (total, count) for the stats tracker, so logged values are exact means over the log window."""

    loss: torch.Tensor
    metrics: Dict[str, Tuple[float, float]] = field(default_factory=dict)


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Tensors of a (nested) batch moved to `device`; anything else unchanged."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device) for v in batch)
    return batch


def all_ranks_finite(value: torch.Tensor) -> bool:
    """True when `value` is finite on every rank (one small all-reduce), so all ranks take the same branch."""
    bad = torch.tensor([0.0 if bool(torch.isfinite(value.detach()).all()) else 1.0], device=value.device)
    if is_distributed():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad.item() == 0.0


class NonFiniteGuard:
    """Decides, per optimizer step, whether it may be applied: a non-finite loss (on any rank) or gradient
    norm is skipped while fewer than `max_skips` steps have been skipped, and raises `NonFiniteError`
    otherwise. `skipped` counts the steps skipped so far (checkpoints keep it)."""

    def __init__(self, max_skips: int = 0) -> None:
        if max_skips < 0:
            raise ValueError("max_skips must be >= 0")
        self.max_skips, self.skipped = max_skips, 0

    def problem(self, loss: torch.Tensor, grad_norm: Optional[float], model: str = "") -> Optional[str]:
        """What is not finite in this step (`model`'s 'loss' or 'gradient norm'), or None."""
        prefix = f"{model} " if model else ""
        if not all_ranks_finite(loss):
            return f"{prefix}loss"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return f"{prefix}gradient norm"
        return None

    def skip(self, where: str, what: str) -> None:
        """Count one skipped step at `where` ('step 12', 'episode 3'), or raise when the budget is spent."""
        if self.skipped >= self.max_skips:
            budget = (f"after skipping {self.skipped} such steps (--skip_nonfinite {self.max_skips})"
                      if self.max_skips else "(--skip_nonfinite N skips up to N such steps)")
            raise NonFiniteError(f"{where}: the {what} is NaN or infinite; the run stops {budget} and this step "
                                 "was neither applied nor saved. Lower --lr, check the data, or resume from the last "
                                 "checkpoint")
        self.skipped += 1
        warn_user(f"{where}: the {what} is NaN or infinite; step skipped ({self.skipped} of --skip_nonfinite "
                  f"{self.max_skips})")


def clip_gradients(optimizer: torch.optim.Optimizer, grad_clip: float) -> Optional[float]:
    """Clip to `grad_clip` when the trainer, not the plugin, clips (ddp) and return the norm before clipping;
    None where the plugin's optimizer measures (and clips) it inside its own `step`."""
    if grad_clip > 0 or not _reports_grad_norm(optimizer):
        return float(optimizer.clip_grad_by_norm(grad_clip if grad_clip > 0 else float("inf")))
    return None


def _reports_grad_norm(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's own step measures the gradient norm (ZeRO, Gemini, hybrid parallel)."""
    return type(optimizer).get_grad_norm is not OptimizerWrapper.get_grad_norm


def apply_gradients(optimizer: torch.optim.Optimizer, lr_scheduler: Optional[Any], grad_clip: float,
                    loss: torch.Tensor, guard: NonFiniteGuard, where: str, model: str = "") -> Tuple[bool, Optional[float]]:
    """Clip, check and step one optimizer, then the schedule. A step whose `loss` (on any rank) or gradient norm is
    not finite is not applied: `guard` skips it within its budget, else stops the run with `NonFiniteError` naming
    `where`, the `model` and the quantity. Returns whether the step was applied, and the gradient norm.

    Plugins that clip inside their own step (ZeRO, Gemini, 3d) report the norm only after stepping; there the loss
    is checked first, fp16 overflow is the loss scaler's business, and the weights are checked before every
    checkpoint and export."""
    norm = clip_gradients(optimizer, grad_clip)
    problem = guard.problem(loss, norm, model)
    if problem:
        guard.skip(where, problem)
    else:
        optimizer.step()
        norm = norm if norm is not None else optimizer.get_grad_norm()
    optimizer.zero_grad()
    if lr_scheduler is not None:
        lr_scheduler.step()
    return not problem, None if problem or norm is None else float(norm)


class _TrainerCore:
    """What both loops share: callbacks around `fit`, the stats tracker, the metrics logger, and optimizer
    steps guarded against non-finite losses and gradients (`skip_nonfinite` such steps may be skipped)."""

    no_grad_forward_first: Optional[str] = None
    """The forward without gradients the trainer runs before its first backward, if any (gemini_auto refuses it)."""

    def __init__(self, callbacks: Sequence[Callback], coordinator: Optional[DistCoordinator],
                 skip_nonfinite: int = 0, logging: Optional[LogCadence] = None) -> None:
        self.callbacks = list(callbacks)
        self.coordinator = coordinator or DistCoordinator()
        self.logging = logging or LogCadence()
        self.stats = StatsTracker()
        self.metrics_logger: Optional[MetricsLogger] = None
        self.nonfinite = NonFiniteGuard(skip_nonfinite)

    def _apply_gradients(self, optimizer: torch.optim.Optimizer, lr_scheduler: Optional[Any], grad_clip: float,
                         loss: torch.Tensor, where: str) -> bool:
        """`apply_gradients` under this trainer's non-finite guard; records the gradient norm as `grad_norm`."""
        applied, norm = apply_gradients(optimizer, lr_scheduler, grad_clip, loss, self.nonfinite, where)
        self._record_grad_norm(norm)
        return applied

    def _open_logger(self, log_dir: Optional[str], use_wandb: bool, metrics_logger: Optional[MetricsLogger],
                     start_step: int = 0, total_steps: Optional[int] = None) -> None:
        """The run's metrics logger (`metrics_logger`, else one for `log_dir`), told the logged step the run starts
        from and the last."""
        self.metrics_logger = metrics_logger or MetricsLogger(log_dir=log_dir, use_wandb=use_wandb,
                                                              run_name=type(self).__name__)
        self.metrics_logger.start(start_step, total_steps)
        self.stats_logger = StatsLogger(self.metrics_logger)

    def _record_grad_norm(self, norm: Optional[float], name: str = "grad_norm") -> None:
        """The norm is the same on every rank (gradients are reduced), so each records it once."""
        if norm is not None:
            self.stats.record({name: (norm, 1)})

    def _position(self) -> Tuple[float, int]:
        """(epochs done, fractional where known; optimizer steps), logged with every window of training metrics."""
        raise NotImplementedError

    def _flush_metrics(self, step: int, prefix: str = "train/", extra: Optional[Dict[str, float]] = None,
                       stats: Optional[StatsTracker] = None) -> Dict[str, float]:
        """Reduce the stats (`self.stats` unless given) across ranks (once), fire `on_log` (a callback may add
        entries, alarms say), then log them at `step`; the stats start afresh."""
        reduced = (stats or self.stats).export()
        metrics = {f"{prefix}{k}": v for k, v in reduced.items()}
        if self.nonfinite.max_skips and prefix == "train/":
            metrics["train/skipped_nonfinite_steps"] = float(self.nonfinite.skipped)
        metrics.update(extra or {})
        if prefix == "train/":
            metrics = self.stats_logger.record(*self._position(), metrics)
        fire(self.callbacks, "on_log", step, metrics)
        self.metrics_logger.log(metrics, step)
        return metrics

    def _should_stop(self) -> bool:
        return any(cb.stop_training for cb in self.callbacks)

    def _run_fit(self, body) -> None:
        """Fire `on_fit_start`, run `body`, and always fire `on_fit_end`, close the logger and `_release()`."""
        fire(self.callbacks, "on_fit_start")
        try:
            body()
        finally:
            try:
                fire(self.callbacks, "on_fit_end")
                if self.metrics_logger is not None:
                    self.metrics_logger.close()
            finally:
                self._release()

    def _release(self) -> None:
        """Stop what the trainer started besides the models (rollout generators, say) when training ends."""


def ordering_sampler(loader: DataLoader) -> Any:
    """What orders a training loader's data: a token-budget batch sampler, else the row sampler."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return batch_sampler if hasattr(batch_sampler, "set_epoch") else getattr(loader, "sampler", None)


def run_steps(loader: DataLoader, accumulation_steps: int, max_epochs: float, max_steps: int,
              position: Tuple[int, int, int] = (0, 0, 0)) -> int:
    """Optimizer steps of a supervised run in all: `max_steps`, else the steps done before the resume `position`
    (epoch, step, samples of that epoch each rank consumed) and those the data left takes at this loader's size, up
    to `max_epochs` passes (TRL's fraction, 1.5, ending that far into the last one, its steps rounded up as Hugging
    Face rounds them). On the processes that saved it this is the epochs' steps; on another number of them, the
    schedule still ends with the data."""
    if max_steps:
        return max_steps
    epoch, done, consumed = position
    whole, per_epoch = math.floor(max_epochs), math.ceil(len(loader) / accumulation_steps)
    last_pass = math.ceil((max_epochs - whole) * per_epoch)   # the steps of a fractional last pass
    if epoch >= math.ceil(max_epochs):
        return done
    left_in_epoch = _steps_left_in_epoch(loader, accumulation_steps, epoch, consumed, per_epoch)
    if epoch == whole:   # inside the fractional last pass
        return done + max(last_pass - (per_epoch - left_in_epoch), 0)
    return done + left_in_epoch + per_epoch * (whole - epoch - 1) + last_pass


def _steps_left_in_epoch(loader: DataLoader, accumulation_steps: int, epoch: int, consumed: int,
                         per_epoch: int) -> int:
    """The optimizer steps left of `epoch` once each rank has seen its first `consumed` samples (a token-budget
    sampler's plan is that epoch's own); the sampler is left as it was."""
    sampler = ordering_sampler(loader)
    if not hasattr(sampler, "set_start_index"):
        return per_epoch
    was = getattr(sampler, "epoch", 0)
    sampler.set_epoch(epoch)
    sampler.set_start_index(consumed)
    left = math.ceil(len(loader) / accumulation_steps)
    sampler.set_start_index(0)
    sampler.set_epoch(was)
    return left


class SLTrainer(_TrainerCore, ABC):
    """Supervised loop: epochs of optimizer steps, each made of `accumulation_steps` micro-batches.

    - The last group of an epoch may be partial; it still makes an optimizer step, and losses are
      normalised by the item count of the step's own micro-batches over all ranks (`_count_items`),
      so a partial group weighs each item the same as a full one.
    - Its settings are one `SupervisedConfig` (`config`); the keyword arguments ColossalChat's trainers take
      (`accumulation_steps`, `log_interval`, `save_interval`, `save_dir`, ...) build one where none is given.
    - `log_interval` and `save_interval` count optimizer steps (the config's `logging` and `checkpoints` may instead
      log by TRL's strategies and save every N epochs or seconds as well). Metrics are reduced across ranks
      once per logged step. A final checkpoint is written at the end when `save_dir` is set.
    - `max_steps` > 0 trains that many optimizer steps (counted from the start of the run, resumed runs included),
      over as many epochs as that takes, whatever `max_epochs` says (Hugging Face's Trainer's rule); the
      checkpoint written there can be resumed with a larger limit.
    - `load_checkpoint(path)` resumes mid-epoch: the next optimizer step sees the next unseen batch.
    - Hooks fired (see `Callback`): on_fit_start/end, on_learn_epoch_start/end(epoch),
      on_optimizer_step_start/end(micro_batches) per optimizer step, on_log(step, metrics),
      on_evaluate(epoch, results), on_checkpoint_saved(path).

    Subclasses implement `_compute_batch(batch) -> BatchResult` and may override `_count_items`
    and `_eval_results`.
    """

    def __init__(
        self,
        booster: Booster,
        max_epochs: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        plugin: Plugin,
        start_epoch: int = 0,
        *,
        lr_scheduler: Optional[Any] = None,
        accumulation_steps: int = 1,
        log_interval: int = 10,
        eval_interval: int = 0,
        save_interval: int = 0,
        save_dir: Optional[str] = None,
        keep_last: int = 0,
        output_dir: Optional[str] = None,
        grad_clip: float = 0.0,
        max_steps: int = 0,
        coordinator: Optional[DistCoordinator] = None,
        callbacks: Sequence[Callback] = (),
        skip_nonfinite: int = 0,
        config: Optional[SupervisedConfig] = None,
    ) -> None:
        config = config or SupervisedConfig(
            epochs=EpochSettings(max_epochs, max_steps), steps=StepSettings(accumulation_steps, skip_nonfinite),
            checkpoints=CheckpointSettings(save_dir=save_dir, save_interval=save_interval, keep_last=keep_last,
                                           output_dir=output_dir),
            logging=LogCadence(steps=log_interval), evaluation=EvalSettings(eval_interval=eval_interval))
        super().__init__(callbacks, coordinator, config.steps.skip_nonfinite, config.logging)
        checkpoints = config.checkpoints
        if config.steps.accumulation_steps < 1 or config.logging.steps < 1 or checkpoints.save_interval < 0:
            raise CoatiUsageError("accumulation_steps and log_interval must be >= 1, save_interval >= 0")
        if checkpoints.save_interval and not checkpoints.save_dir:
            raise CoatiUsageError("--save_interval needs --save_dir, the directory checkpoints are written to")
        if isinstance(plugin, HybridParallelPlugin) and plugin.pp_size > 1:
            raise CoatiUsageError("--pp > 1 (pipeline parallelism) is not supported by supervised trainers yet; "
                                  "use --tp/--sp with --zero_stage for the 3d plugin")
        self.booster, self.plugin, self.model, self.optimizer = booster, plugin, model, optimizer
        self.lr_scheduler = lr_scheduler
        self.config, self.start_epoch = config, start_epoch
        self.max_epochs, self.max_steps = config.epochs.max_epochs, config.epochs.max_steps
        self.accumulation_steps, self.eval_interval = config.steps.accumulation_steps, config.evaluation.eval_interval
        self.save_dir, self.keep_last = checkpoints.save_dir, checkpoints.keep_last
        self.saver = Saver(checkpoints.save_freq_epochs, checkpoints.save_interval, checkpoints.save_freq_secs)
        self.output_dir = Path(checkpoints.output_dir) if checkpoints.output_dir else None
        self.grad_clip = grad_clip if trainer_clips_gradients(plugin) else 0.0
        self.device = get_accelerator().get_current_device()
        self.step = 0
        self.epoch = start_epoch
        self.epochs_done = float(start_epoch)
        self._resume_sample_index = 0
        self._last_saved_step: Optional[int] = None
        self.train_dataloader: Optional[DataLoader] = None
        self.eval_dataloader: Optional[DataLoader] = None

    # ---- what a subclass supplies -------------------------------------------------------------
    @abstractmethod
    def _compute_batch(self, batch: Batch) -> BatchResult:
        """Forward one micro-batch (already on the device) and return its summed loss and metrics."""

    def _count_items(self, batch: Batch) -> int:
        """How many items the loss of `batch` sums over; the default is its number of rows."""
        return self._rows(batch)

    def _eval_results(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """Derived evaluation numbers (e.g. perplexity) from the reduced means; default unchanged."""
        return metrics

    # ---- the loop -----------------------------------------------------------------------------
    def fit(
        self,
        train_dataloader: DataLoader,
        eval_dataloader: Optional[DataLoader] = None,
        log_dir: Optional[str] = None,
        use_wandb: bool = False,
        metrics_logger: Optional[MetricsLogger] = None,
    ) -> None:
        self._before_fit(train_dataloader, eval_dataloader, log_dir, use_wandb, metrics_logger)
        self._run_fit(self._epochs)

    def _before_fit(self, train_dataloader, eval_dataloader, log_dir, use_wandb, metrics_logger) -> None:
        self.train_dataloader, self.eval_dataloader = train_dataloader, eval_dataloader
        self._steps_per_epoch = math.ceil(len(train_dataloader) / self.accumulation_steps)
        self._total_steps = run_steps(train_dataloader, self.accumulation_steps, self.max_epochs, self.max_steps,
                                      (self.start_epoch, self.step, self._resume_sample_index))
        if not self.max_steps and not float(self.max_epochs).is_integer():   # TRL's fraction: ends in the last pass
            self.max_steps, self.max_epochs = self._total_steps, math.ceil(self.max_epochs)
        elif self.max_steps:
            self.max_epochs = math.ceil(self.max_steps / self._steps_per_epoch)
        self._open_logger(log_dir, use_wandb, metrics_logger, self.step, self._total_steps)
        self._set_start_index(self._resume_sample_index)

    def _epochs(self) -> None:
        self._bar = tqdm(total=self._total_steps, initial=self.step, desc="train", unit="step",
                         disable=not is_rank_0(), dynamic_ncols=True)
        for epoch in range(self.start_epoch, self.max_epochs):
            if self._reached_max_steps():
                break
            self._train(epoch)
            self._eval(epoch)
            if self._should_stop():
                break
        self._bar.close()
        if self.save_dir and self._last_saved_step != self.step:
            self._save(epoch=self.max_epochs, sample_index=0)

    def _sampler(self) -> Any:
        return ordering_sampler(self.train_dataloader)

    def _set_start_index(self, index: int) -> None:
        sampler = self._sampler()
        if hasattr(sampler, "set_start_index"):
            sampler.set_start_index(index)
        elif index:
            raise CoatiUsageError("resuming mid-epoch needs a StatefulDistributedSampler in the train dataloader")

    def _position(self) -> Tuple[float, int]:
        """(epochs done, as Hugging Face's Trainer counts them: 1.5 is half-way through the second; steps)."""
        return self.epochs_done, self.step

    def _train(self, epoch: int) -> None:
        self.epoch = epoch
        sampler = self._sampler()
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        samples_seen = self._resume_sample_index if epoch == self.start_epoch else 0
        num_steps = math.ceil(len(self.train_dataloader) / self.accumulation_steps)
        self.model.train()
        fire(self.callbacks, "on_learn_epoch_start", epoch)
        done_before = self._steps_per_epoch - num_steps   # steps of this epoch done before a resume
        for index, batches in enumerate(self._groups(self.train_dataloader), start=1):
            fire(self.callbacks, "on_optimizer_step_start")
            self._optimizer_step(batches)
            samples_seen += sum(self._rows(b) for b in batches)
            self.epochs_done = epoch + (done_before + index) / self._steps_per_epoch
            fire(self.callbacks, "on_optimizer_step_end", batches)
            self._bar.update()
            if self.logging.due(self.step):
                logged = self._flush_metrics(self.step, extra={"train/lr": self._current_lr()})
                self._bar.set_postfix({"epoch": f"{self.epochs_done:.2f}", **{
                    k.split("/", 1)[1]: f"{v:.4g}" for k, v in logged.items() if k.endswith("loss")}})
            if self._eval_due(index == num_steps):
                self._eval(epoch)
            if self.save_dir:
                finished = index == num_steps
                self.saver.save(lambda: self._save(epoch + 1 if finished else epoch, 0 if finished else samples_seen),
                                epoch + finished, self.step, epoch_ended=finished, last=self._reached_max_steps())
            if self._should_stop() or self._reached_max_steps():
                break
        if not self.logging.enabled:
            self.stats = StatsTracker()
        elif not self.stats.is_empty():
            self._flush_metrics(self.step, extra={"train/lr": self._current_lr()})
        self._resume_sample_index = 0
        self._set_start_index(0)
        fire(self.callbacks, "on_learn_epoch_end", epoch)

    def _eval_due(self, epoch_ends: bool) -> bool:
        """Whether `eval_interval` asks for an evaluation now; not at a step that ends the epoch or the run, which
        is evaluated then."""
        return bool(self.eval_interval) and self.step % self.eval_interval == 0 and not (
            epoch_ends or self._reached_max_steps())

    def _reached_max_steps(self) -> bool:
        return 0 < self.max_steps <= self.step

    def _groups(self, dataloader: Iterable[Batch]) -> Iterator[List[Batch]]:
        """Consecutive groups of `accumulation_steps` micro-batches; the last one may be shorter."""
        group: List[Batch] = []
        for batch in dataloader:
            group.append(batch)
            if len(group) == self.accumulation_steps:
                yield group
                group = []
        if group:
            yield group

    @staticmethod
    def _rows(batch: Batch) -> int:
        return batch_rows(batch)

    def _optimizer_step(self, batches: List[Batch]) -> None:
        batches = [move_to_device(b, self.device) for b in batches]
        normalizer = self._loss_normalizer(batches)
        step_loss, metrics = torch.zeros((), device=self.device), []
        for i, batch in enumerate(batches):
            with self._no_sync(last=i == len(batches) - 1):
                result = self._compute_batch(batch)
                loss = result.loss / normalizer
                self.booster.backward(loss, self.optimizer)
            step_loss += loss.detach()
            metrics.append(result.metrics)
        if self._apply_gradients(self.optimizer, self.lr_scheduler, self.grad_clip, step_loss, f"step {self.step + 1}"):
            for batch_metrics in metrics:
                self.stats.record(batch_metrics)
        self.step += 1

    def _loss_normalizer(self, batches: List[Batch]) -> float:
        """Items in this optimizer step over all ranks, divided by the world size.

        Plugins average gradients over ranks, so dividing each rank's summed loss by this gives the
        gradient of the mean loss over every item of the step, however items are spread.
        """
        local = float(sum(self._count_items(b) for b in batches))
        if not is_distributed():
            return max(local, 1.0)
        total = torch.tensor([local], dtype=torch.float64,
                             device=self.device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(total)
        return max(total.item() / dist.get_world_size(), 1e-8)

    def _no_sync(self, last: bool):
        if last or not self.plugin.support_no_sync():
            return nullcontext()
        if isinstance(self.plugin, HybridParallelPlugin) and self.plugin.zero_stage == 2:
            return nullcontext()
        return self.booster.no_sync(self.model, self.optimizer)

    def _current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _eval(self, epoch: int) -> None:
        if self.eval_dataloader is None:
            return
        self.model.eval()
        saved_stats, self.stats = self.stats, StatsTracker()
        with torch.no_grad():
            for batch, scored in tqdm(held_out_batches(self.eval_dataloader), total=len(self.eval_dataloader),
                                      desc=f"Eval {epoch}", disable=not is_rank_0(), leave=False):
                metrics = self._compute_batch(move_to_device(batch, self.device)).metrics
                if scored:
                    self.stats.record(metrics)
        results = self._eval_results(self.stats.export())
        self.stats = saved_stats
        self.metrics_logger.log({f"eval/{k}": v for k, v in results.items()}, self.step)
        self._write_eval_results(epoch, results)
        fire(self.callbacks, "on_evaluate", epoch, results)
        self.model.train()

    def _write_eval_results(self, epoch: int, results: Dict[str, float]) -> None:
        """`eval_result_epoch{N}.json` and `.txt` in `output_dir`, else in `save_dir` (as ColossalChat's
        trainers write them); nothing is written when neither is set."""
        folder = self.output_dir or (Path(self.save_dir) if self.save_dir else None)
        if folder is None or not self.coordinator.is_master():
            return
        folder.mkdir(parents=True, exist_ok=True)
        record = {"epoch": epoch, "step": self.step, **results}
        (folder / f"eval_result_epoch{epoch}.json").write_text(json.dumps(record, indent=2))
        lines = [f"epoch {epoch}, optimizer step {self.step}"] + [f"{k}: {v:.6g}" for k, v in results.items()]
        (folder / f"eval_result_epoch{epoch}.txt").write_text("\n".join(lines) + "\n")

    # ---- checkpoints --------------------------------------------------------------------------
    def _save(self, epoch: int, sample_index: int) -> None:
        path = save_checkpoint(self.save_dir, self.booster, self.model, self.optimizer, self.lr_scheduler,
                               epoch=epoch, step=self.step, batch_size=self._batch_size(),
                               coordinator=self.coordinator, sample_start_index=sample_index,
                               keep_last=self.keep_last, extra_state={"nonfinite_skipped": self.nonfinite.skipped})
        self._last_saved_step = self.step
        self.coordinator.print_on_master(f"saved checkpoint {path}")
        fire(self.callbacks, "on_checkpoint_saved", str(path))

    def _batch_size(self) -> int:
        return int(getattr(self.train_dataloader, "batch_size", 0) or 0)

    def load_checkpoint(self, path: str) -> None:
        """Restore model, optimizer, scheduler and RNG from `path`; `fit` then continues where it stopped."""
        self.start_epoch, self.step, self._resume_sample_index = load_checkpoint(
            path, self.booster, self.model, self.optimizer, self.lr_scheduler
        )
        self.nonfinite.skipped = read_running_state(path).get("nonfinite_skipped", 0)
        self._last_saved_step = self.step
