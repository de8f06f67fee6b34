"""The set-up every supervised script shares, from parsed flags to a finished, exported run.

A script picks its trainer class, data type and model loader; everything else (process group,
plugin, data, LoRA, optimizer, scheduler, resume, logging, export) happens here, once.
"""
import argparse
import math
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Type

import torch
from colossalai.booster.plugin import Plugin
from colossalai.cluster import DistCoordinator
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase, get_scheduler

from coati.dataset.collators import COLLATORS
from coati.dataset.prepare import load_prepared
from coati.dataset.sampler import StatefulDistributedSampler
from coati.dataset.tokenization import load_tokenizer
from coati.distributed.launch import init_distributed
from coati.distributed.plugins import BoostSetup, build_booster, check_plugin_available
from coati.models.lora import enable_lora, export_adapter_and_merge
from coati.models.reward_model import load_reward_model
from coati.trainer.base import SLTrainer
from coati.trainer.callbacks import Callback, PerformanceEvaluator
from coati.utils.ckpt_io import latest_checkpoint, save_hf_model
from coati.utils.errors import CoatiUsageError
from coati.utils.metrics_logger import MetricsLogger


def _require_dir(path: str, what: str) -> str:
    if not Path(path).is_dir():
        raise CoatiUsageError(f"{what} {path} does not exist or is not a directory")
    return path


def load_causal_lm(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    path = _require_dir(args.pretrain, "--pretrain model directory")
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=args.trust_remote_code)


def load_reward_model_from_args(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    path = _require_dir(args.pretrain, "--pretrain model directory")
    return load_reward_model(path, tokenizer.pad_token_id, trust_remote_code=args.trust_remote_code)


def build_dataloader(plugin: Plugin, dataset: Dataset, batch_size: int, collator: Callable, shuffle: bool, seed: int) -> DataLoader:
    """The plugin's distributed dataloader with a resumable sampler; a rank never sees an empty epoch."""
    return plugin.prepare_dataloader(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=False,
                                     collate_fn=collator, distributed_sampler_cls=StatefulDistributedSampler)


def build_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """AdamW over the trainable weights; colossalai's HybridAdam where CUDA is there (it has no CPU kernel)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if torch.cuda.is_available():
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam(params, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)


def prepare_model(model: torch.nn.Module, args: argparse.Namespace, setup: BoostSetup) -> torch.nn.Module:
    """Gradient checkpointing and LoRA adapters as the flags say, before the model is boosted."""
    if args.grad_checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_rank:
        model = enable_lora(setup.booster, setup.plugin, args.plugin, model, args.lora_rank, args.lora_alpha,
                            args.lora_dropout, args.lora_target_modules)
    return model


def export_model(args: argparse.Namespace, setup: BoostSetup, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                 coordinator: DistCoordinator) -> None:
    """The final model in HF format under `--output_dir/model`; with LoRA, adapters merged and also kept alone."""
    adapter = export_adapter_and_merge(setup.booster, model, Path(args.output_dir) / "adapter")
    if adapter:
        coordinator.print_on_master(f"saved LoRA adapter to {adapter}")
    path = save_hf_model(Path(args.output_dir) / "model", setup.booster, model, tokenizer, coordinator)
    coordinator.print_on_master(f"saved HF model to {path}")


def resolve_checkpoint(args: argparse.Namespace) -> Optional[str]:
    """The checkpoint to resume from: `--checkpoint_path`, or the newest complete one for 'latest'."""
    if args.checkpoint_path != "latest":
        return args.checkpoint_path
    if not args.save_dir:
        raise CoatiUsageError("--checkpoint_path latest needs --save_dir")
    found = latest_checkpoint(args.save_dir)
    return str(found) if found else None


def run_supervised(
    args: argparse.Namespace,
    trainer_cls: Type[SLTrainer],
    data_type: str,
    model_loader: Optional[Callable[[argparse.Namespace, PreTrainedTokenizerBase], torch.nn.Module]] = None,
    trainer_kwargs: Optional[Dict[str, Any]] = None,
    callbacks: Sequence[Callback] = (),
) -> SLTrainer:
    """Train `trainer_cls` on prepared `data_type` data as the flags say, then export the model.
    `callbacks` run after the built-in performance report."""
    check_plugin_available(args.plugin)
    init_distributed(args.seed)
    setup = build_booster(args)
    coordinator = DistCoordinator()
    tokenizer = load_tokenizer(args.tokenizer_dir or args.pretrain, args.trust_remote_code)
    collator = COLLATORS[data_type](tokenizer.pad_token_id, args.max_length)
    train_loader = build_dataloader(setup.plugin, load_prepared(args.dataset, data_type), args.batch_size, collator,
                                    True, args.seed)
    eval_loader = (build_dataloader(setup.plugin, load_prepared(args.eval_dataset, data_type), args.batch_size, collator,
                                    False, args.seed) if args.eval_dataset else None)
    model = prepare_model((model_loader or load_causal_lm)(args, tokenizer), args, setup)
    optimizer = build_optimizer(model, args)
    total_steps = math.ceil(len(train_loader) / args.accumulation_steps) * args.max_epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    scheduler = get_scheduler(args.lr_scheduler, optimizer, num_warmup_steps=args.warmup_steps,
                              num_training_steps=max(total_steps, 1))
    model, optimizer, scheduler, _ = setup.boost(model, optimizer, scheduler)
    trainer = trainer_cls(
        booster=setup.booster, max_epochs=args.max_epochs, model=model, optimizer=optimizer, plugin=setup.plugin,
        lr_scheduler=scheduler, accumulation_steps=args.accumulation_steps, log_interval=args.log_interval,
        save_interval=args.save_interval, save_dir=args.save_dir, keep_last=args.keep_last,
        output_dir=args.output_dir, grad_clip=args.grad_clip, max_steps=args.max_steps, coordinator=coordinator,
        callbacks=[PerformanceEvaluator(ignore_steps=1, print_fn=coordinator.print_on_master), *callbacks],
        **(trainer_kwargs or {}),
    )
    checkpoint = resolve_checkpoint(args)
    if checkpoint:
        trainer.load_checkpoint(checkpoint)
        coordinator.print_on_master(f"resumed from {checkpoint} at epoch {trainer.start_epoch}, step {trainer.step}")
    logger = MetricsLogger(args.log_dir, args.use_wandb, args.wandb_project, trainer_cls.__name__, vars(args),
                           resume_step=trainer.step if checkpoint else None)
    trainer.fit(train_loader, eval_loader, metrics_logger=logger)
    if args.output_dir:
        export_model(args, setup, model, tokenizer, coordinator)
    return trainer
