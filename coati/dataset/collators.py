"""Collators that pad each batch to its own longest sequence (never to --max_length)."""
from typing import Dict, List, Sequence

import torch

from .tokenization import IGNORE_INDEX


def pad_sequences(sequences: Sequence[Sequence[int]], value: int, left: bool = False) -> torch.Tensor:
    """A (batch, longest) long tensor of `sequences` padded with `value` on the right (or left)."""
    longest = max(len(s) for s in sequences)
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
