"""Each training script's parser, built from the settings of `coati.config`: same flags, same defaults, everywhere.

A script adds only its algorithm's own flags. Every numeric flag carries its range, so a value out of range is refused
by name before anything is loaded.
"""
import argparse
import math
from typing import Any, Dict, Optional

from coati.config import (AgentSettings, AsyncSettings, BackendSettings, CheckpointSettings, CriticSettings, DataSettings,
                          EpisodeSettings, EpochSettings, EvalSettings, GRPOConfig, HealthSettings, KLSettings,
                          LogSettings, LoraSettings, MaxEntSettings, ModelSettings, OnPolicyConfig, OptimSettings,
                          PackingSettings, PluginConfig, PolicyLossSettings, PPOConfig, PtxSettings, ReferenceSettings,
                          RewardSettings, SandboxSettings, JudgeSettings, DistillSettings,
                          ProcessRewardSettings)
from coati.utils.registry import ADVANTAGE_ESTIMATORS, BEHAVIOUR_CORRECTIONS, OBJECTIVES, POLICY_LOSSES
from coati.utils.errors import CoatiUsageError

from .config_file import resolve_reporting
from .options import CoatiArgumentParser, add_post_parse, add_settings, settings_from

ON_POLICY_HELP = {
    "batch_size": "prompts per rank per collect step",
    "accumulation_steps": "learning micro-batches (--train_batch_size) per optimizer step",
    "save_interval": "save every N episodes (0: only at the end)",
    "save_freq_epochs": "also save when every N-th pass over the prompts ends (0: off)",
}
SUPERVISED_HELP = {"steps": "log the mean of the metrics every N optimizer steps",
                   "eval_interval": "also evaluate --eval_dataset every N optimizer steps (always after each epoch)"}
ON_POLICY_EVAL = ("eval_freq_epochs", "eval_freq_secs", "eval_n_samples", "eval_temperature", "save_best")
"""Held-out evaluation settings of the on-policy trainers only (supervised runs take `eval_interval`)."""
DERIVED = {"extra_stop_ids": [], "disable_loss_mask": False}
"""Values ColossalChat's flags set (`--conversation_template_config`'s stop ids, `--disable_loss_mask`), at their
defaults for a script without that layer."""


def training_parser(description: str, dataset_flag: str = "--dataset", on_policy: bool = False) -> argparse.ArgumentParser:
    """Flags common to all training scripts. On-policy scripts (`on_policy`) name their data `--prompt_dataset`
    (stored as `args.dataset` all the same) and count `--num_episodes` instead of epochs, steps and packed batches,
    so those flags are not theirs."""
    parser = CoatiArgumentParser(description=description)
    helps = ON_POLICY_HELP if on_policy else SUPERVISED_HELP
    add_settings(parser, ModelSettings, "model")
    add_settings(parser, LoraSettings, "LoRA")
    add_settings(parser, DataSettings, "data", flags={"dataset": dataset_flag})
    if not on_policy:
        add_settings(parser, PackingSettings, "packing")
        add_settings(parser, EpochSettings, "optimisation")
        add_settings(parser, EvalSettings, "held-out evaluation", skip=ON_POLICY_EVAL, helps=SUPERVISED_HELP)
    add_settings(parser, OptimSettings, "optimisation", helps=helps)
    add_settings(parser, CheckpointSettings, "checkpoints", helps=helps)
    add_settings(parser, LogSettings, "logging", helps=helps, defaults={} if on_policy else {"steps": 10})
    add_settings(parser, PluginConfig, "parallelism")
    parser.set_defaults(dataset_flag=dataset_flag, **DERIVED)
    add_post_parse(parser, resolve_reporting)
    return parser


def add_reference_args(parser: argparse.ArgumentParser, precompute: bool = True) -> None:
    """Flags of trainers with a frozen reference policy (DPO, KTO; GRPO and PPO without `precompute`)."""
    add_settings(parser, ReferenceSettings, "reference policy", skip=() if precompute else ("precompute_ref_logps",))


