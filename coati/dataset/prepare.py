"""Raw JSONL (or any local dataset `datasets.load_dataset` reads) -> tokenized arrow datasets on disk."""
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Union

from datasets import Dataset, concatenate_datasets, load_dataset, load_from_disk
from transformers import PreTrainedTokenizerBase

from coati.utils.errors import CoatiUsageError

from .tokenization import tokenize_conversation, tokenize_preference


def load_raw(data_files: Sequence[Union[str, Path]]) -> Dataset:
    """JSON-lines files through `datasets.load_dataset("json", ...)`; a missing file is a usage error."""
    missing = [str(f) for f in data_files if not Path(f).is_file()]
    if missing:
        raise CoatiUsageError(f"data file not found: {', '.join(missing)}")
    return load_dataset("json", data_files=[str(f) for f in data_files], split="train")


def _prepare(data_files: Sequence[Union[str, Path]], encode: Callable[[Dict], Optional[Dict]],
             fields: Sequence[str], out_dir: Union[str, Path]) -> Dict[str, int]:
    """Map `encode` over the raw rows, drop rows it returns None for, save; returns the counts."""
    raw = load_raw(data_files)
    empty = {field: [] for field in fields}
    tokenized = raw.map(lambda row: encode(row) or empty, remove_columns=raw.column_names, desc="tokenizing")
    kept = tokenized.filter(lambda row: len(row[fields[0]]) > 0)
    kept.save_to_disk(str(out_dir))
    return {"rows": len(raw), "kept": len(kept), "dropped": len(raw) - len(kept)}


def prepare_sft(
    data_files: Sequence[Union[str, Path]], tokenizer: PreTrainedTokenizerBase, max_length: int, out_dir: Union[str, Path]
) -> Dict[str, int]:
    """Tokenize `messages` conversations with the chat template and save them; returns counts."""
    return _prepare(data_files, lambda row: tokenize_conversation(tokenizer, row["messages"], max_length),
                    ("input_ids", "labels"), out_dir)


def prepare_preference(
    data_files: Sequence[Union[str, Path]], tokenizer: PreTrainedTokenizerBase, max_length: int, out_dir: Union[str, Path]
) -> Dict[str, int]:
    """Tokenize `context` + `chosen` / `rejected` message lists and save them; returns counts."""
    return _prepare(
        data_files,
        lambda row: tokenize_preference(tokenizer, row["context"], row["chosen"], row["rejected"], max_length),
        ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"), out_dir,
    )


def load_prepared(paths: Sequence[Union[str, Path]]) -> Dataset:
    """Prepared datasets written by `save_to_disk`, concatenated."""
    missing = [str(p) for p in paths if not Path(p).is_dir()]
    if missing:
        raise CoatiUsageError(f"prepared dataset not found: {', '.join(missing)} (run prepare_dataset.py first)")
    return concatenate_datasets([load_from_disk(str(p)) for p in paths])
