"""The set-up on-policy scripts share: prompts, actor, reference, engine, reward, trainer, export."""
import argparse
import json
from pathlib import Path

from coati.dataset.collators import PromptCollator
from coati.dataset.prepare import load_prepared
from coati.experience.experience import GRPOExperienceMaker, GRPOSettings
from coati.models.generation import HFEngine, SamplingConfig
from coati.models.loss import PolicyLoss
from coati.rewards import WeightedReward

from .grpo import GRPOTrainer
from .runner import (build_dataloader, build_optimizer, build_scheduler, export_model, frozen_reference, load_causal_lm,
                     open_logger, prepare_model, resolve_checkpoint, start_run)


def _settings(args: argparse.Namespace) -> GRPOSettings:
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k)
    return GRPOSettings(num_generations=args.num_generations, sampling=sampling, kl_estimator=args.kl_estimator,
                        scale_rewards=not args.no_std_normalize, drop_tied_groups=args.drop_tied_groups)


def run_grpo(args: argparse.Namespace) -> GRPOTrainer:
    """GRPO as the flags say: held-out reward before and after (with `--eval_dataset`), then the export."""
    reward_fn = WeightedReward.from_specs(args.reward_fn)
    setup, coordinator, tokenizer = start_run(args)
    collator = PromptCollator(tokenizer.pad_token_id, args.max_length)
    prompts = build_dataloader(setup.plugin, load_prepared(args.dataset, "prompt"), args.batch_size, collator, True, args.seed)
    held_out = (build_dataloader(setup.plugin, load_prepared(args.eval_dataset, "prompt"), args.batch_size, collator,
                                 False, args.seed) if args.eval_dataset else None)
    actor = prepare_model(load_causal_lm(args, tokenizer), args, setup)
    optimizer = build_optimizer(actor, args)
    scheduler = build_scheduler(optimizer, args, args.num_episodes * args.num_collect_steps * args.num_update_steps)
    actor, optimizer, scheduler, _ = setup.boost(actor, optimizer, scheduler)
    reference = frozen_reference(args, setup) if args.kl_coef > 0 else None
    generator = actor.unwrap(unwrap_peft=False) if hasattr(actor, "unwrap") else actor
    engine = HFEngine(generator, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    maker = GRPOExperienceMaker(actor, engine, tokenizer, reward_fn, _settings(args), reference)
    trainer = GRPOTrainer(
        actor, optimizer, setup.booster, maker, prompts, lr_scheduler=scheduler,
        policy_loss=PolicyLoss(args.clip_eps_low, args.clip_eps_high, args.loss_agg, args.max_new_tokens),
        kl_coef=args.kl_coef, entropy_coef=args.entropy_coef,
        grad_clip=setup.grad_clip if setup.trainer_clips_grad else 0.0, save_interval=args.save_interval,
        save_dir=args.save_dir, keep_last=args.keep_last, eval_dataloader=held_out, eval_interval=args.eval_interval,
        coordinator=coordinator,
    )
    checkpoint = resolve_checkpoint(args)
    if checkpoint:
        trainer.load_checkpoint(checkpoint)
        coordinator.print_on_master(f"resumed from {checkpoint} at episode {trainer.start_episode}")
    trainer.fit(args.num_episodes, args.num_collect_steps, args.num_update_steps,
                metrics_logger=open_logger(args, GRPOTrainer, trainer.start_episode if checkpoint else None))
    if args.output_dir:
        if trainer.eval_history and coordinator.is_master():
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.output_dir) / "eval_results.json").write_text(json.dumps(trainer.eval_history, indent=2))
        export_model(args, setup, actor, tokenizer, coordinator)
    return trainer
