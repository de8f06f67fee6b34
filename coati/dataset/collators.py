"""Collators that pad each batch to its own longest sequence (never to --max_length), or pack it.

`max_length` > 0 cuts longer rows first, the same way preparation does: training rows from the right
(a row cut before its response then has no target tokens and adds nothing to the loss), prompts from
the left. With `packing` the training collators concatenate a batch's rows into one padding-free sequence
(`pack_sequences`); `coati.models.packing` runs the model on it.
"""
from typing import Any, Dict, List, Optional, Sequence

import torch

from coati.utils.errors import CoatiUsageError

from .tokenization import IGNORE_INDEX
from .vision import IMAGES, ImageProcessing


def pad_sequences(sequences: Sequence[Sequence[int]], value: int, left: bool = False,
                  length: Optional[int] = None) -> torch.Tensor:
    """A (batch, length) long tensor of `sequences` padded with `value` on the right (or left);
    `length` defaults to the longest sequence."""
    longest = length or max(len(s) for s in sequences)
    rows = [([value] * (longest - len(s)) + list(s)) if left else (list(s) + [value] * (longest - len(s)))
            for s in sequences]
    return torch.tensor(rows, dtype=torch.long)


ROWS = "rows"
"""Key of a packed batch's count of dataset rows (a preference row packs two sequences)."""


def pack_sequences(ids: List[Sequence[int]], labels: List[Sequence[int]], prefix: str = "",
                   first_positions: Optional[Sequence[int]] = None) -> Dict[str, torch.Tensor]:
    """Pieces concatenated into one (1, total) sequence, under `prefix`: input_ids, labels, position_ids, and
    `seq_lens` (the pieces' lengths). A piece's positions start at 0 (a row), or at its `first_positions` entry q
    (a branch that sees the first q tokens of the row before it; `coati.models.packing`). Each piece's first label
    is ignored, so no row is predicted from the end of the row before it, as no row is from padding unpacked."""
    first_positions = first_positions or [0] * len(ids)
    flat_labels: List[int] = []
    for row in labels:
        flat_labels += [IGNORE_INDEX, *row[1:]]
    positions = [p for row, first in zip(ids, first_positions) for p in range(first, first + len(row))]
    return {
        f"{prefix}input_ids": torch.tensor([[t for row in ids for t in row]], dtype=torch.long),
        f"{prefix}labels": torch.tensor([flat_labels], dtype=torch.long),
        f"{prefix}position_ids": torch.tensor([positions], dtype=torch.long),
        f"{prefix}seq_lens": torch.tensor([len(row) for row in ids], dtype=torch.long),
    }


def shared_prompt(chosen: Sequence[int], rejected: Sequence[int], rejected_labels: Sequence[int]) -> int:
    """How many leading tokens a pair's rejected row can take from its chosen row: their common prefix, up to the
    rejected row's first label (its log-prob counts from there) and short of either row's end; 0 when under 2."""
    limit = min(len(chosen) - 1, len(rejected) - 1,
                next((i for i, label in enumerate(rejected_labels) if label != IGNORE_INDEX), len(rejected)))
    shared = 0
    while shared < limit and chosen[shared] == rejected[shared]:
        shared += 1
    return shared if shared > 1 else 0


def row_ends(seq_lens: torch.Tensor) -> torch.Tensor:
    """Index of each packed piece's last token."""
    return seq_lens.cumsum(0) - 1


def packed_tokens(batch: Dict[str, Any]) -> int:
    """The tokens of the rows a packed batch holds (every `*seq_lens` group), a shared prompt counted in each row it
    belongs to, as a padded batch counts them: a piece ends at its row's length minus one."""
    total = 0
    for key in (k for k in batch if k.endswith("seq_lens")):
        ends = row_ends(batch[key])
        total += int((batch[key[:-len("seq_lens")] + "position_ids"][0, ends] + 1).sum())
    return total


def batch_rows(batch: Dict[str, Any]) -> int:
    """How many dataset rows `batch` holds, packed or padded."""
    if ROWS in batch:
        return int(batch[ROWS])
    return int(next(v for v in batch.values() if isinstance(v, torch.Tensor)).size(0))


