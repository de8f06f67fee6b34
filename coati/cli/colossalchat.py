"""ColossalChat's flags on coati's scripts, so a ColossalChat user's command lines run unchanged.

`add_colossalchat_flags(parser, script)` registers every flag of ColossalChat's script of that name that
coati does not define itself: each is accepted with ColossalChat's meaning (an alias of ours, or translated
after parsing by `CoatiArgumentParser`'s post-parse step) or refused with one line naming what to use
instead. docs/migration/colossalchat.md lists them all.
"""
import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from coati.cli.options import add_alias, add_post_parse
from coati.config import DataSettings, LoraConfig, OptimSettings, RewardSettings, SamplingConfig
from coati.utils.ranges import at_least
from coati.utils.errors import CoatiUsageError, warn_user

SUPERVISED = ("sft", "rm", "dpo", "kto", "orpo")
ON_POLICY = ("ppo", "grpo")

COLOSSALCHAT_REWARDS = {"gsm8k_reward_fn": ["math_answer", "answer_format"],
                        "math_competition_reward_fn": ["math_answer", "answer_format"]}
"""ColossalChat's RLVR reward functions -> coati's: the answer checked against `gt_answer`, plus its format."""

REFUSED: Dict[str, Dict[str, str]] = {
    "--initial_temperature": {"grpo": "use --temperature (no schedule)"},
    "--final_temperature": {"grpo": "use --temperature (no schedule)"},
    "--max_tokens_thinking": {"grpo": "use --max_new_tokens to bound the whole completion"},
    "--critic_checkpoint_path": {"ppo": "pass the critic's model folder as --critic_pretrain, or resume actor and "
                                        "critic together with --checkpoint_path"},
    "--disable_loss_mask": {s: "no replacement: the loss covers each completion's own tokens and never its padding"
                            for s in ON_POLICY},
}
"""ColossalChat flag -> {script: what to use instead} for the scripts where coati refuses it."""


