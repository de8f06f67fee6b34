"""ColossalChat's data loading names (`coati.dataset.loader`): its collators' constructors and batch keys, as thin
adapters onto coati's collators (which pad to the longest row of a batch, not to `max_length`, and cut rows longer
than `max_length`), and `load_tokenized_dataset` onto `load_prepared`. `RawConversationDataset`, which only
ColossalChat's `lora_finetune.py` reads, is `coati.compat`'s.

Rows are coati's prepared rows (`labels` with -100 outside the response); ColossalChat's loss masks are read off
them: a token is in the loss where its label is.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from .collators import KTOCollator, PreferenceCollator, PromptCollator, SupervisedCollator
from .prepare import load_prepared
from .sampler import StatefulDistributedSampler
from .tokenization import IGNORE_INDEX

PathType = Union[str, Path]


def load_tokenized_dataset(dataset_paths: Union[PathType, Sequence[PathType]], mode: str = "train",
                           **kwargs: Any) -> Optional[Dataset]:
    """The prepared datasets at `dataset_paths` (a folder of ColossalChat's parts, or the parts), concatenated;
    None for no paths. `mode` is ColossalChat's and names no split here: prepared folders hold one."""
    if not dataset_paths:
        return None
    paths = [dataset_paths] if isinstance(dataset_paths, (str, Path)) else list(dataset_paths)
    return load_prepared(paths)


def _loss_mask(labels: torch.Tensor) -> torch.Tensor:
    return labels.ne(IGNORE_INDEX)


@dataclass
class DataCollatorForSupervisedDataset:
    """SFT rows -> `input_ids`, `attention_mask` (bool) and `labels`."""

    tokenizer: PreTrainedTokenizerBase
    max_length: int = 4096
    ignore_index: int = IGNORE_INDEX

    def __call__(self, instances: Sequence[Dict[str, List[int]]]) -> Dict[str, torch.Tensor]:
        batch = SupervisedCollator(self.tokenizer.pad_token_id, self.max_length)(list(instances))
        labels = batch["labels"].masked_fill(batch["labels"].eq(IGNORE_INDEX), self.ignore_index)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"].bool(), "labels": labels}


@dataclass
class DataCollatorForPromptDataset(DataCollatorForSupervisedDataset):
    """Prompt rows -> left-padded `input_ids`, `attention_mask` (bool) and `gt_answer` (None where a row has none)."""

    def __call__(self, instances: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        batch = PromptCollator(self.tokenizer.pad_token_id, self.max_length)(
            [{"input_ids": row["input_ids"]} for row in instances])
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"].bool(),
                "gt_answer": [row.get("gt_answer") for row in instances]}


@dataclass
class DataCollatorForPreferenceDataset:
    """Preference rows -> `chosen_`/`reject_` `input_ids`, `attention_mask` and `loss_mask` (bool)."""

    tokenizer: PreTrainedTokenizerBase
    max_length: int = 4096

    def __call__(self, instances: Sequence[Dict[str, List[int]]]) -> Dict[str, torch.Tensor]:
        batch = PreferenceCollator(self.tokenizer.pad_token_id, self.max_length)(list(instances))
        out = {}
        for side, name in (("chosen", "chosen"), ("rejected", "reject")):
            out[f"{name}_input_ids"] = batch[f"{side}_input_ids"]
            out[f"{name}_attention_mask"] = batch[f"{side}_attention_mask"].bool()
            out[f"{name}_loss_mask"] = _loss_mask(batch[f"{side}_labels"])
        return out


@dataclass
class DataCollatorForKTODataset:
    """KTO rows -> `input_ids`, `attention_mask`, `loss_mask`, `label`, and the mismatched `kl_` batch (each row's
    prompt with another row's completion)."""

    tokenizer: PreTrainedTokenizerBase
    max_length: int = 4096
    ignore_index: int = IGNORE_INDEX

    def __call__(self, instances: Sequence[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
        batch = KTOCollator(self.tokenizer.pad_token_id, self.max_length)(list(instances))
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"].bool(),
                "loss_mask": _loss_mask(batch["labels"]), "label": batch["desirable"],
                "kl_input_ids": batch["kl_input_ids"], "kl_attention_mask": batch["kl_attention_mask"].bool(),
                "kl_loss_mask": _loss_mask(batch["kl_labels"])}


COLOSSALCHAT_ONLY = ("RawConversationDataset", "apply_chat_template_and_mask")
"""What only ColossalChat's `lora_finetune.py` imports from here: `coati.compat.raw_conversation`'s, on first use."""


def __getattr__(name: str):
    if name not in COLOSSALCHAT_ONLY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("coati.compat.raw_conversation"), name)


__all__ = ["DataCollatorForKTODataset", "DataCollatorForPreferenceDataset", "DataCollatorForPromptDataset",
           "DataCollatorForSupervisedDataset", "StatefulDistributedSampler", "load_tokenized_dataset",
           *COLOSSALCHAT_ONLY]