class _Collator:
    """`loss_on_every_token` (ColossalChat's `--disable_loss_mask`) makes every token of a row a label, the
    prompt's included, instead of the response's alone. `packing` packs training rows instead of padding them;
    `share_prompt` lets a packed pair's responses share their prompt (off for attention that knows no branches)."""

    def __init__(self, pad_token_id: int, max_length: int = 0, loss_on_every_token: bool = False,
                 packing: bool = False, share_prompt: bool = True) -> None:
        self.pad_token_id = pad_token_id
        self.max_length = max_length
        self.loss_on_every_token = loss_on_every_token
        self.packing = packing
        self.share_prompt = share_prompt

    def _cut(self, sequence: Sequence[int], keep_end: bool = False) -> Sequence[int]:
        """`sequence` cut to `max_length`: its start kept, or its end with `keep_end`."""
        if not self.max_length:
            return sequence
        return sequence[-self.max_length:] if keep_end else sequence[:self.max_length]

    def _column(self, rows: List[Dict[str, Sequence[int]]], key: str) -> List[Sequence[int]]:
        """`key` of every row, cut to `max_length` (labels are the input ids with `loss_on_every_token`)."""
        if self.loss_on_every_token and key.endswith("labels"):
            key = key[:-len("labels")] + "input_ids"
        return [self._cut(row[key]) for row in rows]

    def _count(self, rows: List[Any]) -> Dict[str, int]:
        """The dataset-row count a packed batch carries (`ROWS`); nothing for a padded one."""
        return {ROWS: len(rows)} if self.packing else {}

    def _batch(self, ids: List[Sequence[int]], labels: List[Sequence[int]], prefix: str = "") -> Dict[str, torch.Tensor]:
        """Right-padded input_ids, attention_mask and labels under `prefix`; packed with `packing`."""
        if self.packing:
            return pack_sequences(ids, labels, prefix)
        return {
            f"{prefix}input_ids": pad_sequences(ids, self.pad_token_id),
            f"{prefix}attention_mask": pad_sequences([[1] * len(i) for i in ids], 0),
            f"{prefix}labels": pad_sequences(labels, IGNORE_INDEX),
        }


class SupervisedCollator(_Collator):
    """Batches of `input_ids`/`labels` rows -> input_ids, attention_mask and labels, right-padded."""

    def __call__(self, rows: List[Dict[str, Sequence[int]]]) -> Dict[str, Any]:
        return {**self._batch(self._column(rows, "input_ids"), self._column(rows, "labels")), **self._count(rows)}


