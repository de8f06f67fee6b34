"""The builder of on-policy runs: prompts, actor, reference and engine, then the parts (`coati.cli.rl_parts`, their
flags checked first by `coati.cli.rl_checks`) into a trainer; then fit, the held-out results and the export.

`run_grpo` and `run_ppo` differ only in their experience maker and trainer (and PPO's critic); everything
else is `_run`.
"""
import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from coati.dataset.collators import PromptRows
from coati.dataset.prepare import load_prepared
from coati.dataset.sampler import row_tokens
from coati.experience.controllers import TemperatureController
from coati.experience.experience import GRPOExperienceMaker, PPOExperienceMaker
from coati.config import OnPolicyConfig
from coati.models.critic import load_critic
from coati.models.utils import disable_dropout
from coati.models.generation import HFEngine
from coati.models.packing import enable_packed_attention
from coati.distributed.launch import seed_each_rank
from coati.distributed.plugins import build_booster
from coati.cli.arguments import micro_batches_per_pass, optimizer_steps_per_episode
from coati.utils.ckpt_io import read_running_state, save_hf_model
from coati.utils.errors import fail, note_user, resume_hint
from coati.utils.registry import OBJECTIVES

from coati.trainer.callbacks import Callback
from coati.trainer.callbacks.best import BestModelKeeper
from coati.trainer.callbacks.tokenizer import TokenizerInCheckpoints
from coati.trainer.callbacks.health import ALARM_EXIT_CODE
from coati.trainer.grpo import GRPOTrainer
from coati.trainer.onpolicy import OLTrainer
from coati.trainer.ppo import CriticParts, PPOTrainer
from coati.trainer.sources import AsyncRollouts

from .runner import (_require_dir, build_dataloader, build_held_out_dataloader, build_optimizer, build_scheduler,
                     checkpoint_to_resume, eval_batch_size, export_dir, export_model, finished_run, freeze_vision_layers,
                     frozen_reference, load_causal_lm, load_images, open_logger, prepare_model, resumed_line, start_run,
                     tokenizer_to_save)

from .rl_checks import check_on_policy_flags, check_run
from .rl_parts import (distillation, health_monitor, kl_controller, policy_loss, ptx_loader, rollout_side, scorer,
                       step_scorer, stop_ids, vllm_pool, workflow)


def _total_steps(args: argparse.Namespace) -> int:
    """Optimizer steps of the whole run."""
    return args.num_episodes * optimizer_steps_per_episode(args)


def episodes_for_epochs(epochs: float, batches_per_epoch: int, collect_steps: int, done: int = 0,
                        epochs_done: float = 0.0) -> int:
    """Episodes whose collect steps (one prompt batch each, on every rank) pass over the prompts `epochs` times, the
    last pass rounded up to a whole episode (TRL's `num_train_epochs`; dynamic sampling's extra prompts not counted):
    on a resume, the `done` episodes and those the `epochs_done` passes leave take at this run's size."""
    left = max(math.ceil((epochs - epochs_done) * batches_per_epoch / collect_steps - 1e-9), 0)
    return done + left if done else max(left, 1)


def _one_update_per_experience(args: argparse.Namespace) -> bool:
    """Whether every experience is learned by exactly one optimizer step (its old log-probs are then the learning
    forward's own)."""
    return args.num_update_steps == 1 and micro_batches_per_pass(args) <= args.accumulation_steps


def _objective_needs_reference(args: argparse.Namespace) -> bool:
    """Whether `--objective` asks for the reference model's log-probs (online DPO's, say) whatever `--kl_coef` is."""
    return bool(getattr(OBJECTIVES.get(args.objective), "needs_reference", False))


def _rollout_config(args: argparse.Namespace) -> Any:
    """The experience maker's settings (`GRPOConfig`, `PPOConfig`): the run's `rollout` section, taking the old
    policy's log-probs at collection unless each experience gets one optimizer step."""
    return replace(args._run_config.rollout, old_log_probs_at_collection=not _one_update_per_experience(args))


