"""ColossalChat's row tokenizers (`tokenize_sft`, `tokenize_rlhf`, `tokenize_prompt`, `tokenize_kto`), for
`datasets.map(fn, fn_kwargs={"tokenizer": ..., "conversation_template": ..., "max_length": ...})` as its
prepare_dataset.py calls them. Each validates the raw row and tokenizes it as coati's own preparation does (its
columns, so the result trains here), adds ColossalChat's decoded text fields, and returns every field as None for
a row that truncation leaves without a response (ColossalChat's scripts filter those out).
"""
from typing import Any, Dict, Optional

from transformers import PreTrainedTokenizerBase

from .conversation import Conversation
from .prepare import encoder, readable_fields, with_system_message
from .validation import VALIDATORS

EMPTY = {
    "sft": ("input_ids", "labels", "inputs_decode", "labels_decode", "seq_length", "seq_category"),
    "preference": ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels", "chosen_inputs_decode",
                   "chosen_label_decode", "rejected_inputs_decode", "rejected_label_decode"),
    "prompt": ("input_ids", "inputs_decode", "seq_length", "seq_category"),
    "kto": ("input_ids", "labels", "prompt_length", "desirable", "input_id_decode", "completion_decode", "label"),
}
"""The fields each kind returns, all None for a dropped row."""


def _tokenize(data_type: str, data_point: Dict[str, Any], tokenizer: PreTrainedTokenizerBase,
              conversation_template: Optional[Conversation], max_length: int) -> Dict[str, Any]:
    row = VALIDATORS[data_type](dict(data_point), "data_point")      # datasets.map hands a row that is not a dict
    if conversation_template is not None:
        tokenizer.chat_template = conversation_template.chat_template
        if conversation_template.system_message is not None:
            row = with_system_message(row, data_type, conversation_template.system_message)
    encoded = encoder(data_type, tokenizer, max_length)(row)
    if encoded is None:
        return dict.fromkeys(EMPTY[data_type])
    encoded.update(readable_fields(data_type, tokenizer)(encoded))
    if data_type in ("sft", "prompt"):
        encoded.update(seq_length=len(encoded["input_ids"]), seq_category=str(data_point.get("category", "None")))
    return encoded


def tokenize_sft(data_point: Dict[str, Any], tokenizer: PreTrainedTokenizerBase,
                 conversation_template: Optional[Conversation] = None, max_length: int = 4096) -> Dict[str, Any]:
    """A conversation -> input_ids and labels (assistant turns only), with decoded text."""
    return _tokenize("sft", data_point, tokenizer, conversation_template, max_length)


def tokenize_rlhf(data_point: Dict[str, Any], tokenizer: PreTrainedTokenizerBase,
                  conversation_template: Optional[Conversation] = None, max_length: int = 4096) -> Dict[str, Any]:
    """A preference pair (`context`, `chosen`, `rejected`) -> chosen_/rejected_ input_ids and labels."""
    return _tokenize("preference", data_point, tokenizer, conversation_template, max_length)


def tokenize_prompt(data_point: Dict[str, Any], tokenizer: PreTrainedTokenizerBase,
                    conversation_template: Optional[Conversation] = None, max_length: int = 4096) -> Dict[str, Any]:
    """A prompt (a final assistant turn dropped) -> input_ids with the generation prompt; other fields kept."""
    return _tokenize("prompt", data_point, tokenizer, conversation_template, max_length)


def tokenize_kto(data_point: Dict[str, Any], tokenizer: PreTrainedTokenizerBase,
                 conversation_template: Optional[Conversation] = None, max_length: int = 4096) -> Dict[str, Any]:
    """An unpaired example (`prompt`, `completion`, `label`) -> input_ids, labels, prompt_length, desirable."""
    return _tokenize("kto", data_point, tokenizer, conversation_template, max_length)

