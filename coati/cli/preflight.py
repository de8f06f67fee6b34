"""Checks a training script runs on its parsed flags before it starts a process group or loads anything:
every path a flag names (models, tokenizer, data, output folders, the checkpoint to resume) is usable, or
the run stops with one line naming the flag. Every rank runs them, so all ranks stop together."""
import argparse
from pathlib import Path
from typing import Dict

from coati.config import PREPARE_MAX_LENGTH
from coati.utils.errors import CoatiUsageError
from coati.utils.file_checks import (check_data_dirs, check_data_exist, check_model_dir, check_writable_dir,
                                     resolve_model_dir)

MODEL_FLAGS = ("pretrain", "ref_pretrain", "rm_pretrain", "critic_pretrain")
DATA_FLAGS = ("dataset", "eval_dataset", "ptx_dataset")
OUTPUT_FLAGS = ("output_dir", "save_dir", "log_dir")


def resolve_model_flags(args: argparse.Namespace) -> None:
    """Replace Hugging Face model ids among the model and tokenizer flags by their local snapshot folders, and
    `--rm_pretrain` by the model of `--rm_checkpoint_path` when one is given."""
    for name in (*MODEL_FLAGS, "tokenizer_dir", "teacher_model", "prm_pretrain"):
        if getattr(args, name, None):
            setattr(args, name, resolve_model_dir(getattr(args, name), f"--{name}"))
    if getattr(args, "rm_checkpoint_path", None):
        args.rm_pretrain = checkpoint_model_dir(args.rm_checkpoint_path, "--rm_checkpoint_path")


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
    for name in DATA_FLAGS:
        check_data_exist(getattr(args, name, None), _data_flag(args, name))
    for name in OUTPUT_FLAGS:
        if getattr(args, name, None):
            check_writable_dir(getattr(args, name), f"--{name}")
    for flag in ("save_interval", "save_freq_epochs", "save_freq_secs"):
        if getattr(args, flag, 0) and not getattr(args, "save_dir", None):
            raise CoatiUsageError(f"--{flag} needs --save_dir, the directory checkpoints are written to")
    return configs


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


def prepare_raw_data(args: argparse.Namespace) -> None:
    """Raw data among the data flags (a JSONL file, a folder of them, a local `datasets` folder) prepared on the fly
    into the cache (`coati.dataset.cache`), the flags then naming the prepared folders; with --eval_split and no
    --eval_dataset, that fraction of the training rows held out. Nothing is loaded when every folder is prepared."""
    from coati.dataset.cache import is_raw   # the coati.dataset package loads torch: only once paths are checked

    data_type = getattr(args, "data_type", None)
    raw = {name: [p for p in getattr(args, name, None) or () if is_raw(p)] for name in RAW_DATA_FLAGS}
    split = getattr(args, "eval_split", 0.0)
    if data_type is None or not (any(raw.values()) or split):
        return
    if split and getattr(args, "eval_dataset", None):
        raise CoatiUsageError(f"--eval_split {split:g} and --eval_dataset: hold out a fraction of the training data, "
                              "or give held-out data; not both")
    from coati.dataset.cache import eval_split, prepared
    from coati.dataset.tokenization import load_tokenizer

    tokenizer_dir = args.tokenizer_dir or args.pretrain
    tokenizer = load_tokenizer(tokenizer_dir, args.trust_remote_code) if any(raw.values()) else None
    for name, kind in RAW_DATA_FLAGS.items():
        if raw[name]:
            try:
                folder = prepared(raw[name], kind or data_type, tokenizer, tokenizer_dir,
                                  args.max_length or PREPARE_MAX_LENGTH, args.prepared_cache_dir)
            except CoatiUsageError as error:
                raise CoatiUsageError(f"{_data_flag(args, name)}: {error}") from None
            setattr(args, name, [str(folder), *(p for p in getattr(args, name) if p not in raw[name])])
    if split:
        train, held_out = eval_split(args.dataset, data_type, split, args.seed, args.prepared_cache_dir)
        args.dataset, args.eval_dataset = [train], [held_out]
