"""Data as it comes: raw data (a JSONL file, a folder of them, a local `datasets` folder) prepared on the fly into a
cache, and a held-out split taken from the training data.

The cache entry's name is a hash of the input's content and of everything that shapes the prepared rows (the data
type, the tokenizer's files, the length limit), so the next run, and every other rank, reuses it; an entry is written
under a lock into a temporary folder and renamed when complete, so a killed preparation is never mistaken for one.
The explicit `coati prepare` step stays for large corpora.
"""
import fcntl
import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence

from coati.utils.file_checks import prepared_folders

if TYPE_CHECKING:
    from coati.dataset.prepare import DataPart

CACHE_ENV = "COATI_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "coati" / "prepared"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                   "processor_config.json")
"""The files of a tokenizer folder that decide how text (and images, for a vision-language model) become tokens, and
so a prepared dataset."""
COMPLETE = "coati_cache_complete"
"""Written last into a cache entry: the entry is whole."""


def cache_root(cache_dir: Optional[str] = None) -> Path:
    """Where prepared data is cached: `cache_dir`, else $COATI_CACHE, else ~/.cache/coati/prepared."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def is_raw(path: str) -> bool:
    """Whether `path` is data to prepare: a file, or a folder that is neither a prepared dataset nor a model (whose
    config.json is no data). A saved `DatasetDict` (splits) is raw: prepared data is one dataset; so is a dataset that
    `save_to_disk` wrote of raw rows (no column that prepared data has)."""
    folder = Path(path)
    if folder.is_dir() and (folder / "config.json").is_file():
        return False
    if is_saved_raw(folder):
        return True
    return folder.exists() and not prepared_folders(path)


COLOSSALCHAT_COLUMNS = ("loss_mask", "inputs_decode", "labels_decode", "label_decode", "seq_category")
"""Column-name endings that ColossalChat's prepare_dataset.py writes and coati's never does."""
PREPARED_COLUMN_ENDINGS = ("input_ids", "labels", "prompt_length", *COLOSSALCHAT_COLUMNS)
"""How the columns of prepared data end (coati's, and ColossalChat's): a saved dataset with none is raw rows."""


def is_saved_raw(folder: Path) -> bool:
    """Whether `save_to_disk` wrote `folder` of raw rows (TRL's or ColossalChat's columns): a dataset dict (splits;
    prepared data is one dataset), or one dataset not prepared by coati (no `coati_prepared.json`) and holding no
    prepared column. `load_from_disk` reads it."""
    if (folder / "dataset_dict.json").is_file():
        return True
    info = folder / "dataset_info.json"
    if not (folder / "state.json").is_file() or not info.is_file() or (folder / "coati_prepared.json").is_file():
        return False
    try:
        columns = json.loads(info.read_text()).get("features") or {}
    except json.JSONDecodeError:
        return False
    return bool(columns) and not any(name.endswith(PREPARED_COLUMN_ENDINGS) for name in columns)


def _files(path: Path) -> List[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                             p.relative_to(path).parts))


def _digest(parts: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:20]


PREPARED_FORMAT = 2
"""Raised when prepared rows gain a column, so that data prepared before is prepared again (2: a preference row's
TRL `margin`)."""


def cache_key(inputs: Sequence[str], data_type: str, tokenizer_dir: str, max_length: int,
              part: Optional["DataPart"] = None, image_limits: Optional[Dict[str, int]] = None,
              eos_token: Optional[str] = None, chat_template: Optional[str] = None) -> str:
    """A name for the prepared form of `inputs`' `part` (a `coati.dataset.prepare.DataPart`: split, configuration
    and renamed columns): their content (the files of a folder given, its images among them), the data type, the
    tokenizer's files, EOS (--eos_token) and a chat template given in place of its own (--chat_template),
    `max_length` and a vision-language model's pixel limits."""
    split, subset, columns = (part.split, part.subset, part.columns) if part is not None else (None, None, ())
    content = [f.relative_to(Path(i)).as_posix().encode() + f.read_bytes() if Path(i).is_dir() else f.read_bytes()
               for i in inputs for f in _files(Path(i))]
    tokenizer = [name.encode() + (Path(tokenizer_dir) / name).read_bytes() for name in TOKENIZER_FILES
                 if (Path(tokenizer_dir) / name).is_file()]
    settings = json.dumps({"type": data_type, "max_length": max_length, "split": split, "format": PREPARED_FORMAT,
                           "eos": eos_token, **({"chat_template": chat_template} if chat_template else {}),
                           **({"image_limits": image_limits} if image_limits else {}),
                           **({"subset": subset} if subset else {}),
                           **({"columns": list(columns)} if columns else {})}).encode()
    return f"{data_type}-{_digest([*content, *tokenizer, settings])}"


