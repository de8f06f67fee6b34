"""TRL's and Hugging Face's names for coati's settings, with TRL's meaning, as flags and config-file keys.

Names that mean what coati's setting means are declared as that setting's aliases in `coati.config`
(`--model_name_or_path` is `--pretrain`, `--learning_rate` is `--lr`, ...). The names here count or spell things
differently, and are converted after parsing:

- On-policy runs count optimizer steps where TRL does: `per_device_train_batch_size` is completions per rank in a
  learning micro-batch (coati's `--train_batch_size`; `--batch_size`, prompts per rank, becomes it times
  `gradient_accumulation_steps` over `num_generations`, which must divide), and `max_steps`, `logging_steps`,
  `save_steps` and `eval_steps` count optimizer steps (coati's `--num_episodes`, `--log_interval`,
  `--save_interval`, `--eval_interval` count episodes: the count is divided by the optimizer steps of an episode).
- Switches TRL writes as booleans: `bf16`/`fp16` (`--mixed_precision`), `use_peft` (LoRA, rank 16 unless `lora_r`
  says), `use_vllm` (`--rollout_backend vllm`), `scale_rewards` (false/none: `--no_std_normalize`).
- `loss_type` (GRPO's aggregation: grpo, bnpo, dr_grpo, dapo), `epsilon` (both clip bounds unless `epsilon_high`),
  `reward_weights` (one per reward function), `resume_from_checkpoint` (a path, or true: the latest).
"""
import argparse
import math
from pathlib import Path
from typing import Any, Dict, List

from coati.cli.arguments import optimizer_steps_per_episode
from coati.cli.options import add_post_parse
from coati.cli.trl_keys import truthy
from coati.config import DEFAULT_BETA, TRL_SFT_LOSS
from coati.utils.ranges import at_least
from coati.utils.errors import CoatiUsageError, note_user

ON_POLICY = ("ppo", "grpo")
GRPO_LOSS_TYPES = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm",
                   "dapo": "token-mean", "cispo": "token-mean", "sapo": "seq-mean-token-mean"}
"""TRL's GRPO `loss_type` -> coati's `--loss_agg` (bnpo, dapo and cispo average over the batch's tokens; sapo over
each completion's, as grpo)."""
GRPO_LOSS_POLICIES = {"cispo": "cispo", "sapo": "sapo"}
"""TRL's GRPO `loss_type`s that are a policy loss of their own -> coati's `--policy_loss`."""
SAPO_TEMPERATURES = ("sapo_temperature_pos", "sapo_temperature_neg")
"""TRL's SAPO temperatures, coati's `--policy_loss_option temperature_pos=... temperature_neg=...` for sapo."""
TRL_SFT_MAX_LENGTH = 1024
"""TRL's SFT `max_length` default, the length of a packed sequence where no max_length is given."""
TRL_LORA_RANK = 16
"""TRL's `lora_r` default, the rank `use_peft` trains with when no rank is given."""
STRATEGIES = ("no", "steps", "epoch")
"""TRL's `eval_strategy` and `save_strategy` values coati takes."""
TRL_SAVE_STEPS = 500
"""TRL's `save_steps` default, what `save_strategy: steps` saves at when `save_steps` is not given."""
CHECKPOINTS_FOLDER = "checkpoints"
"""Where TRL's save names put checkpoints without --save_dir: OUTPUT_DIR/checkpoints."""
HELD_OUT = {"eval_dataset": None, "eval_split": 0.0, "dataset_test_split": None}
"""The settings that give a run held-out data, by their value for none."""
TRL_SAVE_NAMES = ("save_steps", "save_strategy")
"""TRL's names that ask for checkpoints (in OUTPUT_DIR/checkpoints unless --save_dir says)."""
STEP_COUNTS = {"max_steps": "num_episodes", "logging_steps": "log_interval", "save_steps": "save_interval",
               "eval_steps": "eval_interval"}
"""On-policy: TRL's counts of optimizer steps -> coati's settings that count episodes."""


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return number


def _step_count(value: str) -> int:
    """TRL's `save_steps`/`eval_steps`: optimizer steps, a whole number; TRL's fraction of the run is refused saying
    so."""
    try:
        fraction = 0 < float(value) < 1
    except ValueError:
        fraction = False
    if fraction:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value} (TRL's fraction of the run, a "
                                         "number below 1, is not taken: give optimizer steps)")
    return _positive_int(value)


