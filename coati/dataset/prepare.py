"""Raw data -> validated, tokenized arrow datasets on disk (`save_to_disk`), so training never re-tokenizes.

Inputs are JSONL files, folders of them, or any local dataset folder `datasets.load_dataset` reads
(parquet, csv, arrow...). Rows are validated first (`coati.dataset.validation`). Conversations longer
than `max_length` tokens are cut from the right; a row whose response would be cut away entirely is
dropped and counted.
"""
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from datasets import Dataset, concatenate_datasets, load_dataset, load_from_disk
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from coati.utils.errors import CoatiUsageError, first_line

from .tokenization import tokenize_conversation, tokenize_kto, tokenize_preference
from .validation import jsonl_entries, validate_rows

PathLike = Union[str, Path]
JSONL_SUFFIXES = (".jsonl", ".json")
PREPARED_INFO = "coati_prepared.json"
COLOSSALCHAT_COLUMNS = ("loss_mask", "inputs_decode", "labels_decode", "label_decode", "seq_category")
"""Column-name endings that ColossalChat's prepare_dataset.py writes and coati's never does."""


def _jsonl_files(path: Path) -> List[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.suffix in JSONL_SUFFIXES) if path.is_dir() else []


def _dataset_entries(path: Path, cache_dir: Optional[PathLike] = None) -> Iterator[Tuple[str, Callable[[], Dict]]]:
    """(`folder row N`, reader) for every row of a local dataset folder read by `datasets.load_dataset`."""
    if path.is_dir() and not any(path.iterdir()):
        raise CoatiUsageError(f"{path}: the data input folder is empty (expected JSONL files or a dataset folder)")
    try:
        dataset = load_dataset(str(path), split="train", cache_dir=None if cache_dir is None else str(cache_dir))
    except Exception as error:   # datasets raises many types for unreadable folders
        raise CoatiUsageError(f"{path}: neither JSONL files nor a dataset folder that datasets.load_dataset reads "
                              f"({type(error).__name__}: {first_line(error)})") from None
    for index, row in enumerate(dataset):
        yield f"{path} row {index}", functools.partial(dict, row)


def load_rows(inputs: Sequence[PathLike], data_type: str, skip_invalid: bool = False,
              cache_dir: Optional[PathLike] = None) -> Tuple[List[Dict], int]:
    """Validated, normalised rows of every input (dataset folders read through `datasets`' cache in `cache_dir`,
    its default when None); returns (rows, number skipped)."""
    rows, skipped = [], 0
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise CoatiUsageError(f"data input not found: {path}")
        files = _jsonl_files(path)
        entries = jsonl_entries(files) if files else _dataset_entries(path, cache_dir)
        found, bad = validate_rows(entries, data_type, skip_invalid)
        rows += found
        skipped += bad
    return rows, skipped


@dataclass(frozen=True)
class OutputLayout:
    """How a prepared dataset is written: `num_shards` arrow files, and with `jsonl_dir` the same rows as
    JSONL files too, `rows_per_jsonl` rows each (0: one file). ColossalChat's prepare_dataset.py flags
    `--num_spliced_dataset_bins`, `--data_jsonl_output_dir` and `--num_samples_per_datafile` set them."""

    num_shards: int = 1
    jsonl_dir: Optional[PathLike] = None
    rows_per_jsonl: int = 0

    def write(self, encoded: List[Dict], out_dir: PathLike) -> None:
        Dataset.from_list(encoded).save_to_disk(str(out_dir), num_shards=min(self.num_shards, len(encoded)))
        if self.jsonl_dir is None:
            return
        folder = Path(self.jsonl_dir)
        folder.mkdir(parents=True, exist_ok=True)
        size = self.rows_per_jsonl or len(encoded)
        for part, start in enumerate(range(0, len(encoded), size)):
            with open(folder / f"part-{part:05d}.jsonl", "w") as out:
                out.writelines(json.dumps(row) + "\n" for row in encoded[start:start + size])


def _prepare(rows: List[Dict], encode: Callable[[Dict], Optional[Dict]], out_dir: PathLike,
             layout: OutputLayout = OutputLayout()) -> Dict[str, int]:
    """Encode each row, drop those `encode` returns None for (cut away by truncation), save as `layout`
    says; returns counts."""
    if not rows:
        raise CoatiUsageError("no usable rows in the input data")
    encoded = [e for e in (encode(row) for row in tqdm(rows, desc="tokenizing")) if e is not None]
    if not encoded:
        raise CoatiUsageError(f"all {len(rows)} rows were dropped by truncation (each response would be cut away "
                              "entirely at this --max_length); raise --max_length. Nothing was written")
    layout.write(encoded, out_dir)
    return {"rows": len(rows), "kept": len(encoded), "dropped": len(rows) - len(encoded)}


def _write_info(out_dir: PathLike, data_type: str, max_length: int, counts: Dict[str, int]) -> None:
    """What the folder holds, so a training script can refuse data of the wrong type by name."""
    info = {"type": data_type, "max_length": max_length, **counts}
    (Path(out_dir) / PREPARED_INFO).write_text(json.dumps(info, indent=2) + "\n")


