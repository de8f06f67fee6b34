"""Every coati command, one function each: `coati <name>` (`coati.cli.main`) and the scripts in
`examples/training_scripts/train_<name>.py` and `examples/data_preparation_scripts/prepare_dataset.py` run these.

Each parses its flags (and `--config`'s file) before the training stack loads, so `--help` and a flag error answer at
once; its docstring's first line is its description in `coati --help` and in its own.
"""
import argparse
import contextlib
import contextvars
import io
import sys
from dataclasses import fields
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from coati.cli.arguments import run_config_from, run_config_parser
from coati.cli.colossalchat import add_colossalchat_flags
from coati.cli.preflight import check_paths, image_limits
from coati.cli.openrlhf_names import OPENRLHF_COMMANDS, add_openrlhf_names
from coati.cli.trl_names import add_trl_names
from coati.cli.verl_names import VERL_COMMANDS, add_verl_names
from coati.config import (COLOSSALCHAT_MARGIN, DEFAULT_BETA, PREPARE_MAX_LENGTH, TINY_VISION_STYLES,
                          DataSettings, PreferenceLossSettings, VisionSettings)
from coati.cli.options import CoatiArgumentParser, add_settings, errors_named_as_given
from coati.run_config import (RUN_CONFIGS, DPORunConfig, GRPORunConfig, KTORunConfig, ORPORunConfig, PPORunConfig,
                              PRMRunConfig, RMRunConfig, SFTRunConfig)
from coati.distributed.launch import LAUNCH
from coati.utils.errors import CoatiUsageError, exit_cleanly, note_user
from coati.utils.file_checks import check_writable_dir, resolve_model_dir
from coati.utils.ranges import at_least


def _summary(command: Callable[..., Any]) -> str:
    return (command.__doc__ or "").strip().splitlines()[0]


def _parser(command: Callable[..., Any], tree: type) -> argparse.ArgumentParser:
    """A training command's parser, from its run config `tree`; `_finish` adds ColossalChat's and TRL's names."""
    return run_config_parser(tree, _summary(command))


DATA_TYPES = {"sft": "sft", "rm": "preference", "dpo": "preference", "orpo": "preference", "kto": "kto",
              "prm": "prm", "ppo": "prompt", "grpo": "prompt"}
"""The kind of rows each training command reads (raw data given to it is prepared as that)."""


class _FlagsChecked(BaseException):
    """Ends a command run by `check_flags` once its flags are parsed and checked (a BaseException: `exit_cleanly`
    lets it through)."""


class _ParserBuilt(BaseException):
    """Ends a command run by `command_parser` once its parser is built, carrying it."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


_MODE = contextvars.ContextVar("coati_command_mode", default="run")
"""How far a command goes: `run`; `check` (`check_flags`: parse and check the paths); `parser` (`command_parser`)."""


def check_flags(name: str, argv: List[str], launch: Tuple[int, int] = (1, 1)) -> None:
    """Parse training command `name`'s flags and run its path checks and its memory check for the `launch` (world
    size, processes on this node), as its run would, printing nothing unless they fail (then one line and exit 2):
    `coati --nproc_per_node N` does this before it starts any process, so a wrong flag is answered once, not on every
    rank under torchrun's report."""
    token, said, launching = _MODE.set("check"), io.StringIO(), LAUNCH.set(launch)
    try:
        with contextlib.redirect_stderr(said):
            TRAINING[name](argv)
    except _FlagsChecked:
        pass   # the notes and warnings of a good parse are the run's to print
    except BaseException:
        sys.stderr.write(said.getvalue())
        raise
    finally:
        _MODE.reset(token)
        LAUNCH.reset(launching)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of command `name` as its run builds it (with ColossalChat's and TRL's names), for the reference."""
    token = _MODE.set("parser")
    try:
        COMMANDS[name]([])
    except _ParserBuilt as built:
        return built.parser
    finally:
        _MODE.reset(token)
    raise RuntimeError(f"coati {name} built no parser")


def _parse(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, unless `command_parser` only wants the parser."""
    if _MODE.get() == "parser":
        raise _ParserBuilt(parser)
    return parser.parse_args(argv)