def _refusal(name: str, instead: str) -> Any:
    """An argparse `type` that refuses TRL's `name`, saying what to give instead."""
    def refuse(value: str) -> Any:
        raise argparse.ArgumentTypeError(f"{name} is not taken: {instead}")

    return refuse


def _grpo_loss_type(value: str) -> str:
    """TRL's GRPO `loss_type`: one of `GRPO_LOSS_TYPES`; TRL's luspo and vespo are refused by name."""
    if value in ("luspo", "vespo"):
        raise argparse.ArgumentTypeError(f"{value} is not built here: give one of {', '.join(GRPO_LOSS_TYPES)}, or "
                                         "--policy_loss (ppo, gspo, cispo, sapo)")
    if value not in GRPO_LOSS_TYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(GRPO_LOSS_TYPES)}, got {value!r}")
    return value


def _steps_or_unlimited(value: str) -> int:
    """TRL's `max_steps`: a count >= 1, or -1 for no limit of its own."""
    return -1 if value.strip() == "-1" else _positive_int(value)


def add_trl_names(parser: argparse.ArgumentParser, script: str) -> None:
    """The converted TRL names for `script` (sft, rm, dpo, kto, orpo, prm, ppo, grpo), and their conversion after
    parsing (`CoatiArgumentParser.post_parse`)."""
    group = parser.add_argument_group("TRL's names with TRL's meaning (converted to coati's settings; see "
                                      "coati.cli.trl_names)")

    def add(flag: str, help: str, *aliases: str, **kwargs: Any) -> None:
        group.add_argument(flag, *aliases, dest=f"trl_{flag[2:]}", default=argparse.SUPPRESS, help=help, **kwargs)

    switch = dict(nargs="?", const=True, type=truthy, metavar="BOOL")
    add("--bf16", "true: --mixed_precision bf16; false: fp32 (unless --fp16)", **switch)
    add("--fp16", "true: --mixed_precision fp16", **switch)
    add("--use_peft", f"LoRA adapters (rank --lora_r, {TRL_LORA_RANK} unless given)", **switch)
    add("--resume_from_checkpoint", "a checkpoint folder, or true: the newest complete one in --save_dir "
                                    "(--checkpoint_path)")
    if script in ON_POLICY:
        add("--per_device_train_batch_size", "completions per rank in a learning micro-batch (TRL's count): sets "
            "--train_batch_size, and --batch_size (prompts per rank) to it x --gradient_accumulation_steps / "
            "--num_generations", type=_positive_int)
        add("--max_steps", "optimizer steps of the run (sets --num_episodes; TRL's -1: --num_train_epochs, else "
                           "--num_episodes, decides)",
            type=_steps_or_unlimited)
        add("--save_steps", "save every N optimizer steps (sets --save_interval)", type=_step_count)
        add("--eval_steps", "evaluate every N optimizer steps (sets --eval_interval)", type=_step_count)
        add("--use_vllm", "--rollout_backend vllm", **switch)
        add("--epsilon", "both clip bounds, --clip_eps_low and (unless --epsilon_high) --clip_eps_high", type=float)
        add("--reward_weights", "one weight per --reward_funcs entry", nargs="+", type=float)
        add("--max_prompt_length", "longest prompt in tokens; longer ones are cut (--max_length)", type=_positive_int)
        add("--log_completions", "true: a table of prompts and completions every logging step (--sample_log_interval "
                                 "--logging_steps); false: none", **switch)
        add("--steps_per_generation", "micro-steps of --per_device_train_batch_size completions each generation "
                                      "makes (TRL's default: --gradient_accumulation_steps)", type=_positive_int)
        if script == "grpo":
            add("--loss_type", f"GRPO's loss: {', '.join(GRPO_LOSS_TYPES)} (--loss_agg; cispo and sapo also "
                "--policy_loss; cispo's cap is --epsilon_high, coati's 1 + --clip_eps_high)",
                type=_grpo_loss_type)
            add("--sapo_temperature_pos", "sapo's temperature where the advantage is positive (--policy_loss_option "
                                          "temperature_pos=...)", type=float)
            add("--sapo_temperature_neg", "sapo's temperature elsewhere (--policy_loss_option temperature_neg=...)",
                type=float)
            add("--importance_sampling_level", "token: a ratio per token (GRPO's); sequence: one per completion "
                                               "(GSPO, --policy_loss gspo)", choices=("token", "sequence"))
            add("--scale_rewards", "true/group: divide advantages by the group std; false/none: do not "
                                   "(--no_std_normalize)", type=str, metavar="{true,false,group,none}")
            add("--max_tool_calling_iterations", "tool-calling rounds per episode at most: --max_turns is it + 1 (the "
                                                 "model's last turn answers; 0: no tool calls)", type=at_least(0))
    else:
        add("--per_device_train_batch_size", "rows per rank in a micro-batch (--batch_size)", type=_positive_int)
        for name in ("max_prompt_length", "max_completion_length"):
            add(f"--{name}", "not taken: coati keeps each prompt whole and cuts a row to --max_length tokens from the "
                             "right (a row with nothing of its response left is dropped)",
                type=_refusal(name, "coati keeps each prompt whole and cuts a row to --max_length tokens from the right "
                                    "(a row with nothing of its response left is dropped); give --max_length"))
        add("--save_steps", "save every N optimizer steps (--save_interval)", type=_step_count)
        add("--padding_free", "true: --packing (each micro-batch's rows in one sequence, no padding; attention stays "
                              "within each row)", **switch)
        add("--truncation_mode", "keep_start: coati's way, a row cut to --max_length from the right; keep_end is "
                                 "refused (coati keeps each prompt whole)", choices=("keep_start", "keep_end"))
        add("--eval_steps", "evaluate every N optimizer steps as well as after each epoch (--eval_interval)",
            type=_step_count)
    if script == "dpo":
        add("--loss_weights", "TRL's weight of each --loss_type: with [LOSS, sft], sft's is --rpo_alpha (LOSS's must "
                              "be 1)", nargs="+", type=float)
    if script == "sft":
        for name in ("assistant_only_loss", "completion_only_loss"):
            add(f"--{name}", "true: the loss on the assistant's (the completion's) tokens only, coati's default; "
                             "false: on every token (--disable_loss_mask)", **switch)
    add("--eval_strategy", "no: no held-out evaluation; steps: every --eval_steps optimizer steps (default: "
        "--logging_steps); epoch: as each pass over the data ends", "--evaluation_strategy", choices=STRATEGIES)
    add("--save_strategy", "no: no checkpoints; steps: every --save_steps optimizer steps (default 500, TRL's); epoch: as "
        "each pass over the data ends. Checkpoints go to --save_dir, default OUTPUT_DIR/checkpoints", choices=STRATEGIES)
    add_post_parse(parser, lambda args: convert(args, parser, script))


