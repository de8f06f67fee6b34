"""Collators that pad each batch to its own longest sequence (never to --max_length)."""
from typing import Dict, List, Optional, Sequence

import torch

from .tokenization import IGNORE_INDEX


def pad_sequences(sequences: Sequence[Sequence[int]], value: int, left: bool = False,
                  length: Optional[int] = None) -> torch.Tensor:
    """A (batch, length) long tensor of `sequences` padded with `value` on the right (or left);
    `length` defaults to the longest sequence."""
    longest = length or max(len(s) for s in sequences)
    rows = [([value] * (longest - len(s)) + list(s)) if left else (list(s) + [value] * (longest - len(s)))
            for s in sequences]
    return torch.tensor(rows, dtype=torch.long)


class SupervisedCollator:
    """Batches of `input_ids`/`labels` rows -> input_ids, attention_mask and labels, right-padded."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, rows: List[Dict[str, Sequence[int]]]) -> Dict[str, torch.Tensor]:
        input_ids = [row["input_ids"] for row in rows]
        return {
            "input_ids": pad_sequences(input_ids, self.pad_token_id),
            "attention_mask": pad_sequences([[1] * len(ids) for ids in input_ids], 0),
            "labels": pad_sequences([row["labels"] for row in rows], IGNORE_INDEX),
        }


class PreferenceCollator:
    """Rows of chosen_/rejected_ input_ids and labels -> right-padded tensors, both sides padded to one
    length so a trainer can concatenate them into a single forward."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, rows: List[Dict[str, Sequence[int]]]) -> Dict[str, torch.Tensor]:
        longest = max(len(row[f"{side}_input_ids"]) for row in rows for side in ("chosen", "rejected"))
        batch = {}
        for side in ("chosen", "rejected"):
            ids = [row[f"{side}_input_ids"] for row in rows]
            batch[f"{side}_input_ids"] = pad_sequences(ids, self.pad_token_id, length=longest)
            batch[f"{side}_attention_mask"] = pad_sequences([[1] * len(i) for i in ids], 0, length=longest)
            batch[f"{side}_labels"] = pad_sequences([row[f"{side}_labels"] for row in rows], IGNORE_INDEX, length=longest)
        return batch