class KTOCollator(_Collator):
    """KTO rows -> input_ids, attention_mask, labels and `desirable` (bool), plus the `kl_` batch that
    pairs each row's prompt with the next row's completion: mismatched pairs for KTO's reference point."""

    def __call__(self, rows: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
        kl_ids, kl_labels = [], []
        for row, other in zip(rows, rows[1:] + rows[:1]):
            prompt, start = row["prompt_length"], other["prompt_length"]
            kl_ids.append(self._cut(row["input_ids"][:prompt] + other["input_ids"][start:]))
            kl_labels.append(self._cut([IGNORE_INDEX] * prompt + other["labels"][start:]))
        return {
            **self._batch(self._column(rows, "input_ids"), self._column(rows, "labels")),
            **self._batch(kl_ids, kl_labels, prefix="kl_"),
            "desirable": torch.tensor([bool(row["desirable"]) for row in rows]),
            **self._count(rows),
        }


class PreferenceCollator(_Collator):
    """Rows of chosen_/rejected_ input_ids and labels -> right-padded tensors, both sides padded to one
    length so a trainer can concatenate them into a single forward; with `packing`, one packed sequence of
    each pair's chosen then rejected row, the rejected row a branch that starts after the prompt they share
    (`shared_prompt`). Precomputed reference log-prob columns (`*_ref_logps`) and TRL's reward-model `margin` come
    through as float tensors."""

    def __call__(self, rows: List[Dict[str, Sequence[int]]]) -> Dict[str, Any]:
        ids = {side: self._column(rows, f"{side}_input_ids") for side in ("chosen", "rejected")}
        batch = self._packed_pairs(rows, ids) if self.packing else self._padded_pairs(rows, ids)
        for key in rows[0]:
            if key.endswith("_ref_logps"):
                batch[key] = torch.tensor([row[key] for row in rows], dtype=torch.float32)
        if "margin" in rows[0]:   # None for the rows of a dataset without margins, trained beside one with them
            batch["margin"] = torch.tensor([row["margin"] or 0.0 for row in rows], dtype=torch.float32)
        return batch

    def _packed_pairs(self, rows: List[Dict[str, Sequence[int]]], ids: Dict[str, List[Sequence[int]]]) -> Dict[str, Any]:
        pieces: List[Sequence[int]] = []
        labels: List[Sequence[int]] = []
        firsts: List[int] = []
        for chosen, chosen_labels, rejected, rejected_labels in zip(
                ids["chosen"], self._column(rows, "chosen_labels"), ids["rejected"], self._column(rows, "rejected_labels")):
            shared = shared_prompt(chosen, rejected, rejected_labels) if self.share_prompt else 0
            first = shared - 1 if shared else 0   # the branch repeats the prompt's last token: it predicts the response
            pieces += [chosen, rejected[first:]]
            labels += [chosen_labels, rejected_labels[first:]]
            firsts += [0, first]
        return {**pack_sequences(pieces, labels, first_positions=firsts), **self._count(rows)}

    def _padded_pairs(self, rows: List[Dict[str, Sequence[int]]], ids: Dict[str, List[Sequence[int]]]) -> Dict[str, Any]:
        longest = max(len(i) for side_ids in ids.values() for i in side_ids)
        batch = {}
        for side, side_ids in ids.items():
            batch[f"{side}_input_ids"] = pad_sequences(side_ids, self.pad_token_id, length=longest)
            batch[f"{side}_attention_mask"] = pad_sequences([[1] * len(i) for i in side_ids], 0, length=longest)
            batch[f"{side}_labels"] = pad_sequences(self._column(rows, f"{side}_labels"), IGNORE_INDEX, length=longest)
        return batch


class PromptCollator(_Collator):
    """Prompt rows -> left-padded input_ids and attention_mask, ready for generation; every other field
    (ground truth for a reward function) comes through as a list. `max_length` keeps a prompt's end."""

    def __call__(self, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
        ids = [self._cut(row["input_ids"], keep_end=True) for row in rows]
        batch: Dict[str, Any] = {
            "input_ids": pad_sequences(ids, self.pad_token_id, left=True),
            "attention_mask": pad_sequences([[1] * len(i) for i in ids], 0, left=True),
        }
        for key in rows[0]:
            if key != "input_ids":
                batch[key] = [row[key] for row in rows]
        return batch


IMAGE_INPUTS = "image_inputs"
"""A prompt row's image inputs (`ImageProcessing.pixel_inputs`), as `PromptRows` makes them from its images."""
PROMPT_FIELDS = ("input_ids", "attention_mask", IMAGES, IMAGE_INPUTS)
"""A prompt batch's columns that are the prompt itself; its other fields (e.g. `gt_answer`) go to the rewards."""


class PromptRows:
    """Prompt rows as rollout workflows take them, unpadded: `input_ids` (`max_length` keeps a prompt's end), with
    `images`, a vision-language model's processor, the row's `IMAGE_INPUTS` and its `IMAGES` (a multi-turn episode
    renders its prompt again; a prompt with images is never cut: one longer than `max_length` is refused), and the
    row's other fields (ground truth for a reward function). The on-policy trainers' prompt loaders and the
    asynchronous prompt stream collate with it: nothing is padded before generation pads what it batches."""

    def __init__(self, max_length: int = 0, images: Optional[ImageProcessing] = None) -> None:
        self.max_length, self.images = max_length, images

    def __call__(self, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        return [self._row(row) for row in rows]

    def _row(self, row: Dict[str, Any]) -> Dict[str, Any]:
        ids = list(row["input_ids"])
        pictures = row.get(IMAGES) or []
        if pictures and self.max_length and len(ids) > self.max_length:
            raise CoatiUsageError(f"--max_length {self.max_length} would cut a prompt with images ({len(ids)} tokens); "
                                  "raise it, or prepare the prompts at this --max_length (such prompts are dropped)")
        images = ({IMAGE_INPUTS: self.images.pixel_inputs(pictures), IMAGES: pictures}
                  if self.images is not None and pictures else {})
        return {"input_ids": ids[-self.max_length:] if self.max_length else ids, **images,
                **{k: v for k, v in row.items() if k not in PROMPT_FIELDS}}


def prompt_rows(batch: Any) -> List[Dict[str, Any]]:
    """A prompt batch's rows as workflows take them: a `PromptRows` batch as it is; a left-padded one
    (`PromptCollator`'s, or ColossalChat's `DataCollatorForPromptDataset`'s) unpadded, its other fields per row."""
    if isinstance(batch, list):
        return batch
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    fields = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in batch.items() if k not in PROMPT_FIELDS}
    return [{"input_ids": ids[i][mask[i]].tolist(), **{k: v[i] for k, v in fields.items()}} for i in range(ids.size(0))]


def both_sides(batch: Dict[str, torch.Tensor], field: str) -> torch.Tensor:
    """`chosen_<field>` and `rejected_<field>` of a preference batch stacked into one batch (chosen first),
    for the single concatenated forward."""
    return torch.cat([batch[f"chosen_{field}"], batch[f"rejected_{field}"]])


class ImageBatches:
    """`collator`'s batches with the rows' images (in row order) as the model's image inputs (`pixel_values`, and
    Qwen2-VL's `image_grid_thw`), made by the processor the image tokens were counted with."""

    def __init__(self, collator: _Collator, images: ImageProcessing) -> None:
        self.collator, self.images = collator, images

    def __call__(self, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
        batch = self.collator(rows)
        for key in (k for k in rows[0] if k.endswith("input_ids")):
            self._check_whole(rows, batch[key], key)
        return {**batch, **self.images.pixel_inputs([data for row in rows for data in row.get(IMAGES) or ()])}

    def _check_whole(self, rows: List[Dict[str, Any]], ids: torch.Tensor, key: str) -> None:
        """Refuses a batch whose --max_length cut took some of an image's tokens (the model needs all of them)."""
        token = self.images.image_token_id
        given = sum(list(row[key]).count(token) for row in rows)
        if given != int((ids == token).sum()):
            raise CoatiUsageError(f"--max_length {self.collator.max_length} cuts into the image tokens of rows "
                                  "prepared longer; prepare the data at this --max_length (preparation cuts images "
                                  "whole) or raise it")


COLLATORS = {"sft": SupervisedCollator, "preference": PreferenceCollator, "prompt": PromptCollator, "kto": KTOCollator,
             "prm": SupervisedCollator}