def convert(args: argparse.Namespace, parser: argparse.ArgumentParser, script: str) -> None:
    """Turn the TRL names given into coati's settings; a combination coati cannot honour raises `CoatiUsageError`.
    What each name set is kept in `parser.derived` (destination -> the TRL name), for the run's record."""
    trl = {name[4:]: value for name, value in vars(args).items() if name.startswith("trl_")}
    for name in trl:
        delattr(args, f"trl_{name}")
    if trl.get("save_strategy") == "steps":
        trl.setdefault("save_steps", TRL_SAVE_STEPS)
    if trl.get("max_steps") == -1:   # TRL's "no limit": the run's length is coati's setting
        del trl["max_steps"]
    if getattr(args, "max_steps", 0) == -1:
        args.max_steps = 0
    run = _Conversion(args, getattr(parser, "given", {}), trl, getattr(parser, "on_command_line", {}))
    run.precision()
    if trl.get("use_peft") and not args.lora_rank:
        run.set("lora_rank", TRL_LORA_RANK, "use_peft")
    if "resume_from_checkpoint" in trl:
        value = trl["resume_from_checkpoint"]
        run.set("checkpoint_path", {"true": "latest", "false": None}.get(value.lower(), value), "resume_from_checkpoint")
    for name in ("assistant_only_loss", "completion_only_loss"):
        if trl.get(name) is False:
            run.set("disable_loss_mask", True, name)
    if script == "dpo":
        run.preference_losses()
    if script in ON_POLICY:
        run.on_policy(script)
    else:
        for name, dest in (("per_device_train_batch_size", "batch_size"), ("save_steps", "save_interval"),
                           ("eval_steps", "eval_interval")):
            if name in trl:
                run.set(dest, trl[name], name, exclusive=True)
        if trl.get("padding_free"):
            run.set("packing", True, "padding_free")
        if script == "sft" and "per_device_train_batch_size" in trl:
            run.sft_packing(trl["per_device_train_batch_size"])
        if trl.get("truncation_mode") == "keep_end":
            raise CoatiUsageError("--truncation_mode keep_end is not taken: coati keeps each prompt whole and cuts a "
                                  "row to --max_length tokens from the right (keep_start)")
    run.strategies(script)
    parser.derived = run.derived


