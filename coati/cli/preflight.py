"""Checks a training script runs on its parsed flags before it starts a process group or loads anything:
every path a flag names (models, tokenizer, data, output folders, the checkpoint to resume) is usable, or
the run stops with one line naming the flag. Every rank runs them, so all ranks stop together."""
import argparse
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse
from typing import TYPE_CHECKING, Dict, List, Optional

from coati.cli.trl_names import HELD_OUT, TRL_SAVE_NAMES
from coati.config import PREPARE_MAX_LENGTH
from coati.utils.errors import CoatiUsageError, note_user, warn_user
from coati.utils.file_checks import (check_data_dirs, check_data_exist, check_model_dir, check_writable_dir,
                                     resolve_dataset_id, resolve_model_dir)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from coati.dataset.vision import ImageLimits

MODEL_FLAGS = ("pretrain", "ref_pretrain", "rm_pretrain", "critic_pretrain")
DATA_FLAGS = ("dataset", "eval_dataset", "ptx_dataset")
OUTPUT_FLAGS = ("output_dir", "save_dir", "log_dir")


def resolve_model_flags(args: argparse.Namespace) -> None:
    """Replace Hugging Face model ids among the model and tokenizer flags by their local snapshot folders, and
    `--rm_pretrain` by the model of `--rm_checkpoint_path` when one is given."""
    for name in (*MODEL_FLAGS, "tokenizer_dir", "teacher_model", "prm_pretrain"):
        if getattr(args, name, None):
            setattr(args, name, resolve_model_dir(getattr(args, name), f"--{name}"))
    template = getattr(args, "chat_template", None)
    if template and not template.endswith(JINJA_SUFFIXES) and not Path(template).is_file():   # a tokenizer's
        args.chat_template = resolve_model_dir(template, "--chat_template")
    if getattr(args, "rm_checkpoint_path", None):
        args.rm_pretrain = checkpoint_model_dir(args.rm_checkpoint_path, "--rm_checkpoint_path")


JINJA_SUFFIXES = (".jinja", ".j2")
"""How a Jinja chat template file's name ends (never a Hugging Face id)."""


def check_chat_template(template: Optional[str]) -> None:
    """--chat_template names a readable file (its text is the template) or a folder holding a tokenizer."""
    if not template or Path(template).is_file() and os.access(template, os.R_OK):
        return
    folder = Path(template)
    if not folder.is_dir():
        raise CoatiUsageError(f"--chat_template {template}: neither a readable Jinja file nor a tokenizer folder")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise CoatiUsageError(f"--chat_template {template} is a folder with no tokenizer in it (no tokenizer.json or "
                              "tokenizer_config.json)")


def checkpoint_model_dir(path: str, flag: str) -> str:
    """The model folder of a training checkpoint: `path` itself (train_rm.py's save_dir/modeling), or the `modeling`
    folder inside it (a save_dir/epoch-E_step-S checkpoint)."""
    folder = Path(path)
    if not folder.is_dir():
        raise CoatiUsageError(f"{flag} {path} does not exist or is not a directory")
    for candidate in (folder / "modeling", folder):
        if (candidate / "config.json").is_file():
            return str(candidate)
    raise CoatiUsageError(f"{flag} {path} holds no model (no config.json in it or in its modeling folder); pass a "
                          "train_rm.py checkpoint folder (save_dir/epoch-E_step-S) or its final save_dir/modeling")