def _trainer_config(args: argparse.Namespace, setup: Any) -> OnPolicyConfig:
    """The trainer's settings from the flags; the trainer clips gradients itself where the plugin does not."""
    return replace(args._run_config.algorithm, grad_clip=setup.grad_clip if setup.trainer_clips_grad else 0.0)


def _run(args: argparse.Namespace, build: Callable[..., OLTrainer], callbacks: Sequence[Callback] = ()
         ) -> Optional[OLTrainer]:
    """Prompts, actor, reference and engine; `build(args, setup, ...)` makes the trainer; then resume,
    fit, the held-out results and the export (None: the run resumed is finished, `finished_run`)."""
    setup, coordinator, tokenizer = start_run(args, check_run)
    images = load_images(args, tokenizer)
    saved_tokenizer = tokenizer_to_save(tokenizer, images)
    collator = PromptRows(args.max_length, images)
    rows = load_prepared(args.dataset, "prompt")
    _note_cut_prompts(rows, args.max_length)
    prompts = build_dataloader(setup.plugin, rows, args.batch_size, collator, True, args.seed)
    checkpoint = checkpoint_to_resume(args)
    if args.num_epochs:
        state = read_running_state(checkpoint) if checkpoint else {}
        args.num_episodes = episodes_for_epochs(args.num_epochs, len(prompts), args.num_collect_steps,
                                                state.get("step", 0),
                                                state.get("prompts_trained", 0) / prompts.sampler.total_size)
    if finished_run(args, checkpoint, args.num_episodes, "episodes"):
        return None
    held_out = (build_held_out_dataloader(setup.plugin, load_prepared(args.eval_dataset, "prompt"), eval_batch_size(args),
                                          collator) if args.eval_dataset else None)
    actor = prepare_model(load_causal_lm(args, tokenizer), args, setup)
    optimizer = build_optimizer(actor, args)
    scheduler = build_scheduler(optimizer, args, _total_steps(args))
    actor, optimizer, scheduler, _ = setup.boost(actor, optimizer, scheduler)
    reference = frozen_reference(args, setup) if args.kl_coef > 0 or _objective_needs_reference(args) else None
    generator = actor.unwrap(unwrap_peft=False) if hasattr(actor, "unwrap") else actor
    engine = HFEngine(generator, tokenizer.pad_token_id, stop_ids(args, tokenizer), args.inference_batch_size)
    monitor = health_monitor(args)
    kwargs = dict(config=_trainer_config(args, setup), policy_loss=policy_loss(args), eval_dataloader=held_out,
                  coordinator=coordinator, ptx_dataloader=ptx_loader(args, setup, tokenizer),
                  callbacks=[monitor, TokenizerInCheckpoints(saved_tokenizer, coordinator.is_master()), *callbacks])
    if args.rollout_backend == "vllm" and not getattr(args, "async_rollout", False):
        kwargs["rollout_pool"] = vllm_pool(args, tokenizer)
    if args.save_best:
        kwargs["callbacks"].append(BestModelKeeper(
            args.save_best, export_dir(args).parent / "best",
            lambda folder: save_hf_model(folder, setup.booster, actor, tokenizer, coordinator), coordinator.is_master()))
    trainer = build(args, setup, tokenizer, actor, optimizer, scheduler, engine, reference, prompts, kwargs)
    seed_each_rank(args.seed, prompts.sampler.rank)   # the rank's place in the plugin's data split
    if checkpoint:
        trainer.load_checkpoint(checkpoint)
        coordinator.print_on_master(resumed_line(checkpoint, f"episode {trainer.start_episode}"))
    trainer.fit(args.num_episodes, args.num_collect_steps, args.num_update_steps,
                metrics_logger=open_logger(args, type(trainer), trainer.start_episode if checkpoint else None))
    if args.output_dir and coordinator.is_master():
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        if trainer.eval_history:
            (Path(args.output_dir) / "eval_results.json").write_text(json.dumps(trainer.eval_history, indent=2))
        (Path(args.output_dir) / "alarms.json").write_text(json.dumps(monitor.fired, indent=2))
    coordinator.print_on_master(f"alarms: {'; '.join(monitor.fired.values()) or 'none'}")
    if monitor.stopped_by:
        fail(f"error: stopped by alarm {monitor.stopped_by} (--stop_on_alarm); {resume_hint()}", ALARM_EXIT_CODE)
    export_model(args, setup, actor, saved_tokenizer, coordinator)
    return trainer