def _finish(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> argparse.Namespace:
    """The command's flags parsed (ColossalChat's and TRL's names added), their paths checked, and its run config
    built and validated, as `args._run_config`."""
    script = parser.run_config.command
    parser.set_defaults(data_type=DATA_TYPES[script])
    add_colossalchat_flags(parser, script)
    if script in VERL_COMMANDS:
        add_verl_names(parser)
    if script in OPENRLHF_COMMANDS:
        add_openrlhf_names(parser, script)
    add_trl_names(parser, script)
    args = _parse(parser, argv)
    with errors_named_as_given(args):
        check_paths(args)
        args._run_config = run_config_from(args, parser.run_config)
    if _MODE.get() == "check":
        _check_plugin(args.plugin)
        from coati.distributed.memory import check_run_memory

        check_run_memory(args._run_config, launch=LAUNCH.get())
        raise _FlagsChecked
    return args


def _check_plugin(plugin: str) -> None:
    """Before a launch, the plugin can run on this machine (asks torch for CUDA): refused once here, not on each rank
    under torchrun's failure report."""
    from coati.distributed.plugins import check_plugin_available

    check_plugin_available(plugin)


@exit_cleanly
def sft(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """Supervised fine-tuning on chat data."""
    args = _finish(_parser(sft, SFTRunConfig), argv)
    from coati.cli.runner import run_supervised   # the training stack loads once the flags are read
    from coati.trainer.sft import SFTTrainer

    run_supervised(args, SFTTrainer, "sft", callbacks=callbacks)


@exit_cleanly
def rm(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """Reward-model training on preference pairs (LogSigLoss)."""
    args = _finish(_parser(rm, RMRunConfig), argv)
    from coati.cli.runner import load_reward_model_from_args, run_supervised
    from coati.models.loss import LogExpLoss, LogSigLoss
    from coati.trainer.rm import RewardModelTrainer

    loss_fn = {"log_sig": LogSigLoss, "log_exp": LogExpLoss}[args.loss_fn]
    run_supervised(args, RewardModelTrainer, "preference", model_loader=load_reward_model_from_args,
                   trainer_kwargs={"loss_fn": loss_fn(reduction="none"),
                                   "center_rewards_coefficient": args.center_rewards_coefficient}, callbacks=callbacks)


@exit_cleanly
def dpo(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """Direct preference optimisation on preference pairs: DPO, IPO or SimPO (--loss_type)."""
    args = _finish(_parser(dpo, DPORunConfig), argv)
    from coati.cli.runner import reference_hook, run_supervised
    from coati.trainer.dpo import DPOTrainer

    loss = preference_loss(args._run_config.loss, args.disable_reference_model, args.length_normalization)
    if args.precompute_ref_logps and not loss.needs_reference:
        note_user(f"--precompute_ref_logps: this loss ({args.loss_type}) uses no reference model, so there is "
                  "nothing to precompute")
    run_supervised(args, DPOTrainer, "preference", trainer_kwargs={"loss_fn": loss, "rpo_alpha": args.rpo_alpha},
                   setup_hook=reference_hook if loss.needs_reference else None, callbacks=callbacks)


def preference_loss(settings: PreferenceLossSettings, reference_free: bool = False,
                    length_normalization: bool = False) -> Any:
    """The loss `--loss_type` names, with `--beta`, `--gamma` and `--label_smoothing` (their defaults per loss);
    ColossalChat's `--disable_reference_model` and `--length_normalization` as the last two."""
    from coati.models.loss import DPOLoss, SimPOLoss

    beta = DEFAULT_BETA[settings.loss_type] if settings.beta is None else settings.beta
    if settings.loss_type == "simpo":
        return SimPOLoss(beta, 0.5 if settings.gamma is None else settings.gamma, settings.label_smoothing)
    colossalchat_simpo = settings.loss_type == "simpo_loss"
    margin = COLOSSALCHAT_MARGIN if colossalchat_simpo and settings.gamma is None else settings.gamma or 0.0
    return DPOLoss(beta, settings.label_smoothing, "ipo" if settings.loss_type == "ipo" else "sigmoid", margin,
                   reference_free=reference_free, length_normalization=length_normalization or colossalchat_simpo)


@exit_cleanly
def kto(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """KTO on (prompt, completion, desirable-or-not) rows against a frozen reference."""
    args = _finish(_parser(kto, KTORunConfig), argv)
    from coati.cli.runner import reference_hook, run_supervised
    from coati.models.loss import KTOLoss
    from coati.trainer.kto import KTOTrainer, balance_kto_weights

    settings = args._run_config.loss
    loss = KTOLoss(settings.beta, settings.desirable_weight, settings.undesirable_weight)

    def setup(context):
        if args.auto_weight:
            balance_kto_weights(loss, context.load_data(args.dataset)["desirable"])
        return reference_hook(context)

    run_supervised(args, KTOTrainer, "kto", trainer_kwargs={"loss_fn": loss}, setup_hook=setup, callbacks=callbacks)


@exit_cleanly
def orpo(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """ORPO on preference pairs: SFT on chosen plus an odds-ratio penalty, no reference model."""
    args = _finish(_parser(orpo, ORPORunConfig), argv)
    from coati.cli.runner import run_supervised
    from coati.models.loss import ORPOLoss
    from coati.trainer.dpo import ORPOTrainer

    run_supervised(args, ORPOTrainer, "preference", trainer_kwargs={"loss_fn": ORPOLoss(args._run_config.loss.lam)},
                   callbacks=callbacks)


@exit_cleanly
def prm(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """Process reward model training on step-labelled solutions (prepare --type prm)."""
    args = _finish(_parser(prm, PRMRunConfig), argv)
    from coati.cli.runner import load_prm_from_args, run_supervised
    from coati.trainer.prm import PRMTrainer

    run_supervised(args, PRMTrainer, "prm", model_loader=load_prm_from_args, callbacks=callbacks)


@exit_cleanly
def ppo(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """PPO with a trained reward model and/or verifiable reward functions on prompts."""
    args = _finish(_parser(ppo, PPORunConfig), argv)
    from coati.cli.rl_runner import run_ppo

    run_ppo(args, callbacks)


@exit_cleanly
def grpo(argv: Optional[List[str]] = None, callbacks: Sequence[Any] = ()) -> None:
    """GRPO with verifiable rewards on prompts (their ground-truth fields reach the reward)."""
    args = _finish(_parser(grpo, GRPORunConfig), argv)
    from coati.cli.rl_runner import run_grpo

    run_grpo(args, callbacks)


COLOSSALCHAT_BINS = 10
"""ColossalChat's default --num_spliced_dataset_bins."""


def comma_list(value: str) -> List[str]:
    """ColossalChat passes several inputs as one comma-separated value."""
    return [part for part in value.split(",") if part]


@exit_cleanly
def prepare(argv: Optional[List[str]] = None) -> None:
    """Validate and tokenize raw data (JSONL files, folders of them, dataset folders) into a prepared dataset."""
    parser = CoatiArgumentParser(description=_summary(prepare))
    parser.add_argument("--type", required=True, choices=("sft", "preference", "prompt", "kto", "prm"),
                        help="what the rows are (prm: steps with a label each, for train_prm.py)")
    parser.add_argument("--data_input_dirs", nargs="+", required=True, type=comma_list,
                        help="JSONL files, folders of them, or local dataset folders that datasets.load_dataset reads "
                             "(several: space- or comma-separated)")
    parser.add_argument("--tokenizer_dir", required=True, help="tokenizer (with its chat template): a folder or a Hugging Face model id")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--data_output_dirs", help="where the prepared dataset is saved: one folder")
    output.add_argument("--data_arrow_output_dir", help="ColossalChat's layout: one dataset folder per part, "
                        "part-00000, part-00001, ... (train on the folder, or on the parts one by one)")
    parser.add_argument("--max_length", type=at_least(1), default=PREPARE_MAX_LENGTH,
                        help="tokens per sequence; longer conversations are cut from the right, longer prompts "
                             "(--type prompt) from the left, keeping their end")
    parser.add_argument("--conversation_template_config", default=None,
                        help='ColossalChat\'s template JSON: "chat_template" (else the tokenizer\'s own), "system_message" '
                             '(opens each conversation without a system turn) and "end_of_turn_token"')
    parser.add_argument("--skip_invalid", action="store_true", help="skip and count invalid rows instead of stopping")
    parser.add_argument("--trust_remote_code", action="store_true", help="allow custom tokenizer code")
    parser.add_argument("--data_cache_dir", default=None, help="cache of datasets.load_dataset for dataset-folder inputs")
    parser.add_argument("--dataset_config", default=None,
                        help="the configuration (subset) of the dataset-folder inputs to read, datasets.load_dataset's "
                             "name (e.g. main for openai/gsm8k)")
    parser.add_argument("--num_spliced_dataset_bins", type=at_least(1), default=None,
                        help="parts the rows are split into, as ColossalChat splits them (default: 10 with "
                             "--data_arrow_output_dir, 1 with --data_output_dirs, where each part is an arrow file)")
    parser.add_argument("--data_jsonl_output_dir", default=None,
                        help="also write each part as part-NNNNN.jsonl here, with its text decoded (ColossalChat's check)")
    parser.add_argument("--num_samples_per_datafile", type=at_least(-1), default=-1,
                        help="keep at most this many rows of each part, sampled with a fixed seed (-1 or 0: all)")
    add_settings(parser, DataSettings, "Data",
                 skip=[f.name for f in fields(DataSettings) if f.name != "dataset_columns"])
    add_settings(parser, VisionSettings, skip=("freeze_vision_tower", "freeze_multi_modal_projector"))
    args = _parse(parser, argv)
    out_dir = args.data_output_dirs or args.data_arrow_output_dir
    check_writable_dir(out_dir, "--data_arrow_output_dir" if args.data_arrow_output_dir else "--data_output_dirs")
    if args.data_jsonl_output_dir:
        check_writable_dir(args.data_jsonl_output_dir, "--data_jsonl_output_dir")
    args.tokenizer_dir = resolve_model_dir(args.tokenizer_dir, "--tokenizer_dir")
    from coati.dataset.prepare import DataPart, OutputLayout, prepare_dataset, truncation_summary   # tokenizers, datasets: once flags are checked
    from coati.dataset.tokenization import load_tokenizer, template_system_message
    from coati.dataset.vision import ImageProcessing

    tokenizer = load_tokenizer(args.tokenizer_dir, args.trust_remote_code, args.conversation_template_config)
    images = ImageProcessing.load(args.tokenizer_dir, tokenizer, image_limits(args), args.trust_remote_code)
    if not tokenizer.chat_template:
        raise CoatiUsageError(f"the tokenizer in {args.tokenizer_dir} has no chat template; pass --conversation_template_config")
    part_folders = args.data_arrow_output_dir is not None
    bins = args.num_spliced_dataset_bins or (COLOSSALCHAT_BINS if part_folders else 1)
    layout = OutputLayout(bins, part_folders, args.data_jsonl_output_dir, max(args.num_samples_per_datafile, 0))
    counts = prepare_dataset([p for group in args.data_input_dirs for p in group], args.type, tokenizer,
                             args.max_length, out_dir, skip_invalid=args.skip_invalid, layout=layout,
                             system_message=template_system_message(args.conversation_template_config), images=images,
                             part=DataPart(subset=args.dataset_config, cache_dir=args.data_cache_dir,
                                           columns=tuple(dict(args.dataset_columns).items())))
    sampled = f", {counts['unsampled']} left out by --num_samples_per_datafile" if counts["unsampled"] else ""
    print(f"prepared {args.type} dataset in {out_dir}: {counts['kept']} of {counts['rows']} valid rows kept, "
          f"{truncation_summary(counts, args.max_length)}{sampled}, {counts['skipped']} invalid rows skipped")


@exit_cleanly
def tiny_model(argv: Optional[List[str]] = None) -> None:
    """A tiny random Llama and its tokenizer, to try coati on without downloading a model."""
    parser = CoatiArgumentParser(description=_summary(tiny_model))
    parser.add_argument("out", help="the folder to write the model and tokenizer to")
    parser.add_argument("--size", default="tiny", choices=("tiny", "small", "base", "100m"), help="the model's shape")
    parser.add_argument("--vision", default=None, choices=TINY_VISION_STYLES,
                        help="a tiny vision-language model of this architecture instead (its processor beside it; "
                             "tiny size only)")
    args = _parse(parser, argv)
    check_writable_dir(args.out, "OUT")
    if args.vision and args.size != "tiny":
        raise CoatiUsageError(f"--vision {args.vision}: vision-language models are built at --size tiny only")
    from coati.dataset.demo_data import tokenizer_corpus
    from coati.models.tiny import write_tiny_model, write_tiny_vl_model

    if args.vision:
        print(f"wrote a tiny random {args.vision} vision-language model and its processor to "
              f"{write_tiny_vl_model(args.out, tokenizer_corpus(), args.vision)}")
        return
    print(f"wrote a {args.size} random Llama and its tokenizer (trained on arithmetic problems) to "
          f"{write_tiny_model(args.out, tokenizer_corpus(), args.size)}")


def run(config: Any, callbacks: Sequence[Any] = ()) -> None:
    """Train as the run config `config` says (a tree of `coati.run_config` built in Python, e.g.
    `GRPORunConfig(model=ModelSettings(pretrain=...), ...)`): its settings go to its command as flags, so it is
    checked, run and saved exactly as that command's flags would be. `callbacks` (`coati.trainer.Callback`s of
    yours) are fired by the trainer beside its own."""
    if type(config) not in RUN_CONFIGS.values():
        names = ", ".join(tree.__name__ for tree in RUN_CONFIGS.values())
        raise TypeError(f"coati.cli.commands.run takes a run config ({names}), not {type(config).__name__}")
    from coati.cli.config_file import tree_argv

    TRAINING[config.command](tree_argv(command_parser(config.command), config), callbacks)


TRAINING: Dict[str, Callable[[Optional[List[str]]], None]] = {
    "sft": sft, "rm": rm, "dpo": dpo, "kto": kto, "orpo": orpo, "prm": prm, "ppo": ppo, "grpo": grpo}
"""The training commands by name (each launched under torchrun by `coati <name> --nproc_per_node N`)."""
COMMANDS: Dict[str, Callable[[Optional[List[str]]], None]] = {"prepare": prepare, **TRAINING, "tiny-model": tiny_model}
"""Every command of `coati`, in the order `coati --help` lists them."""