def prepared_type(path: PathLike) -> Optional[str]:
    """The data type a prepared folder was written as; None for a folder saved by other tools."""
    info = Path(path) / PREPARED_INFO
    return json.loads(info.read_text())["type"] if info.is_file() else None


def encoder(data_type: str, tokenizer: PreTrainedTokenizerBase, max_length: int) -> Callable[[Dict], Optional[Dict]]:
    """The function that tokenizes one validated row of `data_type`."""
    if data_type == "sft":
        return lambda row: tokenize_conversation(tokenizer, row["messages"], max_length)
    if data_type == "preference":
        return lambda row: tokenize_preference(tokenizer, row["context"], row["chosen"], row["rejected"], max_length)
    if data_type == "kto":
        return lambda row: tokenize_kto(tokenizer, row["context"], row["completion"], row["label"], max_length)
    return lambda row: tokenize_prompt(tokenizer, row, max_length)


def tokenize_prompt(tokenizer: PreTrainedTokenizerBase, row: Dict, max_length: int) -> Optional[Dict]:
    """The prompt rendered with the generation prompt, left-truncated to `max_length`; other fields kept."""
    ids = tokenizer.apply_chat_template(row["messages"], tokenize=True, add_generation_prompt=True)
    extra = {k: v for k, v in row.items() if k != "messages"}
    return {"input_ids": ids[-max_length:], **extra}


def prepare_dataset(inputs: Sequence[PathLike], data_type: str, tokenizer: PreTrainedTokenizerBase, max_length: int,
                    out_dir: PathLike, skip_invalid: bool = False, layout: OutputLayout = OutputLayout(),
                    cache_dir: Optional[PathLike] = None) -> Dict[str, int]:
    """Validate, tokenize and save (as `layout` says); returns rows read, kept, dropped by truncation, and
    skipped as invalid. `cache_dir` is `datasets`' cache for input dataset folders."""
    rows, skipped = load_rows(inputs, data_type, skip_invalid, cache_dir)
    counts = {**_prepare(rows, encoder(data_type, tokenizer, max_length), out_dir, layout), "skipped": skipped}
    _write_info(out_dir, data_type, max_length, counts)
    return counts


def prepare_sft(data_files: Sequence[PathLike], tokenizer: PreTrainedTokenizerBase, max_length: int,
                out_dir: PathLike) -> Dict[str, int]:
    return prepare_dataset(data_files, "sft", tokenizer, max_length, out_dir)


def prepare_preference(data_files: Sequence[PathLike], tokenizer: PreTrainedTokenizerBase, max_length: int,
                       out_dir: PathLike) -> Dict[str, int]:
    return prepare_dataset(data_files, "preference", tokenizer, max_length, out_dir)


def load_prepared(paths: Sequence[PathLike], data_type: Optional[str] = None) -> Dataset:
    """Prepared datasets written by `save_to_disk`, concatenated in order. With `data_type`, a folder
    prepared as another type is refused by name. Columns that only some folders have (a prompt set's
    ground-truth fields) are kept, as None where a folder lacks them."""
    missing = [str(p) for p in paths if not Path(p).is_dir()]
    if missing:
        raise CoatiUsageError(f"prepared dataset not found: {', '.join(missing)} (run prepare_dataset.py first)")
    for path in paths:
        found = prepared_type(path)
        if data_type and found and found != data_type:
            raise CoatiUsageError(f"dataset {path} was prepared as {found} data; this script needs {data_type} data "
                                  f"(prepare_dataset.py --type {data_type})")
    parts = [load_from_disk(str(p)) for p in paths]
    for path, part in zip(paths, parts):
        _refuse_colossalchat_data(path, part.column_names, data_type)
    columns = sorted({c for part in parts for c in part.column_names})
    parts = [_with_columns(part, columns) for part in parts]
    return concatenate_datasets(parts)


def _refuse_colossalchat_data(path: PathLike, columns: Sequence[str], data_type: Optional[str]) -> None:
    """A folder ColossalChat's prepare_dataset.py wrote (its masks and decoded text, not coati's labels) is
    refused with how to prepare it again: the same raw JSONL goes through coati's script."""
    if prepared_type(path):
        return
    found = next((c for c in columns if c.endswith(COLOSSALCHAT_COLUMNS)), None)
    if found:
        kind = data_type or "sft|preference|prompt|kto"
        raise CoatiUsageError(f"dataset {path} was prepared by ColossalChat's prepare_dataset.py (it has a {found!r} "
                              f"column); prepare the raw data again with examples/data_preparation_scripts/"
                              f"prepare_dataset.py --type {kind}, which reads the same JSONL")


def _with_columns(dataset: Dataset, columns: Sequence[str]) -> Dataset:
    for name in columns:
        if name not in dataset.column_names:
            dataset = dataset.add_column(name, [None] * len(dataset))
    return dataset.select_columns(list(columns))