def _note_cut_prompts(rows: Any, max_length: int) -> None:
    """A note of the prompts that `--max_length` cuts at batching time (from the left, their end kept)."""
    longer = sum(n > max_length for n in row_tokens(rows)) if max_length else 0
    if longer:
        note_user(f"{longer} of {len(rows)} prompts are longer than --max_length {max_length} tokens: they are cut from "
                  "the left, their end kept")


def _build_grpo(args, setup, tokenizer, actor, optimizer, scheduler, engine, reference, prompts, kwargs) -> GRPOTrainer:
    config = _rollout_config(args)
    temperature = (TemperatureController(args.maxent_tau, args.maxent_target_entropy, args.maxent_tau_lr)
                   if args.adv_estimator == "maxent" else None)
    kl = kl_controller(args)
    maker = GRPOExperienceMaker(actor, engine, scorer(args, tokenizer, config), config, reference,
                                temperature=temperature, teacher=distillation(args, setup, tokenizer, kwargs),
                                step_scorer=step_scorer(args, setup, tokenizer), kl_controller=kl)
    kwargs["workflow"] = workflow(args, maker, prompts.collate_fn)
    if args.async_rollout:
        kwargs["source"] = AsyncRollouts(maker, actor, len(prompts.dataset),
                                         **rollout_side(args, maker, kwargs["workflow"], prompts.collate_fn))
    return GRPOTrainer(actor, optimizer, setup.booster, maker, prompts, lr_scheduler=scheduler, kl_controller=kl,
                       **kwargs)


def run_grpo(args: argparse.Namespace, callbacks: Sequence[Callback] = ()) -> Optional[GRPOTrainer]:
    """GRPO as the flags say (a reward source among them, `GRPORunConfig.check`): held-out reward before and after
    (with `--eval_dataset`), then the export."""
    check_on_policy_flags(args)
    return _run(args, _build_grpo, callbacks)


def _build_ppo(args, setup, tokenizer, actor, optimizer, scheduler, engine, reference, prompts, kwargs) -> PPOTrainer:
    critic_path = _require_dir(args.critic_pretrain or args.rm_pretrain or args.pretrain, "--critic_pretrain model directory")
    critic = load_critic(critic_path, tokenizer.pad_token_id, args.trust_remote_code)
    if args.packing:
        enable_packed_attention(critic)
    if args.grad_checkpoint:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    freeze_vision_layers(critic, args)
    if args.disable_dropout:
        disable_dropout(critic)
    critic_optim = build_optimizer(critic, args, lr=args.critic_lr or args.lr)
    critic_scheduler = build_scheduler(critic_optim, args, _total_steps(args))
    critic_setup = build_booster(args._run_config.parallel)
    critic, critic_optim, critic_scheduler, _ = critic_setup.boost(critic, critic_optim, critic_scheduler)
    config = _rollout_config(args)
    maker = PPOExperienceMaker(actor, critic, engine, scorer(args, tokenizer, config), config, reference,
                               kl_controller=kl_controller(args), step_scorer=step_scorer(args, setup, tokenizer),
                               teacher=distillation(args, setup, tokenizer, kwargs))
    kwargs["workflow"] = workflow(args, maker, prompts.collate_fn)
    return PPOTrainer(actor, optimizer, setup.booster, maker, prompts, lr_scheduler=scheduler, **kwargs,
                      critic=CriticParts(critic, critic_optim, critic_setup.booster, critic_scheduler,
                                         args._run_config.critic))


def run_ppo(args: argparse.Namespace, callbacks: Sequence[Callback] = ()) -> Optional[PPOTrainer]:
    """PPO as the flags say: rewards from `--rm_pretrain` and/or `--reward_fn`, a critic from
    `--critic_pretrain` (default: the reward model), KL-penalised to the reference; then the export."""
    check_on_policy_flags(args)
    return _run(args, _build_ppo, callbacks)
