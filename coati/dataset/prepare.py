"""Raw data -> validated, tokenized arrow datasets on disk (`save_to_disk`), so training never re-tokenizes.

Inputs are JSONL files, folders of them, or any local dataset folder `datasets.load_dataset` reads
(parquet, csv, arrow...). Rows are validated first (`coati.dataset.validation`). Conversations longer
than `max_length` tokens are cut from the right; a row whose response would be cut away entirely is
dropped and counted. Prompts are cut from the left (their end, the question and the generation prompt, kept, as
TRL cuts them), and counted.
"""
import contextlib
import functools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from datasets import Dataset, concatenate_datasets, get_dataset_config_names, load_dataset, load_from_disk
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from coati.utils.errors import CoatiUsageError, first_line
from coati.utils.file_checks import PART_PREFIX, prepared_folders

from .tokenization import (IGNORE_INDEX, tokenize_conversation, tokenize_kto, tokenize_preference, tokenize_steps,
                           tokenize_text)
from .cache import COLOSSALCHAT_COLUMNS, is_saved_raw
from .validation import Entry, jsonl_entries, validate_rows, with_columns_renamed
from .vision import IMAGES, LIMITS_INFO, ImageLimits, ImageProcessing, ImageTokens, prepared_limits

PathLike = Union[str, Path]
JSONL_SUFFIXES = (".jsonl", ".json")
FILE_BUILDERS = {".parquet": ("parquet", {}), ".arrow": ("arrow", {}), ".csv": ("csv", {}),
                 ".tsv": ("csv", {"delimiter": "\t"})}
"""The `datasets` builder, and its options, that read one data file of each suffix."""
DATASET_FILE_SUFFIXES = tuple(FILE_BUILDERS)
"""Data files that are not JSON Lines, which `datasets.load_dataset` reads: one by its format, or their folder."""
PREPARED_INFO = "coati_prepared.json"


@dataclass(frozen=True)
class DataPart:
    """Which part of raw data is read, and through which cache: a split (None: a folder's every JSONL file, a
    dataset's train split) of a configuration (`subset`, datasets.load_dataset's name; None: the dataset's only or
    default one); `cache_dir`, datasets' cache for dataset folders (None: its default); `columns`, (OLD, NEW) pairs:
    a row's column OLD read as NEW (--dataset_columns)."""

    split: Optional[str] = None
    subset: Optional[str] = None
    cache_dir: Optional[PathLike] = None
    columns: Tuple[Tuple[str, str], ...] = ()

    def described(self) -> str:
        """' (configuration main, test split)', or '' for the train split of the default configuration."""
        which = ([f"configuration {self.subset}"] if self.subset else []) + \
            ([f"{self.split} split"] if self.split not in (None, "train") else [])
        return f" ({', '.join(which)})" if which else ""


def _jsonl_files(path: Path, split: Optional[str] = None) -> List[Path]:
    """The JSONL files of `path` (itself, or those in the folder); of `split` only, where the folder's files are
    named by split as `datasets.load_dataset` reads them (`train.jsonl`, `test.jsonl`)."""
    instead = "hold part of it out with --eval_split FRACTION, or give --eval_dataset"
    if path.is_file():
        if split not in (None, "train"):
            raise CoatiUsageError(f"{path} is one file, with no {split!r} split: {instead}")
        return [] if path.suffix in DATASET_FILE_SUFFIXES else [path]
    if is_saved_raw(path):
        return []   # save_to_disk's own JSON files are no data: load_from_disk reads the folder
    files = sorted(p for p in path.iterdir() if p.suffix in JSONL_SUFFIXES) if path.is_dir() else []
    if files and split is not None:
        named = named_splits(path)
        if not named and split != "train":
            raise CoatiUsageError(f"{path}: its files are not named by split (train.jsonl, test.jsonl), so it has no "
                                  f"{split!r} split: {instead}")
        if named:
            if split not in named:
                raise CoatiUsageError(f"{path} has no split {split!r}: its files make the splits "
                                      f"{', '.join(sorted(named))}")
            files = [f for f in files if str(f.resolve()) in named[split]]
    return files


