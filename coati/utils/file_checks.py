"""Cheap integrity checks of model and checkpoint files, without loading them: a truncated or empty file is
named with what is wrong before any process group or model exists.

- safetensors: the 8-byte header length, the JSON header, and the data end it declares fit in the file;
- torch files (`.bin`, `.pt`): zip archives (torch's format since 1.6) whose central directory is intact;
- sharded checkpoints: every shard an index names exists and passes the above;
- folders: a prepared dataset (`prepared_folders`), a writable output folder, a model id resolved to its snapshot.
"""
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from coati.utils.errors import CoatiUsageError, first_line, note_user

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SIGNATURE_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads")
"""The config fields that decide every weight's shape: a checkpoint for other values cannot be loaded."""


class CorruptFileError(CoatiUsageError):
    """A model or checkpoint file that is missing, empty, truncated or not what its name says."""


def check_safetensors(path: Path) -> None:
    safetensors_header(path)


def safetensors_header(path: Path) -> Dict[str, Any]:
    """The JSON header of the safetensors file `path` (each tensor's dtype, shape and offsets), once the file is
    checked to hold everything the header declares."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CorruptFileError(f"{path} is not a complete safetensors file ({size} bytes; truncated or empty)")
        header_len = int.from_bytes(head, "little")
        if header_len > size - 8:
            raise CorruptFileError(f"{path} is truncated: its header alone needs {header_len + 8} bytes, the file has {size}")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CorruptFileError(f"{path} is not a safetensors file (its header is not valid JSON)") from None
    end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise CorruptFileError(f"{path} is truncated: {size} bytes of the {8 + header_len + end} its header declares")
    return header


def weight_shapes(folder: Path) -> Optional[Dict[str, List[int]]]:
    """Every tensor's shape in the safetensors weights of the model folder `folder` (single-file or sharded), read from
    the headers alone; None where its weights are not safetensors."""
    index = folder / INDEX_FILES[0]
    files = _indexed_files(index) if index.is_file() else [folder / WEIGHT_FILES[0]]
    if not all(path.is_file() for path in files):
        return None
    return {name: entry["shape"] for path in files for name, entry in safetensors_header(path).items()
            if name != "__metadata__"}


def check_torch_file(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError):
        size = path.stat().st_size
        raise CorruptFileError(f"{path} is not a complete torch file ({size} bytes; truncated, empty or not "
                               "written by torch.save)") from None


def check_weight_file(path: Path) -> None:
    """`path` exists and is intact, by its suffix."""
    if not path.is_file():
        raise CorruptFileError(f"{path} is missing")
    if path.suffix == ".safetensors":
        check_safetensors(path)
    elif path.suffix in (".bin", ".pt", ".pth"):
        check_torch_file(path)


def _indexed_files(index: Path) -> List[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        raise CorruptFileError(f"{index} is not a valid checkpoint index (truncated JSON or no weight_map)") from None
    return [index.parent / name for name in sorted(set(weight_map.values()))]


def check_weights_dir(folder: Path) -> None:
    """Every weight file of `folder` (single-file or sharded with an index) exists and is intact."""
    indexes = [folder / name for name in INDEX_FILES if (folder / name).is_file()]
    singles = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not indexes and not singles:
        found = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
        raise CorruptFileError(f"{folder} holds no model weights ({' or '.join(WEIGHT_FILES + INDEX_FILES)}); "
                               f"found: {found}")
    for path in singles + [shard for index in indexes for shard in _indexed_files(index)]:
        check_weight_file(path)


def read_json(path: Path, what: str) -> Dict[str, Any]:
    """The JSON object in `path`; a missing file or bad JSON is one error naming FILE:LINE and `what` it is."""
    path = Path(path)
    if not path.is_file():
        raise CorruptFileError(f"{path}: file not found ({what})")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise CorruptFileError(f"{path}: not UTF-8 text (byte {error.start}); {what} is a JSON file") from None
    except json.JSONDecodeError as error:
        raise CorruptFileError(f"{path}:{error.lineno}: invalid JSON ({error.msg} at column {error.colno}); "
                               f"{what}") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path}:1: expected a JSON object ({what})")
    return data


def check_model_dir(path: str, flag: str) -> Dict[str, Any]:
    """A model directory `from_pretrained` can load: a valid config.json and intact weights. Returns the config."""
    folder = Path(path)
    if not folder.is_dir():
        raise CoatiUsageError(f"{flag} {path} does not exist or is not a directory")
    config = read_json(folder / CONFIG_FILE, f"the model config of {flag}")
    if "model_type" not in config:
        raise CorruptFileError(f"{folder / CONFIG_FILE} has no model_type: it is not a transformers model config ({flag})")
    check_weights_dir(folder)
    return config


def model_signature(config: Dict[str, Any]) -> Dict[str, Any]:
    """The shape-deciding fields of a model config (a dict, e.g. `config.to_dict()`)."""
    return {name: config[name] for name in SIGNATURE_FIELDS if config.get(name) is not None}


def signature_mismatch(saved: Dict[str, Any], current: Dict[str, Any]) -> Optional[str]:
    """'field: saved vs current' for the fields both name and that differ, or None."""
    diffs = [f"{name} {saved[name]} vs {current[name]}" for name in saved if name in current and saved[name] != current[name]]
    return ", ".join(diffs) or None


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


def check_data_exist(paths: Optional[Sequence[str]], flag: str) -> None:
    """Each path names data that is there (raw or prepared)."""
    for path in paths or ():
        if not Path(path).exists():
            raise CoatiUsageError(f"{flag} {path} does not exist (give a JSONL file, a folder of them, a datasets "
                                  "folder, or a folder `coati prepare` wrote)")


def check_data_dirs(paths: Optional[Sequence[str]], flag: str) -> None:
    """Each path is a folder that `prepare_dataset.py` (`datasets.save_to_disk`) wrote, or one holding such
    folders as ColossalChat's `part-NNNNN` parts."""
    check_data_exist(paths, flag)
    for path in paths or ():
        if not Path(path).is_dir():
            raise CoatiUsageError(f"{flag} {path} is a file, not a prepared dataset folder (prepare_dataset.py)")
        if not prepared_folders(path):
            raise CoatiUsageError(f"{flag} {path} is not a prepared dataset (no {PREPARED_MARKERS[0]}); "
                                  "write one from raw data with prepare_dataset.py")


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A Hugging Face model id (`org/name`), as opposed to a path."""


RUN_MODEL_FOLDERS = ("model", "modeling")
"""Where a model lies inside a folder that is not one itself: a run's output folder (OUTPUT_DIR/model) and a
checkpoint (epoch-E_step-S/modeling)."""


def model_in_folder(value: str, flag: str) -> str:
    """`value` when it holds a model (config.json); else the model of the run or checkpoint folder it is, with a note."""
    folder = Path(value)
    if (folder / "config.json").is_file():
        return value
    for name in RUN_MODEL_FOLDERS:
        if (folder / name / "config.json").is_file():
            note_user(f"{flag} {value} is a run or checkpoint folder: using its model {folder / name}")
            return str(folder / name)
    return value


def resolve_model_dir(value: str, flag: str) -> str:
    """`value` itself when it is a directory; for a Hugging Face model id (`org/name`) that is not one, its
    snapshot folder in the local HF cache (`HF_HOME`), downloaded first where the machine is online and
    `HF_HUB_OFFLINE` is unset, as every HF-based trainer resolves `from_pretrained` ids."""
    if Path(value).is_dir():
        return model_in_folder(value, flag)
    if not HUB_ID.match(value):
        return value
    return hub_snapshot(value, flag, "model")


DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".csv", ".tsv")
"""Names that end so are data files, never dataset ids."""


def resolve_dataset_id(value: str, flag: str) -> str:
    """`value` itself when it is a path (or names a data file); for a Hugging Face dataset id (`org/name`) that is
    not one, its snapshot folder in the local HF cache, downloaded first where the machine is online, as TRL's
    `load_dataset(dataset_name)` fetches it. The folder's files are read by split as a local folder's are."""
    if Path(value).exists() or not HUB_ID.match(value) or Path(value).suffix in DATA_FILE_SUFFIXES:
        return value
    return hub_snapshot(value, flag, "dataset")


def hub_snapshot(repo_id: str, flag: str, repo_type: str) -> str:
    """The local snapshot folder of the Hub's `repo_type` repository `repo_id`: from the HF cache, else downloaded
    (unless `HF_HUB_OFFLINE` is set); one line where neither gives it."""
    from huggingface_hub import snapshot_download

    what = f"neither a directory nor a {repo_type} in the Hugging Face cache"
    try:
        return snapshot_download(repo_id, repo_type=repo_type, local_files_only=True)
    except Exception as cached_error:
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
            raise CoatiUsageError(f"{flag} {repo_id} is {what} ({first_line(cached_error)}); HF_HUB_OFFLINE is set, "
                                  "so it is not downloaded") from None
    try:
        return snapshot_download(repo_id, repo_type=repo_type)
    except Exception as error:
        raise CoatiUsageError(f"{flag} {repo_id} is {what}, and downloading it failed ({type(error).__name__}: "
                              f"{first_line(error)})") from None