class _Conversion:
    """The TRL names given (`trl`, by name) turned into `args`' settings; `given` holds the flags that set settings
    directly (destination -> flag), which a TRL name for the same setting may not contradict, and `on_command_line`
    those of them given on the command line rather than in the config file."""

    def __init__(self, args: argparse.Namespace, given: Dict[str, str], trl: Dict[str, Any],
                 on_command_line: Dict[str, str]) -> None:
        self.args, self.given, self.trl, self.on_command_line = args, given, trl, on_command_line
        self.derived: Dict[str, str] = {}

    def set(self, dest: str, value: Any, name: str, exclusive: bool = False) -> None:
        """`args.<dest> = value`, set by the TRL name `name`; with `exclusive`, refused where a flag set `dest` too."""
        if exclusive and dest in self.given:
            raise CoatiUsageError(f"{self.given[dest]} and --{name} set the same thing; give one")
        setattr(self.args, dest, value)
        self.derived[dest] = name

    def precision(self) -> None:
        trl = self.trl
        if trl.get("bf16") and trl.get("fp16"):
            raise CoatiUsageError("--bf16 and --fp16: choose one precision")
        if trl.get("fp16"):
            self.set("mixed_precision", "fp16", "fp16")
        elif "bf16" in trl:
            self.set("mixed_precision", "bf16" if trl["bf16"] else "fp32", "bf16")

    def on_policy(self, script: str) -> None:
        trl = self.trl
        self.run_length()
        if trl.get("use_vllm"):
            self.set("rollout_backend", "vllm", "use_vllm")
        if "epsilon" in trl:
            self.set("clip_eps_low", trl["epsilon"], "epsilon")
            if "clip_eps_high" not in self.given:
                self.set("clip_eps_high", trl["epsilon"], "epsilon")
        if "reward_weights" in trl:
            self.set("reward_fn", _weighted(self.args.reward_fn, trl["reward_weights"]), "reward_weights")
        if "max_prompt_length" in trl:
            self.set("max_length", trl["max_prompt_length"], "max_prompt_length", exclusive=True)
        if script == "grpo":
            self.grpo_loss()
        if script == "grpo" and "scale_rewards" in trl:
            self.set("no_std_normalize", _no_std_normalize(trl["scale_rewards"]), "scale_rewards")
        if "max_tool_calling_iterations" in trl:
            self.set("max_turns", trl["max_tool_calling_iterations"] + 1, "max_tool_calling_iterations",
                     exclusive=True)
        if "per_device_train_batch_size" in trl or "steps_per_generation" in trl:
            self.completions_per_device()
        if self.given.get("log_interval") == "--logging_steps" or any(name in trl for name in STEP_COUNTS):
            self.step_counts()
        if "log_completions" in trl:
            self.set("sample_log_interval", self.args.log_interval if trl["log_completions"] else 0, "log_completions",
                     exclusive=True)

    def run_length(self) -> None:
        """TRL's `max_steps` decides the length over `num_train_epochs` (`--num_epochs`), as in TRL; of coati's
        `--num_episodes` and `--num_epochs`, one on the command line overrides the other in the file (a saved config
        records the episodes), and both in one place are refused."""
        if not self.args.num_epochs:
            return
        flags = self.on_command_line
        if "max_steps" in self.trl or ("num_episodes" in flags and "num_epochs" not in flags):
            self.set("num_epochs", 0.0, "max_steps" if "max_steps" in self.trl else "num_episodes")
        elif "num_episodes" in self.given and ("num_episodes" in flags) == ("num_epochs" in flags):
            raise CoatiUsageError(f"{self.given['num_episodes']} and {self.given['num_epochs']} both set the run's "
                                  "length; give one")

    def preference_losses(self) -> None:
        """TRL 1.16's DPO `loss_type` list with its `loss_weights` -> coati's one `--loss_type`, and TRL's `sft` term
        (the chosen response's NLL, RPO) as `--rpo_alpha`, its weight; the preference loss's weight must be 1."""
        args = self.args
        losses = list(args.loss_type) if isinstance(args.loss_type, (list, tuple)) else [args.loss_type]
        weights = self.trl.get("loss_weights") or [1.0] * len(losses)
        if len(weights) != len(losses):
            raise CoatiUsageError(f"--loss_weights: {len(weights)} weights for {len(losses)} loss types "
                                  f"({' '.join(losses)}); give one each")
        preference = [(loss, weight) for loss, weight in zip(losses, weights) if loss != TRL_SFT_LOSS]
        if len(preference) != 1:
            raise CoatiUsageError(f"--loss_type {' '.join(losses)}: coati's DPO trains one preference loss, with TRL's "
                                  f"sft beside it as --rpo_alpha; give one of {', '.join(DEFAULT_BETA)}")
        (loss, weight), = preference
        if weight != 1:
            raise CoatiUsageError(f"--loss_weights: {loss}'s weight is {weight:g}; coati's is 1 (scale --lr instead, "
                                  "and sft's weight is --rpo_alpha)")
        args.loss_type = loss
        sft = [weight for name, weight in zip(losses, weights) if name == TRL_SFT_LOSS]
        if sft:
            self.set("rpo_alpha", sum(sft), "loss_type", exclusive=True)

    def sft_packing(self, sequences: int) -> None:
        """TRL's SFT `packing` with `per_device_train_batch_size`: that many sequences of `max_length` tokens (TRL's
        default 1024), each packed with rows, per micro-batch -> coati's micro-batches of rows up to that many
        tokens (`--max_tokens_per_batch`), packed."""
        args = self.args
        if self.given.get("packing") and args.packing and "max_tokens_per_batch" not in self.given:
            self.set("max_tokens_per_batch", sequences * (args.max_length or TRL_SFT_MAX_LENGTH), "packing")

    def completions_per_device(self) -> None:
        """TRL's completions per device per micro-step (`per_device_train_batch_size`) and micro-steps per generation
        (`steps_per_generation`, by default `gradient_accumulation_steps`) -> coati's prompts per rank
        (`--batch_size`) and learning micro-batch (`--train_batch_size`)."""
        args, trl = self.args, self.trl
        completions = trl.get("per_device_train_batch_size", args.train_batch_size)
        steps = trl.get("steps_per_generation", args.accumulation_steps)
        name = "per_device_train_batch_size" if "per_device_train_batch_size" in trl else "steps_per_generation"
        steps_flag = "--steps_per_generation" if "steps_per_generation" in trl else "--gradient_accumulation_steps"
        generated = completions * steps
        if generated % args.num_generations:
            raise CoatiUsageError(
                f"--per_device_train_batch_size {completions} x {steps_flag} {steps} = {generated} completions per "
                f"rank is not a whole number of prompts of --num_generations {args.num_generations}; make it a "
                "multiple")
        self.set("batch_size", generated // args.num_generations, name, exclusive=True)
        self.set("train_batch_size", completions, name, exclusive="per_device_train_batch_size" in trl)

    def grpo_loss(self) -> None:
        """TRL's GRPO `loss_type` (an aggregation, and for cispo and sapo a policy loss), its SAPO temperatures and
        `importance_sampling_level`; with cispo, TRL's `epsilon_high` is the weight's cap, coati's 1 +
        --clip_eps_high."""
        trl, args = self.trl, self.args
        loss_type = trl.get("loss_type")
        if loss_type is not None:
            self.set("loss_agg", GRPO_LOSS_TYPES[loss_type], "loss_type", exclusive=True)
        policies = []
        if loss_type in GRPO_LOSS_POLICIES:
            policies.append((GRPO_LOSS_POLICIES[loss_type], "loss_type"))
        if trl.get("importance_sampling_level") == "sequence":
            policies.append(("gspo", "importance_sampling_level"))
        if len(policies) > 1:
            raise CoatiUsageError(f"--loss_type {loss_type} and --importance_sampling_level sequence (GSPO) are two "
                                  "policy losses; choose one")
        for policy, name in policies:
            self.set("policy_loss", policy, name, exclusive=True)
        if loss_type == "cispo" and self.given.get("clip_eps_high") != "--epsilon_high":
            note_user(f"--loss_type cispo without --epsilon_high: TRL caps the importance weight at epsilon, coati at "
                      f"1 + --clip_eps_high ({1 + args.clip_eps_high:g}); give --epsilon_high, the cap (ScaleRL's 5.0)")
        elif loss_type == "cispo":
            if args.clip_eps_high <= 1:
                raise CoatiUsageError(f"--loss_type cispo: --epsilon_high {args.clip_eps_high:g} is CISPO's cap on "
                                      "the importance weight, and must be above 1 (ScaleRL's 5.0)")
            self.set("clip_eps_high", args.clip_eps_high - 1, "epsilon_high")
        temperatures = {name[5:]: trl[name] for name in SAPO_TEMPERATURES if name in trl}
        if temperatures and args.policy_loss == "sapo":
            given = list(getattr(args, "policy_loss_option", None) or [])
            self.set("policy_loss_option", [*given, *temperatures.items()], f"sapo_{next(iter(temperatures))}")

    def step_counts(self) -> None:
        """TRL's counts of optimizer steps -> coati's counts of episodes, which must come out whole."""
        per_episode = optimizer_steps_per_episode(self.args)
        counts = dict(self.trl)
        if self.given.get("log_interval") == "--logging_steps":
            counts["logging_steps"] = self.args.log_interval
        for name, dest in STEP_COUNTS.items():
            if name not in counts:
                continue
            steps = counts[name]
            if steps % per_episode and name == "logging_steps":   # logging less often changes nothing trained
                episodes = math.ceil(steps / per_episode)
                note_user(f"--logging_steps {steps}: an episode here makes {per_episode} optimizer steps, so the run "
                          f"logs every {episodes} episode{'s' if episodes > 1 else ''} ({episodes * per_episode} "
                          "optimizer steps)")
                self.set(dest, episodes, name)
                continue
            if steps % per_episode:
                raise CoatiUsageError(f"--{name} {steps} counts optimizer steps, and an episode here makes "
                                      f"{per_episode} of them: give a multiple of {per_episode}, or --{dest} in "
                                      "episodes")
            self.set(dest, steps // per_episode, name, exclusive=name != "logging_steps")


    def strategies(self, script: str) -> None:
        """TRL's `eval_strategy` and `save_strategy` (after the step counts are converted), and a checkpoint folder
        in the output folder where TRL's save names ask for checkpoints, or `resume_from_checkpoint` for the newest,
        and --save_dir is not given."""
        trl, args = self.trl, self.args
        evaluation = trl.get("eval_strategy")
        if evaluation == "no":
            for dest, off in (*HELD_OUT.items(), ("eval_interval", 0)):
                self.set(dest, off, "eval_strategy")
        elif evaluation and not any(getattr(args, name, None) for name in HELD_OUT):
            raise CoatiUsageError(f"--eval_strategy {evaluation} evaluates held-out data, and none is given: give "
                                  "eval_dataset, eval_split (a fraction of the training rows) or dataset_test_split")
        elif evaluation == "steps" and "eval_steps" not in trl:
            self.set("eval_interval", args.log_interval, "eval_strategy")
        elif evaluation == "epoch" and script in ON_POLICY:
            self.set("eval_freq_epochs", 1, "eval_strategy")
        saving = trl.get("save_strategy")
        if saving == "no":
            for dest, off in (("save_dir", None), ("save_interval", 0), ("save_freq_epochs", 0)):
                self.set(dest, off, "save_strategy")
            return
        if saving == "epoch":
            self.set("save_freq_epochs", 1, "save_strategy", exclusive=True)
        names = [name for name in (*TRL_SAVE_NAMES, "resume_from_checkpoint") if name in trl]
        if names and not args.save_dir and args.output_dir:   # TRL resumes from OUTPUT_DIR's checkpoints too
            self.set("save_dir", str(Path(args.output_dir) / CHECKPOINTS_FOLDER), names[0])


def _weighted(specs: Any, weights: List[float]) -> List[str]:
    """`reward_funcs` with TRL's `reward_weights`, one each, as coati's NAME=WEIGHT specs."""
    specs = list(specs or [])
    if len(specs) != len(weights):
        raise CoatiUsageError(f"--reward_weights: {len(weights)} weights for {len(specs)} reward functions "
                              f"({' '.join(specs) or 'none'}); give one weight per --reward_funcs entry")
    if any("=" in spec.rsplit(":", 1)[-1] for spec in specs):
        raise CoatiUsageError("--reward_weights with NAME=WEIGHT reward functions: weigh them one way")
    return [f"{spec}={weight:g}" for spec, weight in zip(specs, weights)]


def _no_std_normalize(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "group"):
        return False
    if lowered in ("false", "none"):
        return True
    raise CoatiUsageError(f"--scale_rewards {value}: coati scales by the group's std (true, group) or not (false, "
                          "none); batch scaling is --adv_estimator reinforce_pp")
