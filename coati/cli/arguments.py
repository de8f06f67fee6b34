"""Each training script's parser, built from its run config (`coati.run_config`): same flags, same defaults, everywhere.

A script's algorithm flags are its tree's own sections. Every numeric flag carries its range, so a value out of range
is refused by name before anything is loaded.
"""
import argparse
import math
from typing import Any

from coati.run_config import sections, validate
from coati.utils.registry import ADVANTAGE_ESTIMATORS, BEHAVIOUR_CORRECTIONS, OBJECTIVES, POLICY_LOSSES

from .config_file import resolve_reporting
from .options import CoatiArgumentParser, add_post_parse, add_settings, settings_from

DERIVED = {"extra_stop_ids": [], "disable_loss_mask": False}
"""Values ColossalChat's flags set (`--conversation_template_config`'s stop ids, `--disable_loss_mask`), at their
defaults for a script without that layer."""


def run_config_parser(tree: type, description: str) -> argparse.ArgumentParser:
    """The parser of a trainer whose run config is `tree` (`coati.run_config`): one group of flags per section, in the
    tree's order. On-policy scripts name their data `--prompt_dataset` (stored as `args.dataset` all the same)."""
    parser = CoatiArgumentParser(description=description)
    for _, cls, shown in sections(tree):
        add_settings(parser, cls, shown.title, defaults=shown.defaults, helps=shown.helps, flags=shown.flags,
                     skip=shown.skip)
    data = next(shown for name, _, shown in sections(tree) if name == "data")
    parser.set_defaults(dataset_flag=data.flags.get("dataset", "--dataset"), **DERIVED)
    parser.run_config = tree
    add_post_parse(parser, resolve_reporting)
    add_post_parse(parser, check_part_options)
    return parser


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


def run_config_from(args: argparse.Namespace, tree: type) -> Any:
    """The run config `tree` from the parsed flags, validated (`coati.run_config.validate`)."""
    return validate(settings_from(args, tree))


def micro_batches_per_pass(args: argparse.Namespace) -> int:
    """Learning micro-batches of one on-policy update pass on each rank: every collect step's rows in
    `--train_batch_size`s (a collect step's whole batch with 0)."""
    rows = args.batch_size * args.num_generations
    return args.num_collect_steps * (math.ceil(rows / args.train_batch_size) if args.train_batch_size else 1)


def optimizer_steps_per_episode(args: argparse.Namespace) -> int:
    """Optimizer steps of one on-policy episode on each rank: per update pass, its micro-batches in accumulation
    groups."""
    return args.num_update_steps * math.ceil(micro_batches_per_pass(args) / args.accumulation_steps)