def named_splits(folder: Path) -> Dict[str, List[str]]:
    """The files of each split of `folder`, where its files are named by split (as `datasets.load_dataset` names
    them: `train*.jsonl`, `test.jsonl`, `data/validation-*.parquet`); {} where they are not."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        patterns = get_data_patterns(str(folder))
    except Exception:   # no files datasets reads
        return {}
    if list(patterns) == ["train"] and patterns["train"] == ["**"]:
        return {}
    return {str(name): [str(Path(f).resolve()) for f in files]
            for name, files in DataFilesDict.from_patterns(patterns, base_path=str(folder)).items()}


def _dataset_entries(path: Path, cache_dir: Optional[PathLike] = None, split: str = "train",
                     subset: Optional[str] = None) -> Iterator[Entry]:
    """An `Entry` (`folder row N`) for every row of `split` of a local dataset folder read by `datasets.load_dataset`,
    of its configuration `subset` where given (load_dataset's name)."""
    if path.is_dir() and not any(path.iterdir()):
        raise CoatiUsageError(f"{path}: the data input folder is empty (expected JSONL files or a dataset folder)")
    try:
        if is_saved_raw(path):
            dataset = _saved_split(path, split, subset)
        elif path.is_file():   # one parquet, arrow or CSV file (verl's data.train_files), read by its format
            builder, options = FILE_BUILDERS[path.suffix]
            dataset = load_dataset(builder, data_files=str(path), split="train", **options,
                                   cache_dir=None if cache_dir is None else str(cache_dir))
        else:
            dataset = load_dataset(str(path), subset, split=split,
                                   cache_dir=None if cache_dir is None else str(cache_dir))
    except ValueError as error:
        if "Config name is missing" in str(error) or "BuilderConfig" in str(error):
            raise CoatiUsageError(_configurations(path, subset)) from None
        if "Unknown split" not in str(error):
            raise
        raise CoatiUsageError(f"{path} has no split {split!r} ({first_line(error)})") from None
    except Exception as error:   # datasets raises many types for unreadable folders
        raise CoatiUsageError(f"{path}: neither JSONL files nor a dataset folder that datasets.load_dataset reads "
                              f"({type(error).__name__}: {first_line(error)})") from None
    for index, row in enumerate(dataset):
        yield f"{path} row {index}", functools.partial(dict, row), path


def _configurations(path: Path, subset: Optional[str]) -> str:
    """What to give where the dataset folder `path` has configurations (subsets) and `subset` names none of them."""
    names = ", ".join(get_dataset_config_names(str(path)))
    if subset is None:
        return f"{path} has configurations ({names}): choose one with --dataset_config NAME"
    return f"{path} has no configuration {subset!r} (--dataset_config); it has {names}"


def _saved_split(path: Path, split: str, subset: Optional[str] = None) -> Dataset:
    """`split` of a folder `save_to_disk` wrote (a dataset dict's split, or the one dataset as its train split),
    which has no configurations (`subset`)."""
    if subset is not None:
        raise CoatiUsageError(f"{path} is a folder save_to_disk wrote, with no configurations: leave --dataset_config "
                              "out")
    saved = load_from_disk(str(path))
    if isinstance(saved, Dataset):
        if split != "train":
            raise ValueError(f"Unknown split {split!r}: the folder holds one dataset (its train split)")
        return saved
    if split not in saved:
        raise ValueError(f"Unknown split {split!r}: it has {', '.join(saved)}")
    return saved[split]


def load_rows(inputs: Sequence[PathLike], data_type: str, skip_invalid: bool = False,
              part: DataPart = DataPart()) -> Tuple[List[Dict], int]:
    """Validated, normalised rows of every input (dataset folders read through `datasets`' cache in
    `part.cache_dir`); returns (rows, number skipped). With `part.split`, a folder whose files are named by split, or
    a dataset folder, gives that split's rows; without, every JSONL file of a folder, and a dataset's train split.
    With `part.subset`, every input is a dataset folder read as that configuration (load_dataset's name)."""
    split, subset, cache_dir = part.split, part.subset, part.cache_dir
    rows, skipped = [], 0
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise CoatiUsageError(f"data input not found: {path}")
        if subset is not None and path.is_file():
            raise CoatiUsageError(f"{path} is one file, with no configurations: leave --dataset_config out")
        files = _jsonl_files(path, split) if subset is None else []
        entries = jsonl_entries(files) if files else _dataset_entries(path, cache_dir, split or "train", subset)
        found, bad = validate_rows(with_columns_renamed(entries, part.columns), data_type, skip_invalid)
        rows += found
        skipped += bad
    return rows, skipped


def part_bounds(num_rows: int, bins: int) -> List[Tuple[int, int]]:
    """Row ranges of the parts ColossalChat's prepare_dataset.py splits `num_rows` rows into for `bins` bins:
    `datasets`' percent slices `train[a%:b%]` in steps of ceil(100 / bins) %, each boundary rounded to the
    closest row as `datasets` rounds it (so a part may be empty, and there may be fewer parts than bins)."""
    step = math.ceil(100 / bins)
    return [(_closest_row(start, num_rows), _closest_row(min(start + step, 100), num_rows))
            for start in range(0, 100, step)]


def _closest_row(percent: int, num_rows: int) -> int:
    return int(round(percent * num_rows / 100.0))


@dataclass(frozen=True)
class OutputLayout:
    """How a prepared dataset is written. Rows are split into parts as ColossalChat's prepare_dataset.py splits
    them into `bins` (`part_bounds`), and each part keeps at most `samples_per_part` rows (0: all), drawn with
    `seed`. With `part_folders`, each non-empty part is a dataset folder `part-NNNNN` of its own (ColossalChat's
    layout, which its training commands list one by one); otherwise one folder holds every part, one arrow file
    each. With `jsonl_dir`, each part is also written as `part-NNNNN.jsonl`, rows with their text decoded
    (ColossalChat's sidecar, for checking a template by eye)."""

    bins: int = 1
    part_folders: bool = False
    jsonl_dir: Optional[PathLike] = None
    samples_per_part: int = 0
    seed: int = 42

    def split(self, rows: List[Dict]) -> List[Tuple[int, List[Dict]]]:
        """(part index, its rows) for every non-empty part, sampled down to `samples_per_part`."""
        parts = []
        for index, (start, end) in enumerate(part_bounds(len(rows), self.bins)):
            part = rows[start:end]
            if 0 < self.samples_per_part < len(part):
                keep = sorted(random.Random(self.seed + index).sample(range(len(part)), self.samples_per_part))
                part = [part[i] for i in keep]
            if part:
                parts.append((index, part))
        return parts

    def check_free(self, out_dir: PathLike) -> None:
        """Parts are never written over an earlier run's (stale parts would be read with the new ones)."""
        for folder, flag in ((out_dir, "--data_arrow_output_dir"), (self.jsonl_dir, "--data_jsonl_output_dir")):
            if folder is None or (folder == out_dir and not self.part_folders):
                continue
            found = sorted(Path(folder).glob(f"{PART_PREFIX}*")) if Path(folder).is_dir() else []
            if found:
                raise CoatiUsageError(f"{flag} {folder} already holds {found[0].name} (an earlier preparation); "
                                      "remove it or write to a new folder")

    def write(self, parts: List[Tuple[int, List[Dict]]], out_dir: PathLike, readable: Callable[[Dict], Dict]) -> None:
        with without_datasets_bars():
            if self.part_folders:
                for index, encoded in parts:
                    Dataset.from_list(encoded).save_to_disk(str(Path(out_dir) / part_name(index)))
            else:
                rows = [row for _, encoded in parts for row in encoded]
                Dataset.from_list(rows).save_to_disk(str(out_dir), num_shards=min(len(parts), len(rows)))
        if self.jsonl_dir is None:
            return
        Path(self.jsonl_dir).mkdir(parents=True, exist_ok=True)
        for index, encoded in parts:
            with open(Path(self.jsonl_dir) / f"{part_name(index)}.jsonl", "w", encoding="utf-8") as out:
                out.writelines(json.dumps({**row, **readable(row)}, ensure_ascii=False) + "\n" for row in encoded)


@contextlib.contextmanager
def without_datasets_bars() -> Iterator[None]:
    """datasets' own progress bars ('Saving the dataset (0/1 shards)', one per part written) off inside: the
    tokenizing bar has counted the rows already."""
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    enabled = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            enable_progress_bar()


def part_name(index: int) -> str:
    return f"{PART_PREFIX}{index:05d}"


def _prepare(rows: List[Dict], encode: Callable[[Dict], Optional[Dict]], out_dir: PathLike,
             layout: OutputLayout = OutputLayout(), readable: Callable[[Dict], Dict] = dict) -> Dict[str, int]:
    """Split and sample `rows` as `layout` says, encode each, drop those `encode` returns None for (cut away by
    truncation), save; returns counts (`cut`: rows kept that `encode` marked shortened)."""
    if not rows:
        raise CoatiUsageError("no usable rows in the input data")
    parts = layout.split(rows)
    sampled = sum(len(part) for _, part in parts)
    progress = tqdm(total=sampled, desc="tokenizing")
    encoded, cut = [], 0
    for index, part in parts:
        rows_kept = [e for e in (_encoded(encode, row) for row in part) if e is not None]
        cut += sum(bool(e.pop(CUT, False)) for e in rows_kept)
        progress.update(len(part))
        if rows_kept:
            encoded.append((index, rows_kept))
    progress.close()
    kept = sum(len(part) for _, part in encoded)
    if not kept:
        raise CoatiUsageError(f"all {sampled} rows were dropped by truncation (each response would be cut away "
                              "entirely at this --max_length); raise --max_length. Nothing was written")
    layout.write(with_every_column(encoded), out_dir, readable)
    return {"rows": len(rows), "kept": kept, "dropped": sampled - kept, "cut": cut, "unsampled": len(rows) - sampled}


def _encoded(encode: Callable[[Dict], Optional[Dict]], row: Dict) -> Optional[Dict]:
    """`encode(row)`; a chat template that fails on the row (its `raise_exception` on a role order, say) is one line
    showing the row's start."""
    from jinja2 import TemplateError

    try:
        return encode(row)
    except TemplateError as error:
        shown = str({key: row[key] for key in list(row)[:2]})
        raise CoatiUsageError(f"the chat template fails on a row ({type(error).__name__}: {first_line(error)}): "
                              f"{shown[:160]}") from None


def with_every_column(parts: List[Tuple[int, List[Dict]]]) -> List[Tuple[int, List[Dict]]]:
    """Every row with every column some row has (None where it has none: a preference row without TRL's `margin`, a
    prompt without a field others carry), since `Dataset.from_list` takes its columns from the first row alone."""
    columns = list(dict.fromkeys(key for _, part in parts for row in part for key in row))
    return [(index, [{name: row.get(name) for name in columns} for row in part]) for index, part in parts]


def truncation_summary(counts: Dict[str, int], max_length: int) -> str:
    """What truncation did to the rows prepared, for the line that reports a preparation."""
    line = f"{counts['dropped']} dropped by truncation"
    if counts.get("cut"):
        line += f", {counts['cut']} prompts longer than {max_length} tokens cut from the left (their end kept)"
    return line


def _write_info(out_dir: PathLike, data_type: str, max_length: int, counts: Dict[str, Any]) -> None:
    """What the folder holds, so a training script can refuse data of the wrong type by name (and, for a
    vision-language model, the pixel limits its image tokens were counted with)."""
    info = {"type": data_type, "max_length": max_length, **counts}
    (Path(out_dir) / PREPARED_INFO).write_text(json.dumps(info, indent=2) + "\n")


def prepared_type(path: PathLike) -> Optional[str]:
    """The data type a prepared folder was written as; None for a folder saved by other tools."""
    info = Path(path) / PREPARED_INFO
    return json.loads(info.read_text())["type"] if info.is_file() else None


def prepared_image_limits(paths: Sequence[PathLike]) -> Optional[ImageLimits]:
    """The pixel limits the image tokens of the prepared folders `paths` were counted with (the first folder that
    says; None where none was prepared for a vision-language model)."""
    for path in paths:
        for folder in prepared_folders(path) or [Path(path)]:
            info = Path(folder) / PREPARED_INFO
            limits = prepared_limits(json.loads(info.read_text())) if info.is_file() else None
            if limits is not None:
                return limits
    return None


def encoder(data_type: str, tokenizer: PreTrainedTokenizerBase, max_length: int,
            images: Optional[ImageProcessing] = None) -> Callable[[Dict], Optional[Dict]]:
    """The function that tokenizes one validated row of `data_type` (a conversation, or TRL's standard text); with
    `images` (a vision-language model's processor), a row's images expanded into their tokens and kept under
    `IMAGES`, every row having the column."""
    def text(prompt: str, completion: str) -> Optional[Dict]:
        return tokenize_text(tokenizer, prompt, completion, max_length)

    def image_tokens(row: Dict) -> Optional[ImageTokens]:
        return None if images is None else ImageTokens(images.image_token_id, tuple(images.token_counts(row.get(IMAGES, []))))

    def with_images(encoded: Optional[Dict], row: Dict, tokens: Optional[ImageTokens], *sides: str) -> Optional[Dict]:
        """`encoded` with the images its ids hold whole (every side the same; else the row is dropped)."""
        if encoded is None or tokens is None:
            return encoded
        kept = {len(tokens.spans(encoded[f"{side}input_ids"])) for side in sides or ("",)}
        return None if len(kept) > 1 else {**encoded, IMAGES: row.get(IMAGES, [])[:kept.pop()]}

    def sft(row: Dict) -> Optional[Dict]:
        if "completion_text" in row:
            return with_images(text(row["prompt_text"], row["completion_text"]), row, image_tokens(row))
        tokens = image_tokens(row)
        encoded = tokenize_conversation(tokenizer, row["messages"], max_length, label_from=row.get("label_from", 0),
                                        tools=row.get("tools"), image_tokens=tokens)
        return with_images(encoded, row, tokens)

    def preference(row: Dict) -> Optional[Dict]:
        encoded = preference_pair(row)
        return encoded if encoded is None or "margin" not in row else {**encoded, "margin": row["margin"]}

    def preference_pair(row: Dict) -> Optional[Dict]:
        if "prompt_text" not in row:
            tokens = image_tokens(row)
            encoded = tokenize_preference(tokenizer, row["context"], row["chosen"], row["rejected"], max_length, tokens)
            return with_images(encoded, row, tokens, "chosen_", "rejected_")
        sides = {side: text(row["prompt_text"], row[f"{side}_text"]) for side in ("chosen", "rejected")}
        if any(encoded is None for encoded in sides.values()):
            return None
        encoded = {f"{side}_{name}": values for side, encoded in sides.items() for name, values in encoded.items()}
        return with_images(encoded, row, image_tokens(row), "chosen_", "rejected_")

    def kto(row: Dict) -> Optional[Dict]:
        if "prompt_text" not in row:
            return tokenize_kto(tokenizer, row["context"], row["completion"], row["label"], max_length)
        encoded = text(row["prompt_text"], row["completion_text"])
        if encoded is None:
            return None
        start = next(i for i, label in enumerate(encoded["labels"]) if label != IGNORE_INDEX)
        return {**encoded, "prompt_length": start, "desirable": bool(row["label"])}

    def prm(row: Dict) -> Optional[Dict]:
        return tokenize_steps(tokenizer, row["prompt_text"], row["steps"], row["step_labels"], max_length)

    def prompt(row: Dict) -> Optional[Dict]:
        tokens = image_tokens(row)
        return with_images(encode_prompt(tokenizer, row, max_length, tokens), row, tokens)

    encoders = {"sft": sft, "preference": preference, "kto": kto, "prm": prm}
    return encoders.get(data_type, prompt)


CUT = "coati_cut"
"""Set by an encoder on a row it kept but shortened to `max_length`: counted by `_prepare`, then removed."""
PROMPT_COLUMN = "prompt"
"""The prompt as the data gave it, JSON-encoded (text, or a message list), for reward functions (TRL passes them
the prompts in the dataset's own format)."""


def encode_prompt(tokenizer: PreTrainedTokenizerBase, row: Dict, max_length: int,
                  image_tokens: Optional[ImageTokens] = None) -> Optional[Dict]:
    """The prompt (messages rendered with the generation prompt; standard text as it is), left-truncated to
    `max_length`; the prompt itself kept as `PROMPT_COLUMN`, other fields kept. A prompt with images
    (`image_tokens`) is never cut (its images are at its start): one longer than `max_length` is dropped."""
    if "prompt_text" in row:
        ids, prompt = tokenizer(row["prompt_text"], add_special_tokens=True)["input_ids"], row["prompt_text"]
    else:
        ids, prompt = tokenizer.apply_chat_template(row["messages"], tokenize=True, add_generation_prompt=True), row["messages"]
    if image_tokens:
        ids, _ = image_tokens.expand(ids, ids, IGNORE_INDEX)
        if len(ids) > max_length:
            return None
    extra = {k: v for k, v in row.items() if k not in ("messages", "prompt_text", IMAGES)}
    encoded = {"input_ids": ids[-max_length:], **extra, PROMPT_COLUMN: json.dumps(prompt)}
    return {**encoded, CUT: True} if len(ids) > max_length else encoded


def prepare_dataset(inputs: Sequence[PathLike], data_type: str, tokenizer: PreTrainedTokenizerBase, max_length: int,
                    out_dir: PathLike, skip_invalid: bool = False, layout: OutputLayout = OutputLayout(),
                    system_message: Optional[str] = None, part: DataPart = DataPart(),
                    images: Optional[ImageProcessing] = None) -> Dict[str, int]:
    """Validate, tokenize and save (as `layout` says); returns rows read, kept, dropped by truncation, left out by
    sampling, and skipped as invalid. `system_message` opens every conversation that has no system turn of its own
    (ColossalChat's template config field); `part` (split, configuration, datasets' cache) as `load_rows` takes it;
    `images`, a vision-language model's processor (None: a text model's folder, which cannot take rows with
    images)."""
    layout.check_free(out_dir)
    rows, skipped = load_rows(inputs, data_type, skip_invalid, part)
    if images is None and any(row.get(IMAGES) for row in rows):
        raise CoatiUsageError("the data has images, and the tokenizer's folder has no image processor "
                              "(preprocessor_config.json): images need a vision-language model's folder (Qwen2-VL, "
                              "Qwen2.5-VL, LLaVA)")
    if system_message is not None:
        rows = [with_system_message(row, data_type, system_message) for row in rows]
    encode = encoder(data_type, tokenizer, max_length, images)
    counts = {**_prepare(rows, encode, out_dir, layout, readable_fields(data_type, tokenizer)), "skipped": skipped}
    folders = [Path(out_dir), *(sorted(Path(out_dir).glob(f"{PART_PREFIX}*")) if layout.part_folders else [])]
    extra = {LIMITS_INFO: images.limits.as_info()} if images is not None else {}
    for folder in folders:
        _write_info(folder, data_type, max_length, {**counts, **extra})
    return counts


CONVERSATION_FIELDS = {"sft": "messages", "prompt": "messages", "preference": "context", "kto": "context"}
"""Where a validated row of each type keeps the turns before its response."""


def with_system_message(row: Dict, data_type: str, message: str) -> Dict:
    """`row` with `message` as its first, system turn, unless it has a system turn already or is TRL's standard
    text (which takes no template)."""
    field = CONVERSATION_FIELDS[data_type]
    turns = row.get(field)
    if not turns or turns[0]["role"] == "system":
        return row
    shifted = {"label_from": row["label_from"] + 1} if "label_from" in row else {}
    return {**row, field: [{"role": "system", "content": message}, *turns], **shifted}


def readable_fields(data_type: str, tokenizer: PreTrainedTokenizerBase) -> Callable[[Dict], Dict]:
    """The decoded text ColossalChat's prepare_dataset.py writes beside each row of its JSONL parts (and its
    `verify_chat_data.py` reads): the whole input, and each run of label tokens as one string."""
    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    def label_runs(labels: Sequence[int]) -> List[str]:
        runs, run = [], []
        for label in [*labels, IGNORE_INDEX]:
            if label != IGNORE_INDEX:
                run.append(label)
            elif run:
                runs.append(decode(run))
                run = []
        return runs

    def fields(row: Dict) -> Dict:
        return {**text_fields(row), **({IMAGES: [f"<image: {len(data)} bytes>" for data in row[IMAGES]]}
                                        if IMAGES in row else {})}

    def text_fields(row: Dict) -> Dict:
        if data_type == "sft":
            return {"inputs_decode": decode(row["input_ids"]), "labels_decode": label_runs(row["labels"])}
        if data_type == "preference":
            return {f"{side}_{name}": value for side in ("chosen", "rejected")
                    for name, value in (("inputs_decode", decode(row[f"{side}_input_ids"])),
                                        ("label_decode", label_runs(row[f"{side}_labels"])))}
        if data_type == "kto":
            return {"input_id_decode": decode(row["input_ids"]), "completion_decode": "".join(label_runs(row["labels"])),
                    "label": row["desirable"]}
        return {"inputs_decode": decode(row["input_ids"])}

    return fields


def prepare_sft(data_files: Sequence[PathLike], tokenizer: PreTrainedTokenizerBase, max_length: int,
                out_dir: PathLike) -> Dict[str, int]:
    return prepare_dataset(data_files, "sft", tokenizer, max_length, out_dir)


def prepare_preference(data_files: Sequence[PathLike], tokenizer: PreTrainedTokenizerBase, max_length: int,
                       out_dir: PathLike) -> Dict[str, int]:
    return prepare_dataset(data_files, "preference", tokenizer, max_length, out_dir)


def load_prepared(paths: Sequence[PathLike], data_type: Optional[str] = None) -> Dataset:
    """Prepared datasets written by `save_to_disk`, concatenated in order; a folder of ColossalChat's
    `part-NNNNN` parts stands for its parts. With `data_type`, a folder
    prepared as another type is refused by name. Columns that only some folders have (a prompt set's
    ground-truth fields) are kept, as None where a folder lacks them."""
    missing = [str(p) for p in paths if not Path(p).is_dir()]
    if missing:
        raise CoatiUsageError(f"prepared dataset not found: {', '.join(missing)} (run prepare_dataset.py first)")
    paths = [folder for path in paths for folder in (prepared_folders(path) or [Path(path)])]
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


NEEDED_COLUMN = {"sft": "labels", "preference": "chosen_labels", "kto": "prompt_length", "prompt": "input_ids",
                 "prm": "labels"}
"""The column each kind of prepared data cannot train without."""


def _refuse_colossalchat_data(path: PathLike, columns: Sequence[str], data_type: Optional[str]) -> None:
    """A folder ColossalChat's prepare_dataset.py wrote with its own tokenizers (its masks and decoded text, not
    coati's labels) is refused with how to prepare it again: the same raw JSONL goes through coati's script.
    Its SFT and prompt data (the same input_ids and labels), and data its script wrote with coati's tokenizers,
    load as they are."""
    found = next((c for c in columns if c.endswith(COLOSSALCHAT_COLUMNS)), None)
    needed = [NEEDED_COLUMN[data_type]] if data_type else list(NEEDED_COLUMN.values())
    if prepared_type(path) or not found or any(c in columns for c in needed):
        return
    kind = data_type or "sft|preference|prompt|kto"
    raise CoatiUsageError(f"dataset {path} was prepared by ColossalChat's prepare_dataset.py (it has a {found!r} "
                          f"column); prepare the raw data again with examples/data_preparation_scripts/"
                          f"prepare_dataset.py --type {kind}, which reads the same JSONL")


def _with_columns(dataset: Dataset, columns: Sequence[str]) -> Dataset:
    for name in columns:
        if name not in dataset.column_names:
            dataset = dataset.add_column(name, [None] * len(dataset))
    return dataset.select_columns(list(columns))
