"""Checks a training script runs on its parsed flags before it starts a process group or loads anything:
every path a flag names (models, tokenizer, data, output folders, the checkpoint to resume) is usable, or
the run stops with one line naming the flag. Every rank runs them, so all ranks stop together."""
import argparse
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from coati.utils.errors import CoatiUsageError, first_line
from coati.utils.file_checks import check_model_dir

MODEL_FLAGS = ("pretrain", "ref_pretrain", "rm_pretrain", "critic_pretrain")
DATA_FLAGS = ("dataset", "eval_dataset", "ptx_dataset")
OUTPUT_FLAGS = ("output_dir", "save_dir", "log_dir")
PREPARED_MARKERS = ("state.json", "dataset_dict.json")
"""Files `datasets.save_to_disk` writes into every dataset (or dataset dict) folder."""
PART_PREFIX = "part-"
"""ColossalChat's name for each of a prepared dataset's parts: `part-00000`, `part-00001`, ..."""


def check_writable_dir(path: str, flag: str) -> None:
    """`path` is a directory, or can be created as one: its nearest existing ancestor is a writable directory."""
    target = Path(path).absolute()
    if target.exists() and not target.is_dir():
        raise CoatiUsageError(f"{flag} {path} is a file, not a directory")
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CoatiUsageError(f"{flag} {path} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CoatiUsageError(f"{flag} {path} cannot be written: no write permission on {existing}")


def prepared_folders(path: str) -> List[Path]:
    """The dataset folders `path` stands for: itself when `save_to_disk` wrote it, else its `part-NNNNN`
    subfolders that it wrote (ColossalChat's layout, `prepare_dataset.py --data_arrow_output_dir`)."""
    folder = Path(path)
    if any((folder / marker).is_file() for marker in PREPARED_MARKERS):
        return [folder]
    parts = sorted(folder.glob(f"{PART_PREFIX}*")) if folder.is_dir() else []
    return [p for p in parts if any((p / marker).is_file() for marker in PREPARED_MARKERS)]


def check_data_dirs(paths: Optional[Sequence[str]], flag: str) -> None:
    """Each path is a folder that `prepare_dataset.py` (`datasets.save_to_disk`) wrote, or one holding such
    folders as ColossalChat's `part-NNNNN` parts."""
    for path in paths or ():
        if not Path(path).is_dir():
            raise CoatiUsageError(f"{flag} {path} does not exist or is not a directory (a folder written by "
                                  "prepare_dataset.py)")
        if not prepared_folders(path):
            raise CoatiUsageError(f"{flag} {path} is not a prepared dataset (no {PREPARED_MARKERS[0]}); "
                                  "write one from raw data with prepare_dataset.py")


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A Hugging Face model id (`org/name`), as opposed to a path."""


def resolve_model_dir(value: str, flag: str) -> str:
    """`value` itself when it is a directory; for a Hugging Face model id (`org/name`) that is not one, its
    snapshot folder in the local HF cache (`HF_HOME`), downloaded first where the machine is online and
    `HF_HUB_OFFLINE` is unset, as every HF-based trainer resolves `from_pretrained` ids."""
    if Path(value).is_dir() or not HUB_ID.match(value):
        return value
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(value, local_files_only=True)
    except Exception as cached_error:
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
            raise CoatiUsageError(f"{flag} {value} is neither a directory nor a model in the Hugging Face cache "
                                  f"({first_line(cached_error)}); HF_HUB_OFFLINE is set, so it is not downloaded") from None
    try:
        return snapshot_download(value)
    except Exception as error:
        raise CoatiUsageError(f"{flag} {value} is neither a directory nor a model in the Hugging Face cache, and "
                              f"downloading it failed ({type(error).__name__}: {first_line(error)})") from None


def resolve_model_flags(args: argparse.Namespace) -> None:
    """Replace Hugging Face model ids among the model and tokenizer flags by their local snapshot folders, and
    `--rm_pretrain` by the model of `--rm_checkpoint_path` when one is given."""
    for name in (*MODEL_FLAGS, "tokenizer_dir"):
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


def check_run_paths(args: argparse.Namespace) -> Dict[str, dict]:
    """Resolve model ids (`resolve_model_flags`), then check every path flag `args` has; returns the model
    configs read, by flag name."""
    resolve_model_flags(args)
    configs = {}
    for name in MODEL_FLAGS:
        if getattr(args, name, None):
            configs[name] = check_model_dir(getattr(args, name), f"--{name}")
    tokenizer = getattr(args, "tokenizer_dir", None)
    if tokenizer and not Path(tokenizer).is_dir():
        raise CoatiUsageError(f"--tokenizer_dir {tokenizer} does not exist or is not a directory")
    for name in DATA_FLAGS:
        flag = getattr(args, "dataset_flag", "--dataset") if name == "dataset" else f"--{name}"
        check_data_dirs(getattr(args, name, None), flag)
    for name in OUTPUT_FLAGS:
        if getattr(args, name, None):
            check_writable_dir(getattr(args, name), f"--{name}")
    for flag in ("save_interval", "save_freq_epochs", "save_freq_secs"):
        if getattr(args, flag, 0) and not getattr(args, "save_dir", None):
            raise CoatiUsageError(f"--{flag} needs --save_dir, the directory checkpoints are written to")
    return configs
