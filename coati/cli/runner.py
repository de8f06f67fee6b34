"""The set-up every supervised script shares, from parsed flags to a finished, exported run.

A script picks its trainer class, data type and model loader; everything else (process group,
plugin, data, LoRA, optimizer, scheduler, resume, logging, export) happens here, once.
"""
import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type

import torch
import coati.utils.lean_import  # noqa: F401  (before colossalai.booster: no compile-worker processes)
from colossalai.accelerator import get_accelerator
from colossalai.booster.plugin import Plugin
from colossalai.cluster import DistCoordinator
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase, get_scheduler

from coati.dataset.collators import COLLATORS, ImageBatches
from coati.dataset.prepare import load_prepared, prepared_image_limits
from coati.dataset.sampler import (HeldOutBatchSampler, StatefulDistributedSampler, TokenBudgetBatchSampler,
                                  longest_sequence, row_tokens)
from coati.dataset.vision import ImageProcessing
from coati.utils.comm import is_rank_0, rank, world_size
from coati.distributed.launch import init_distributed
from coati.distributed.memory import check_run_memory
from coati.distributed.plugins import BoostSetup, build_booster, check_first_forward, check_plugin_available
from coati.models.lora import enable_lora, export_adapter_and_merge
from coati.models.packing import enable_packed_attention
from coati.models.utils import disable_dropout
from coati.models.reference import load_reference_model, with_reference_logps
from coati.models.reward_model import load_reward_model
from coati.models.prm import load_prm
from coati.models.vision import (auto_model_class, freeze_unused_vision_layers, freeze_vision_parts, is_vision_model,
                                 language_model_lora_targets)
from coati.trainer.base import SLTrainer, run_steps
from coati.trainer.callbacks import Callback, PerformanceEvaluator
from coati.trainer.callbacks.tokenizer import TokenizerInCheckpoints
from coati.cli.options import errors_named_as_given, settings_from
from coati.config import PackingSettings, SupervisedConfig, VisionSettings
from coati.run_config import SupervisedRun
from coati.utils.ckpt_io import (latest_checkpoint, read_running_state, resume_position, save_hf_model,
                                 set_aside_checkpoints, verify_checkpoint)
from coati.cli.colossalchat import attention_implementation, write_config_file
from coati.cli.config_file import save_run_record
from coati.utils.errors import CoatiUsageError, note_user, remember_save_dir
from coati.utils.file_checks import model_signature
from coati.cli.preflight import check_run_paths, image_limits, run_tokenizer
from coati.utils.metrics_logger import MetricsLogger


def _require_dir(path: str, what: str) -> str:
    if not Path(path).is_dir():
        raise CoatiUsageError(f"{what} {path} does not exist or is not a directory")
    return path