def check_paths(args: argparse.Namespace) -> Dict[str, dict]:
    """The path checks that need no training stack, run as soon as the flags are parsed (a wrong path is one line at
    once, before torch loads): model ids resolved (`resolve_model_flags`), every model folder usable, the data there,
    the output folders writable. Returns the model configs read, by flag name."""
    resolve_model_flags(args)
    configs = {}
    for name in MODEL_FLAGS:
        if getattr(args, name, None):
            configs[name] = check_model_dir(getattr(args, name), f"--{name}")
    tokenizer = getattr(args, "tokenizer_dir", None)
    if tokenizer and not Path(tokenizer).is_dir():
        raise CoatiUsageError(f"--tokenizer_dir {tokenizer} does not exist or is not a directory")
    check_chat_template(getattr(args, "chat_template", None))
    for name in DATA_FLAGS:
        if getattr(args, name, None):
            setattr(args, name, [resolve_dataset_id(path, _data_flag(args, name)) for path in getattr(args, name)])
        check_data_exist(getattr(args, name, None), _data_flag(args, name))
    for name in OUTPUT_FLAGS:
        if getattr(args, name, None):
            check_writable_dir(getattr(args, name), f"--{name}")
    for flag in ("save_interval", "save_freq_epochs", "save_freq_secs"):
        if getattr(args, flag, 0) and not getattr(args, "save_dir", None):
            trl_name = getattr(args, "_given_as", {}).get(flag, "").lstrip("-") in TRL_SAVE_NAMES
            raise CoatiUsageError(f"--{flag} needs --save_dir, the directory checkpoints are written to" +
                                  (", or output_dir (they then go to OUTPUT_DIR/checkpoints)" if trl_name else ""))
    check_held_out(args)
    check_wandb_login(args)
    return configs


OFFLINE_WANDB_MODES = ("offline", "disabled", "dryrun")


def check_wandb_login(args: argparse.Namespace) -> None:
    """A run that logs to W&B has its API key (WANDB_API_KEY, or `wandb login`'s ~/.netrc entry for the W&B host) or
    runs W&B offline: refused in one line before anything loads otherwise, where W&B would stop rank 0 at its start."""
    if not getattr(args, "use_wandb", False) or os.environ.get("WANDB_API_KEY") or \
            os.environ.get("WANDB_MODE", "").lower() in OFFLINE_WANDB_MODES:
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if netrc.netrc(os.environ.get("NETRC")).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):   # no ~/.netrc: no login
        pass
    raise CoatiUsageError(f"logging to W&B (--report_to wandb, verl's trainer.logger) needs an API key for {host}: "
                          "log in (`wandb login`, or WANDB_API_KEY), or set WANDB_MODE=offline to keep its files "
                          "local")


def check_run_paths(args: argparse.Namespace) -> Dict[str, dict]:
    """`check_paths`, then raw data prepared (`prepare_raw_data`) and every data folder checked to be a prepared
    dataset; returns the model configs read, by flag name."""
    configs = check_paths(args)
    prepare_raw_data(args)
    for name in DATA_FLAGS:
        check_data_dirs(getattr(args, name, None), _data_flag(args, name))
    return configs


def _data_flag(args: argparse.Namespace, name: str) -> str:
    """The flag the data setting `name` goes by in this script (on-policy scripts call `dataset` --prompt_dataset)."""
    return getattr(args, "dataset_flag", "--dataset") if name == "dataset" else f"--{name}"


RAW_DATA_FLAGS = {"dataset": None, "eval_dataset": None, "ptx_dataset": "sft"}
"""The data flags that may name raw data, and the type their data is prepared as (None: the command's)."""


def check_held_out(args: argparse.Namespace) -> None:
    """At most one source of held-out data: --eval_dataset, --eval_split or --dataset_test_split."""
    given = [f"--{name}" for name in HELD_OUT if getattr(args, name, None)]
    if len(given) > 1:
        raise CoatiUsageError(f"{' and '.join(given)}: give the held-out data one way (held-out data, a fraction of "
                              "the training rows, or a split of the training data's folder)")