class _Locked:
    """An exclusive lock on `path` (a file), held while the block runs: one process prepares, the others wait."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> "_Locked":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _cached(entry: Path, make) -> Path:
    """`entry`, made by `make(folder)` into a temporary folder and renamed into place unless a complete one exists."""
    with _Locked(entry.with_name(entry.name + ".lock")):
        if (entry / COMPLETE).is_file():
            return entry
        partial = entry.with_name(f"{entry.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(entry, ignore_errors=True)
        make(partial)
        (partial / COMPLETE).write_text("")
        partial.rename(entry)
    return entry


def prepared(inputs: Sequence[str], data_type: str, tokenizer, tokenizer_dir: str, max_length: int,
             cache_dir: Optional[str] = None, part: Optional["DataPart"] = None, images: Any = None,
             own_template: bool = True) -> Path:
    """The prepared dataset of the raw `inputs`' `part` (a `coati.dataset.prepare.DataPart`, None: the whole;
    `coati.dataset.prepare.load_rows`), from the cache or made now (printing what was kept); `images`, a
    vision-language model's `ImageProcessing`; `own_template` False where `tokenizer`'s chat template is not its
    folder's (--chat_template)."""
    from coati.dataset.prepare import DataPart, prepare_dataset, truncation_summary

    part = part or DataPart()

    limits = images.limits.as_info() if images is not None else None
    entry = cache_root(cache_dir) / cache_key(inputs, data_type, tokenizer_dir, max_length, part, limits,
                                              tokenizer.eos_token, None if own_template else tokenizer.chat_template)

    def make(folder: Path) -> None:
        counts = prepare_dataset(list(inputs), data_type, tokenizer, max_length, folder, part=part, images=images)
        which = part.described()
        print(f"prepared {data_type} data{which} from {', '.join(inputs)} into {entry}: {counts['kept']} of "
              f"{counts['rows']} rows kept, {truncation_summary(counts, max_length)}", flush=True)

    return _cached(entry, make)


def eval_split(paths: Sequence[str], data_type: str, fraction: float, seed: int,
               cache_dir: Optional[str] = None) -> tuple:
    """(training rows, held-out rows) of the prepared datasets `paths`: a seeded `fraction` of their rows held out,
    both cached (keyed by the folders' files, their sizes and times)."""
    from coati.dataset.prepare import PREPARED_INFO, load_prepared, without_datasets_bars

    files = [f for path in paths for f in _files(Path(path)) if not f.name.startswith("cache-")]   # not datasets
    stamp = [f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}".encode() for f in files]
    key = _digest([*stamp, f"{data_type}:{fraction!r}:{seed}".encode()])
    info = next((f for f in files if f.name == PREPARED_INFO), None)
    parts = {}
    for name in ("train", "test"):
        def make(target: Path, name: str = name) -> None:
            rows = load_prepared(list(paths), data_type)
            held_out = set(random.Random(seed).sample(range(len(rows)), max(1, round(fraction * len(rows)))))
            indices = [i for i in range(len(rows)) if (i in held_out) == (name == "test")]
            with without_datasets_bars():   # no cache files beside the data
                rows.select(indices, keep_in_memory=True).save_to_disk(str(target))
            if info is not None:
                shutil.copy(info, target / PREPARED_INFO)

        parts[name] = str(_cached(cache_root(cache_dir) / f"{data_type}-split-{key}-{name}", make))
    return parts["train"], parts["test"]