def load_causal_lm(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """The model to train with its LM head (a vision-language model's image-text-to-text class for such a folder)."""
    path = _require_dir(args.pretrain, "--pretrain model directory")
    return auto_model_class(path).from_pretrained(path, trust_remote_code=args.trust_remote_code,
                                                  attn_implementation=attention_implementation(args))


def load_reward_model_from_args(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    path = _require_dir(args.pretrain, "--pretrain model directory")
    return load_reward_model(path, tokenizer.pad_token_id, trust_remote_code=args.trust_remote_code,
                             attn_implementation=attention_implementation(args))


def load_prm_from_args(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    path = _require_dir(args.pretrain, "--pretrain model directory")
    return load_prm(path, tokenizer.pad_token_id, args.step_separator, trust_remote_code=args.trust_remote_code,
                    attn_implementation=attention_implementation(args))


def build_dataloader(plugin: Plugin, dataset: Dataset, batch_size: int, collator: Callable, shuffle: bool, seed: int,
                     max_tokens: int = 0, max_length: int = 0) -> DataLoader:
    """The plugin's distributed dataloader with a resumable sampler; a rank never sees an empty epoch. With
    `max_tokens`, micro-batches are filled up to that many tokens (rows cut to `max_length`) instead of `batch_size` rows.

    It draws its iterators' base seeds from a generator of its own: starting an iterator then leaves the
    global RNG alone, so a resumed run, which starts its iterator at a different moment, samples
    rollouts from the same random stream as the uninterrupted run."""
    if max_tokens:
        sampler = TokenBudgetBatchSampler(row_tokens(dataset, max_length), max_tokens, world_size(), rank(), shuffle, seed)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, generator=torch.Generator().manual_seed(seed))
    return plugin.prepare_dataloader(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=False,
                                     collate_fn=collator, distributed_sampler_cls=StatefulDistributedSampler,
                                     generator=torch.Generator().manual_seed(seed))


def build_held_out_dataloader(plugin: Plugin, dataset: Dataset, batch_size: int, collator: Callable, max_tokens: int = 0,
                              max_length: int = 0) -> DataLoader:
    """Held-out batches in order, each row scored once on one rank (`HeldOutBatchSampler`, over the ranks the
    plugin splits data between); with `max_tokens`, the token-budget sampler, whose filler step is not scored.
    Like `build_dataloader`'s, its iterators leave the global RNG alone (a generator of their own)."""
    if max_tokens:
        return build_dataloader(plugin, dataset, batch_size, collator, False, 0, max_tokens, max_length)
    split = plugin.prepare_dataloader(dataset, batch_size=batch_size, distributed_sampler_cls=StatefulDistributedSampler)
    sampler = HeldOutBatchSampler(len(dataset), batch_size, split.sampler.num_replicas, split.sampler.rank)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, generator=torch.Generator().manual_seed(0))


def build_optimizer(model: torch.nn.Module, args: argparse.Namespace, lr: Optional[float] = None) -> torch.optim.Optimizer:
    """AdamW over the trainable weights at `lr` (default `--lr`); colossalai's HybridAdam where CUDA is there (it has
    no CPU kernel)."""
    params = [p for p in model.parameters() if p.requires_grad]
    adamw = dict(lr=args.lr if lr is None else lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                 weight_decay=args.weight_decay)
    if torch.cuda.is_available():
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam(params, **adamw)
    return torch.optim.AdamW(params, **adamw)


def prepare_model(model: torch.nn.Module, args: argparse.Namespace, setup: BoostSetup) -> torch.nn.Module:
    """Packed attention, gradient checkpointing, a vision-language model's frozen parts, LoRA adapters (on its
    language model only) and dropout off as the flags say, before the model is boosted."""
    if settings_from(args, PackingSettings).packing:
        enable_packed_attention(model)
    if args.grad_checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    freeze_vision_layers(model, args)
    if args.lora_rank:
        targets = args.lora_target_modules
        if is_vision_model(args.pretrain):
            targets = language_model_lora_targets(model, targets)
        model = enable_lora(setup.booster, setup.plugin, args.plugin, model, args.lora_rank, args.lora_alpha,
                            args.lora_dropout, targets, args.lora_bias, args.lora_init)
    if args.disable_dropout:
        disable_dropout(model)
    return model


def freeze_vision_layers(model: torch.nn.Module, args: argparse.Namespace) -> None:
    """A vision-language model's (the policy's or PPO's critic's) tower layers that nothing reads, and the parts
    `--freeze_vision_tower` / `--freeze_multi_modal_projector` name, kept as they are; nothing for a text model."""
    vision = settings_from(args, VisionSettings)
    freeze_unused_vision_layers(model)
    freeze_vision_parts(model, vision.freeze_vision_tower, vision.freeze_multi_modal_projector)


def export_dir(args: argparse.Namespace) -> Optional[Path]:
    """Where the final model goes: `--output_dir/model`; with `--save_dir` alone, `--save_dir/modeling`, where
    ColossalChat's scripts write it (and its next stage reads it); None with neither."""
    if args.output_dir:
        return Path(args.output_dir) / "model"
    return Path(args.save_dir) / "modeling" if args.save_dir else None


def export_model(args: argparse.Namespace, setup: BoostSetup, model: torch.nn.Module, tokenizer: Any,
                 coordinator: DistCoordinator) -> None:
    """The final model in HF format at `export_dir(args)` (if any), with `tokenizer` (a vision-language model's
    processor: tokenizer, image processor and chat template); with LoRA, adapters merged and also kept alone beside
    it, in `adapter`."""
    target = export_dir(args)
    if target is None:
        return
    adapter = export_adapter_and_merge(setup.booster, model, target.parent / "adapter")
    if adapter:
        coordinator.print_on_master(f"saved LoRA adapter to {adapter}")
    path = save_hf_model(target, setup.booster, model, tokenizer, coordinator)
    coordinator.print_on_master(f"saved HF model to {path}")


def eval_batch_size(args: argparse.Namespace) -> int:
    """Rows per rank in an evaluation batch: `--eval_batch_size`, else `--batch_size`."""
    return args.eval_batch_size or args.batch_size


def resumed_line(checkpoint: str, position: str) -> str:
    """The line a resumed run prints; it says so when the checkpoint was written by another number of ranks."""
    saved = read_running_state(checkpoint)["world_size"]
    line = f"resumed from {checkpoint} at {position}"
    if saved != world_size():
        line += (f" (written by {saved} ranks, now {world_size()}: the data goes on after the samples already "
                 "seen; each rank's RNG starts afresh)")
    return line


def resolve_checkpoint(args: argparse.Namespace) -> Optional[str]:
    """The checkpoint to resume from: `--checkpoint_path`, or the newest complete one for 'latest'."""
    if args.checkpoint_path != "latest":
        return args.checkpoint_path
    if not args.save_dir:
        raise CoatiUsageError("--checkpoint_path latest needs --save_dir")
    found = latest_checkpoint(args.save_dir)
    return str(found) if found else None


def checkpoint_to_resume(args: argparse.Namespace) -> Optional[str]:
    """`resolve_checkpoint`, as a run starts: without a checkpoint (a line says so where 'latest' found none), the
    run starts from the beginning, and first moves an earlier run's checkpoints in `--save_dir` aside, so that a
    later 'latest' resumes this run's, never those."""
    checkpoint = resolve_checkpoint(args)
    if checkpoint:
        return checkpoint
    if args.checkpoint_path == "latest":
        note_user(f"no complete checkpoint in {args.save_dir} to resume: the run starts from the beginning")
    moved = set_aside_checkpoints(args.save_dir) if args.save_dir and is_rank_0() else None
    if moved:
        note_user(f"--save_dir {args.save_dir} held an earlier run's checkpoints; moved them to {moved}, apart from this "
                  "run's (to continue that run instead, give --checkpoint_path latest)")
    return None


def finished_run(args: argparse.Namespace, checkpoint: Optional[str], total: int, unit: str) -> bool:
    """Whether resuming from `checkpoint` has nothing left to do: it has done all `total` `unit`s and the model is
    exported already. Says so either way (a finished run whose model was not exported goes on to export it)."""
    if not checkpoint:
        return False
    done = read_running_state(checkpoint)["step"]
    if done < total:
        return False
    target = export_dir(args)
    exported = target is None or (target / "config.json").is_file()
    further = ("--max_steps or --max_epochs" if unit == "optimizer steps" else
               "--num_episodes (TRL's max_steps, verl's trainer.total_training_steps) or --num_epochs")
    where = f"; its model is in {target}" if target is not None and exported else ""
    if is_rank_0():
        print(f"the run is finished: {checkpoint} has done {done} of {total} {unit}, nothing is left to train (raise "
              f"{further} to train further){where}" + ("" if exported else "; exporting its model"), flush=True)
    return exported


@dataclass
class RunContext:
    """What a script's `setup_hook` sees before data is loaded; it may replace `load_data`
    (prepared folders -> dataset), e.g. to attach precomputed reference log-probs."""

    args: argparse.Namespace
    setup: BoostSetup
    tokenizer: PreTrainedTokenizerBase
    collator: Callable
    load_data: Callable[[Sequence[str]], Dataset]


def run_device() -> torch.device:
    return get_accelerator().get_current_device() if torch.cuda.is_available() else torch.device("cpu")


def frozen_reference(args: argparse.Namespace, setup: BoostSetup) -> torch.nn.Module:
    """The frozen `--ref_pretrain` model (default `--pretrain`) on this rank's device, in the training
    precision on GPU (fp32 on CPU)."""
    return frozen_model(_require_dir(args.ref_pretrain or args.pretrain, "--ref_pretrain model directory"), args, setup)


def frozen_dtype(setup: BoostSetup) -> torch.dtype:
    """The dtype frozen models (reference, teacher, PRM) run in: the training precision on GPU, fp32 on CPU."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.precision, torch.float32)


def frozen_model(path: str, args: argparse.Namespace, setup: BoostSetup) -> torch.nn.Module:
    """The causal LM in `path`, frozen, on this rank's device in `frozen_dtype`, its attention packed where
    `--packing` packs the policy's."""
    model = load_reference_model(path, run_device(), frozen_dtype(setup), args.trust_remote_code)
    if settings_from(args, PackingSettings).packing:
        enable_packed_attention(model)
    return model


def reference_hook(context: RunContext) -> Dict[str, Any]:
    """`setup_hook` of the reference-based trainers: the frozen reference for the trainer, or with
    `--precompute_ref_logps` its log-probs stored with the data and no model kept."""
    args = context.args
    if args._run_config.reference.precompute_ref_logps:
        load_plain = context.load_data
        context.load_data = lambda paths: with_reference_logps(
            paths, load_plain, args.ref_pretrain or args.pretrain, lambda: frozen_reference(args, context.setup),
            context.collator, args.max_length, args.precompute_ref_batch_size or args.batch_size, run_device())
        return {}
    return {"ref_model": frozen_reference(args, context.setup)}


def load_images(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> Optional[ImageProcessing]:
    """A vision-language model's processor (None for a text model), with the pixel limits the training data's image
    tokens were counted with; --max_pixels or --min_pixels that say otherwise are refused."""
    path = args.tokenizer_dir or args.pretrain
    flags, prepared_with = image_limits(args), prepared_image_limits(args.dataset)
    for name in ("max_pixels", "min_pixels"):
        given, found = getattr(flags, name), getattr(prepared_with, name, 0)
        if given and prepared_with is not None and given != found:
            raise CoatiUsageError(f"--{name} {given}: the data was prepared with {name} {found or 'the processor default'} "
                                  "(its image tokens are counted for it); prepare it again, or leave the flag out")
    return ImageProcessing.load(path, tokenizer, prepared_with or flags, args.trust_remote_code)


def tokenizer_to_save(tokenizer: PreTrainedTokenizerBase, images: Optional[ImageProcessing]) -> Any:
    """What checkpoints and the export save beside the model: a vision-language model's processor (its tokenizer,
    image processor and chat template), else the tokenizer."""
    return images.processor if images is not None else tokenizer


VISION_ON_POLICY_BLOCKERS = {
    "rollout_backend": ("vllm", "generates on the hf engine (and GRPO's Ray generators); leave it out"),
    "agent": (True, "generates on the hf engine, not through an OpenAI-client agent; leave it out"),
    "teacher_url": (True, "cannot send a served teacher the images; give a vision-language --teacher_model"),
    "prm_pretrain": (True, "takes no process reward model yet (PRMs do not read images); leave it out"),
}
"""GRPO and PPO settings a vision-language policy cannot take yet (a value, or True for any), with why: its rollouts
(single-turn, or multi-turn with `--tools`, the images in the first turn; GRPO's also with `--async_rollout`) run on
the `hf` engine and Ray generators, scored by reward functions, the tools' environment and a vision-language reward
model, distilled from a vision-language teacher in the trainer's processes."""


def check_model_kind(args: argparse.Namespace) -> None:
    """Before any data is prepared: the vision settings of a text --pretrain, and a vision-language one in trainers
    that take no images (those whose run config has no vision section), in GRPO or PPO with what their image
    rollouts lack, or with a text critic, reward model or teacher, are refused in one line."""
    if not is_vision_model(args.pretrain):
        vision = settings_from(args, VisionSettings)
        given = [f"--{name}" for name, value in vars(vision).items() if value]
        if given:
            raise CoatiUsageError(f"{given[0]}: {args.pretrain} is not a vision-language model (its config has no "
                                  "vision_config)")
        return
    command = args._run_config.command
    if not hasattr(args._run_config, "vision"):
        raise CoatiUsageError(f"--pretrain {args.pretrain} is a vision-language model: coati {command} does not train "
                              "one yet (coati sft, rm, dpo, orpo, grpo and ppo train on image rows)")
    if args.packing:
        raise CoatiUsageError("--packing: rows with images are padded, not packed (a vision-language model's image "
                              "positions are per row); leave --packing out")
    for name, (blocked, why) in (VISION_ON_POLICY_BLOCKERS.items() if command in ("grpo", "ppo") else ()):
        value = getattr(args, name, None)
        if value and (blocked is True or value == blocked):
            raise CoatiUsageError(f"--{name}: {command.upper()} on a vision-language model {why}")
    for name, role, default in (("critic_pretrain", "critic", " (default: --pretrain)"), ("rm_pretrain", "reward model", ""),
                                ("teacher_model", "distillation teacher", "")):
        path = getattr(args, name, None)
        if path and Path(path).is_dir() and not is_vision_model(path):
            raise CoatiUsageError(f"--{name} {path}: the {role} of a vision-language policy must read its images; "
                                  f"give a vision-language model{default}")


def preflight(args: argparse.Namespace) -> None:
    """Everything that can be checked before a process group exists: the plugin, the paths the flags name, that the
    model states fit in memory (`check_run_memory`), and the checkpoint to resume (intact, written for a model of
    `--pretrain`'s shape)."""
    check_plugin_available(args.plugin)
    check_model_kind(args)
    configs = check_run_paths(args)
    check_run_memory(args._run_config, longest_sequence(load_prepared(args.dataset, getattr(args, "data_type", None))))
    checkpoint = resolve_checkpoint(args)
    if checkpoint:
        verify_checkpoint(checkpoint, model_signature(configs["pretrain"]))


def start_run(args: argparse.Namespace, check: Optional[Callable[[argparse.Namespace], None]] = None,
              ) -> Tuple[BoostSetup, DistCoordinator, PreTrainedTokenizerBase]:
    """The checks of `preflight` and the script's own `check` (on resolved paths, before any process group), then
    the process group, booster and tokenizer."""
    with errors_named_as_given(args):
        preflight(args)
        if check is not None:
            check(args)
    if not (args.output_dir or args.save_dir):
        note_user("no --output_dir (or --save_dir): this run keeps no model, checkpoint or saved config")
    remember_save_dir(args.save_dir)
    init_distributed(args.seed, args.dist_timeout)
    write_config_file(args)
    save_run_record(args)
    setup = build_booster(args._run_config.parallel)
    return setup, DistCoordinator(), run_tokenizer(args)


def supervised_config(run: SupervisedRun) -> SupervisedConfig:
    """What a supervised trainer takes, from the sections of its run config."""
    return SupervisedConfig(epochs=run.epochs, steps=run.optim.steps, checkpoints=run.checkpoint,
                            logging=run.logging.cadence, evaluation=run.evaluation)


def build_scheduler(optimizer: torch.optim.Optimizer, args: argparse.Namespace, total_steps: int) -> Any:
    warmup = args.warmup_steps or math.ceil(args.warmup_ratio * total_steps)
    return get_scheduler(args.lr_scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=max(total_steps, 1),
                         scheduler_specific_kwargs=dict(args.lr_scheduler_option))


def open_logger(args: argparse.Namespace, trainer_cls: type, resume_step: Optional[int]) -> MetricsLogger:
    """The run's metrics logger; its W&B run is named --run_name, else after the trainer."""
    return MetricsLogger(args.log_dir, args.use_wandb, args.wandb_project, args.run_name or trainer_cls.__name__,
                         vars(args), resume_step=resume_step, wandb_table_rows=args.wandb_table_rows)


def run_supervised(
    args: argparse.Namespace,
    trainer_cls: Type[SLTrainer],
    data_type: str,
    model_loader: Optional[Callable[[argparse.Namespace, PreTrainedTokenizerBase], torch.nn.Module]] = None,
    trainer_kwargs: Optional[Dict[str, Any]] = None,
    callbacks: Sequence[Callback] = (),
    setup_hook: Optional[Callable[[RunContext], Dict[str, Any]]] = None,
) -> Optional[SLTrainer]:
    """Train `trainer_cls` on prepared `data_type` data as the flags say, then export the model (None: the run
    resumed is finished, `finished_run`).
    `callbacks` run after the built-in performance report. `setup_hook(context)` runs once the process
    group, plugin and tokenizer exist, and returns extra trainer arguments (a reference model)."""
    setup, coordinator, tokenizer = start_run(args, lambda a: check_first_forward(a.plugin, trainer_cls.no_grad_forward_first))
    images = load_images(args, tokenizer)
    collator = COLLATORS[data_type](tokenizer.pad_token_id, args.max_length, args.disable_loss_mask, args.packing,
                                    share_prompt=not args.use_flash_attn)
    if images is not None:
        collator = ImageBatches(collator, images)
    saved_tokenizer = tokenizer_to_save(tokenizer, images)
    context = RunContext(args, setup, tokenizer, collator, lambda paths: load_prepared(paths, data_type))
    hook_kwargs = setup_hook(context) if setup_hook else {}
    budget = {"max_tokens": args.max_tokens_per_batch, "max_length": args.max_length}
    train_loader = build_dataloader(setup.plugin, context.load_data(args.dataset), args.batch_size, collator, True,
                                    args.seed, **budget)
    eval_loader = (build_held_out_dataloader(setup.plugin, context.load_data(args.eval_dataset), eval_batch_size(args),
                                             collator, **budget) if args.eval_dataset else None)
    checkpoint = checkpoint_to_resume(args)
    position = resume_position(read_running_state(checkpoint)) if checkpoint else (0, 0, 0)
    total_steps = run_steps(train_loader, args.accumulation_steps, args.max_epochs, args.max_steps, position)
    if finished_run(args, checkpoint, total_steps, "optimizer steps"):
        return None
    model = prepare_model((model_loader or load_causal_lm)(args, tokenizer), args, setup)
    optimizer = build_optimizer(model, args)
    scheduler = build_scheduler(optimizer, args, total_steps)
    model, optimizer, scheduler, _ = setup.boost(model, optimizer, scheduler)
    config = supervised_config(args._run_config)
    trainer = trainer_cls(
        booster=setup.booster, max_epochs=config.epochs.max_epochs, model=model, optimizer=optimizer,
        plugin=setup.plugin, lr_scheduler=scheduler, config=config, grad_clip=args.grad_clip, coordinator=coordinator,
        callbacks=[PerformanceEvaluator(ignore_steps=1, print_fn=coordinator.print_on_master),
                   TokenizerInCheckpoints(saved_tokenizer, coordinator.is_master()), *callbacks],
        **(trainer_kwargs or {}), **hook_kwargs,
    )
    if checkpoint:
        trainer.load_checkpoint(checkpoint)
        coordinator.print_on_master(resumed_line(checkpoint, f"epoch {trainer.start_epoch}, step {trainer.step} of "
                                                             f"{total_steps}"))
    trainer.fit(train_loader, eval_loader, metrics_logger=open_logger(args, trainer_cls, trainer.step if checkpoint else None))
    export_model(args, setup, model, saved_tokenizer, coordinator)
    return trainer