def prepare_raw_data(args: argparse.Namespace) -> None:
    """Raw data among the data flags (a JSONL file, a folder of them, a local `datasets` folder) prepared on the fly
    into the cache (`coati.dataset.cache`), the flags then naming the prepared folders: --dataset's
    --dataset_train_split, and with --dataset_test_split that split as the held-out data; with --eval_split, that
    fraction of the training rows held out. Nothing is loaded when every folder is prepared."""
    from coati.dataset.cache import is_raw   # the coati.dataset package loads torch: only once paths are checked

    data_type = getattr(args, "data_type", None)
    raw = {name: [p for p in getattr(args, name, None) or () if is_raw(p)] for name in RAW_DATA_FLAGS}
    note_prepared_template(args, raw)
    split, test_split = getattr(args, "eval_split", 0.0), getattr(args, "dataset_test_split", None)
    if getattr(args, "dataset_columns", None) and args.dataset and not raw["dataset"] + raw["eval_dataset"]:
        raise CoatiUsageError(f"--dataset_columns renames raw data's columns as it is prepared; "
                              f"{_data_flag(args, 'dataset')} {args.dataset[0]} is prepared already: prepare its raw "
                              "data again with them")
    if data_type is None or not (any(raw.values()) or split or test_split):
        return
    if test_split and len(raw["dataset"]) < len(args.dataset):
        prepared_folder = next(p for p in args.dataset if p not in raw["dataset"])
        raise CoatiUsageError(f"--dataset_test_split {test_split} names a split of raw data; {_data_flag(args, 'dataset')} "
                              f"{prepared_folder} is prepared already: give its held-out data with --eval_dataset")
    from coati.dataset.cache import eval_split, prepared
    from coati.dataset.prepare import DataPart
    from coati.dataset.tokenization import splits_first_answer_token
    from coati.dataset.vision import ImageProcessing

    tokenizer_dir = args.tokenizer_dir or args.pretrain
    tokenizer = run_tokenizer(args) if any(raw.values()) else None
    if tokenizer is not None and getattr(args, "chat_template", None) and splits_first_answer_token(tokenizer):
        warn_user(f"--chat_template {args.chat_template}: its generation prompt ends inside the answer's first token "
                  "(a trailing space the answer's first word joins), so that token is not trained on; end the "
                  "generation prompt with a newline or a special token")
    images = (ImageProcessing.load(tokenizer_dir, tokenizer, image_limits(args), args.trust_remote_code)
              if tokenizer is not None else None)

    def prepare(name: str, inputs: List[str], split_name: Optional[str]) -> str:
        subset = getattr(args, "dataset_config", None) if name == "dataset" else None
        columns = tuple(dict(getattr(args, "dataset_columns", None) or {}).items()) if name != "ptx_dataset" else ()
        try:
            return str(prepared(inputs, RAW_DATA_FLAGS[name] or data_type, tokenizer, tokenizer_dir,
                                args.max_length or PREPARE_MAX_LENGTH, args.prepared_cache_dir,
                                DataPart(split_name, subset, columns=columns), images,
                                not getattr(args, "chat_template", None)))
        except CoatiUsageError as error:
            raise CoatiUsageError(f"{_data_flag(args, name)}: {error}") from None

    if test_split:
        args.eval_dataset = [prepare("dataset", raw["dataset"], test_split)]
        raw["eval_dataset"] = []
    for name in RAW_DATA_FLAGS:
        if raw[name]:
            folder = prepare(name, raw[name], args.dataset_train_split if name == "dataset" else None)
            setattr(args, name, [folder, *(p for p in getattr(args, name) if p not in raw[name])])
    if split:
        train, held_out = eval_split(args.dataset, data_type, split, args.seed, args.prepared_cache_dir)
        args.dataset, args.eval_dataset = [train], [held_out]


def note_prepared_template(args: argparse.Namespace, raw: Dict[str, List[str]]) -> None:
    """A note where --chat_template meets data prepared before: its rows keep the template they were tokenized with
    (only the raw data a run prepares takes the one given)."""
    if not getattr(args, "chat_template", None):
        return
    prepared = [path for name in RAW_DATA_FLAGS if name != "ptx_dataset" for path in getattr(args, name, None) or ()
                if path not in raw[name]]
    if prepared:
        note_user(f"--chat_template {args.chat_template} renders the raw data this run prepares; {', '.join(prepared)} "
                  "is prepared already and keeps the template it was prepared with (give its raw files here to train "
                  "on this one)")


def run_tokenizer(args: argparse.Namespace) -> "PreTrainedTokenizerBase":
    """The run's tokenizer: --tokenizer_dir's (else --pretrain's), with --chat_template's template and TRL's
    --eos_token and --pad_token where given."""
    from coati.dataset.tokenization import load_tokenizer

    return load_tokenizer(args.tokenizer_dir or args.pretrain, args.trust_remote_code,
                          eos_token=getattr(args, "eos_token", None), chat_template=getattr(args, "chat_template", None),
                          pad_token=getattr(args, "pad_token", None))


def image_limits(args: argparse.Namespace) -> "ImageLimits":
    """The pixel limits --max_pixels and --min_pixels give (0: the processor's own)."""
    from coati.dataset.vision import ImageLimits

    return ImageLimits(getattr(args, "max_pixels", 0), getattr(args, "min_pixels", 0))