def add_on_policy_args(parser: argparse.ArgumentParser, maker: type, defaults: Optional[Dict[str, Any]] = None) -> None:
    """The flags PPO and GRPO share, after those of `maker`'s config (`GRPOConfig`, `PPOConfig`), whose defaults win
    where both declare a setting; `defaults` changes others' for the script."""
    sections = [(maker, "rollouts and advantages"), (EpisodeSettings, "on-policy"), (PolicyLossSettings, "policy loss"),
                (KLSettings, "KL to the reference"), (RewardSettings, "rewards"),
                (ProcessRewardSettings, "process reward model (step scores)"),
                (JudgeSettings, "LLM judge (--reward_fn judge)"), (SandboxSettings, "code_tests reward (programs run in a sandbox)"),
                (DistillSettings, "on-policy distillation (a teacher scores the policy's samples)"),
                (PtxSettings, "ptx (InstructGPT's supervised loss beside the policy's)"),
                (EvalSettings, "held-out evaluation"), (HealthSettings, "health alarms"),
                (BackendSettings, "rollout backend"), (AgentSettings, "multi-turn rollouts with tools"),
                (OnPolicyConfig, "on-policy")]
    for cls, title in sections:
        add_settings(parser, cls, title, defaults=defaults)
    add_post_parse(parser, check_part_options)


PART_OPTIONS = (("adv_estimator", "adv_option", ADVANTAGE_ESTIMATORS), ("policy_loss", "policy_loss_option", POLICY_LOSSES),
                ("behaviour_correction", "behaviour_correction_option", BEHAVIOUR_CORRECTIONS),
                ("objective", "objective_option", OBJECTIVES))
"""(the flag choosing a registered part, the flag of its options, the registry), by the flags' destinations."""


def check_part_options(args: argparse.Namespace) -> None:
    """Each `--*_option NAME=VALUE` names an option its part takes, as its registry declares them: a typo is one line
    before anything loads."""
    for choice, options, registry in PART_OPTIONS:
        if getattr(args, options, None) and hasattr(args, choice):
            registry.check_options(getattr(args, choice), dict(getattr(args, options)), f"--{options}")


def add_grpo_args(parser: argparse.ArgumentParser) -> None:
    """GRPO's flags: its rollouts and advantages, the maxent temperature, asynchronous rollouts; a run with no reward
    source is refused once they are parsed."""
    add_on_policy_args(parser, GRPOConfig)
    add_settings(parser, MaxEntSettings, "maxent advantages")
    add_settings(parser, AsyncSettings, "asynchronous rollouts")
    add_post_parse(parser, require_grpo_reward)


def require_grpo_reward(args: argparse.Namespace) -> None:
    """GRPO learns from rewards alone and has no default one: a run naming no reward source is refused before
    anything loads (not halfway through, on data the reward cannot read)."""
    if not (args.reward_fn or args.rm_pretrain or args.prm_pretrain or args.teacher_model or args.teacher_url):
        raise CoatiUsageError("GRPO needs a reward: --reward_fn (at least one function), --rm_pretrain (a trained "
                              "reward model) and/or --prm_pretrain (a process reward model), or a distillation teacher "
                              "(--teacher_model or --teacher_url)")


def add_ppo_args(parser: argparse.ArgumentParser) -> None:
    """PPO's flags: GAE and the critic. Here `--kl_coef` weighs the per-token KL penalty in the reward (k1 by default),
    and `--reward_fn` is optional."""
    add_on_policy_args(parser, PPOConfig, defaults={"reward_fn": (), "kl_coef": 0.05})
    add_settings(parser, CriticSettings, "ppo")


def micro_batches_per_pass(args: argparse.Namespace) -> int:
    """Learning micro-batches of one on-policy update pass on each rank: every collect step's rows in
    `--train_batch_size`s (a collect step's whole batch with 0)."""
    rows = args.batch_size * args.num_generations
    return args.num_collect_steps * (math.ceil(rows / args.train_batch_size) if args.train_batch_size else 1)


def optimizer_steps_per_episode(args: argparse.Namespace) -> int:
    """Optimizer steps of one on-policy episode on each rank: per update pass, its micro-batches in accumulation
    groups."""
    return args.num_update_steps * math.ceil(micro_batches_per_pass(args) / args.accumulation_steps)


def plugin_config(args: argparse.Namespace) -> PluginConfig:
    """The plugin's settings from their flags."""
    return settings_from(args, PluginConfig)