class _Refuse(argparse.Action):
    """A flag that stops the parse with one line naming what to use instead."""

    def __init__(self, option_strings: List[str], dest: str, instead: str = "", **kwargs) -> None:
        super().__init__(option_strings, dest, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is ColossalChat's and coati does not take it: {self.instead}")


def add_colossalchat_flags(parser: argparse.ArgumentParser, script: str) -> None:
    """Register ColossalChat's flags of `script` (sft, rm, dpo, kto, orpo, ppo, grpo) on `parser`."""
    group = parser.add_argument_group("ColossalChat's flags (see docs/migration/colossalchat.md)")
    group.add_argument("--config_file", default=None, help="also write the run's flags to this JSON file")
    group.add_argument("--enable_sequence_parallelism", action="store_true",
                       help="3d: sequence parallelism (--sp_mode, default split_gather)")
    group.add_argument("--lora_config", default=None, help="ColossalChat LoraConfig JSON: sets --lora_rank, "
                       "--lora_alpha, --lora_dropout and --lora_target_modules")
    if script in ("sft", "ppo", "grpo"):
        group.add_argument("--save_path", default=None, help="--save_dir (unless given): checkpoints, and the final "
                           "model in save_path/modeling, where ColossalChat writes it")
    add_alias(group, "--max_len", DataSettings, "max_length")   # on-policy: ColossalChat's GRPO test abbreviates
    if script in ("sft", "dpo", "kto", "orpo"):
        group.add_argument("--disable_loss_mask", action="store_true",
                           help="train on every token, the prompt included (default: the response's tokens)")
    if script in ("dpo", "orpo"):
        group.add_argument("--model_type", default=None, help="read and not used, as in ColossalChat")
        group.add_argument("--disable_reference_model", action="store_true",
                           help="dpo: reference-free (reference log-probs taken as 0); orpo has no reference anyway")
    if script == "dpo":
        group.add_argument("--length_normalization", action="store_true", help="length-normalised log-probs")
        group.add_argument("--ref_tp", type=at_least(1), default=None, help="must equal --tp: the reference is sharded like the policy")
    if script == "kto":
        group.add_argument("--auto_weight", action="store_true", help="scale --desirable_weight so that "
                           "desirable_weight x desirable rows / (undesirable_weight x undesirable rows) is in [1, 4/3]")
    if script in ON_POLICY:
        add_alias(group, "--experience_batch_size", OptimSettings, "batch_size")
        add_alias(group, "--max_seq_len", SamplingConfig, "max_new_tokens")
        add_alias(group, "--reward_functions", RewardSettings, "reward_fn",
                  "; ColossalChat's gsm8k_reward_fn and math_competition_reward_fn mean math_answer and answer_format")
        group.add_argument("--conversation_template_config", default=None,
                           help='JSON whose "stop_ids" also end generation (its chat template applies when preparing)')
    if script == "ppo":
        group.add_argument("--no_neural_reward_model", action="store_true",
                           help="no reward model: the rewards come from --reward_fn alone (--rm_pretrain then starts "
                                "the critic, as in ColossalChat)")
    for flag, scripts in REFUSED.items():
        if script in scripts:
            group.add_argument(flag, action=_Refuse, instead=scripts[script])
    add_post_parse(parser, translate)


def translate(args: argparse.Namespace) -> None:
    """ColossalChat's flags as coati's settings; a value coati cannot honour raises `CoatiUsageError`."""
    if args.lora_config:
        _apply_lora_config(args, Path(args.lora_config))
    if getattr(args, "save_path", None):
        args.save_dir = args.save_dir or args.save_path
    if args.enable_sequence_parallelism:
        if args.plugin != "3d":
            raise CoatiUsageError("--enable_sequence_parallelism needs --plugin 3d")
        args.sp_mode = args.sp_mode or "split_gather"
    if getattr(args, "ref_tp", None) not in (None, args.tp):
        raise CoatiUsageError(f"--ref_tp {args.ref_tp}: coati shards the reference model like the policy; "
                              f"use --tp (now {args.tp}) for both")
    if getattr(args, "model_type", None):
        warn_user("--model_type is read and not used (as in ColossalChat)")
    if isinstance(getattr(args, "reward_fn", None), list):
        args.reward_fn = _reward_names(args.reward_fn)
    if getattr(args, "no_neural_reward_model", False):
        _no_neural_reward_model(args)
    if getattr(args, "conversation_template_config", None):
        args.extra_stop_ids = _stop_ids(Path(args.conversation_template_config))


def _no_neural_reward_model(args: argparse.Namespace) -> None:
    """No reward model: the rewards are --reward_fn's alone, and --rm_pretrain, as in ColossalChat, only starts the
    critic (unless --critic_pretrain does)."""
    if args.rm_checkpoint_path:
        raise CoatiUsageError("--no_neural_reward_model and --rm_checkpoint_path contradict each other; drop one")
    if not args.reward_fn:
        raise CoatiUsageError("--no_neural_reward_model: the rewards then come from --reward_fn (or "
                              "--reward_functions) alone; name at least one")
    if args.rm_pretrain:
        args.critic_pretrain = args.critic_pretrain or args.rm_pretrain
        args.rm_pretrain = None


def write_config_file(args: argparse.Namespace) -> None:
    """`--config_file`: the run's flags as JSON, as ColossalChat writes them (rank 0 only), secrets left out as
    from every log."""
    from coati.utils.comm import is_rank_0
    from coati.utils.metrics_logger import public_config

    if args.config_file and is_rank_0():
        path = Path(args.config_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in public_config(vars(args)).items() if _jsonable(v)}
        path.write_text(json.dumps(config, indent=2, sort_keys=True))


def attention_implementation(args: argparse.Namespace) -> Optional[str]:
    """`--use_flash_attn`: "flash_attention_2" where CUDA and the flash-attn package are there; otherwise one
    warning and None (transformers' default, PyTorch SDPA)."""
    if not args.use_flash_attn:
        return None
    import importlib.util

    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    warn_user("--use_flash_attn: FlashAttention-2 needs CUDA and the flash-attn package; using PyTorch's SDPA attention")
    return None


def _apply_lora_config(args: argparse.Namespace, path: Path) -> None:
    config = LoraConfig.from_file(str(path))
    args.lora_rank, args.lora_alpha, args.lora_dropout = config.r, config.lora_alpha, config.linear_lora_dropout
    args.lora_bias, args.lora_init = config.peft_bias, config.peft_init
    if config.target_modules is not None:
        args.lora_target_modules = list(config.target_modules)
    if config.embedding_lora_dropout:
        warn_user(f"--lora_config {path}: embedding_lora_dropout={config.embedding_lora_dropout} is not applied "
                  "(embedding adapters take no dropout, in peft as in ColossalChat)")


def _reward_names(specs: Sequence[str]) -> List[str]:
    names: List[str] = []
    for spec in specs:
        for name in COLOSSALCHAT_REWARDS.get(spec, [spec]):
            if name not in names:
                names.append(name)
    return names


def _stop_ids(path: Path) -> List[int]:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CoatiUsageError(f"--conversation_template_config {path}: {exc}") from None
    return [int(i) for i in config.get("stop_ids", [])]


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True
