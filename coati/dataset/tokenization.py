"""Chat-template tokenization with loss masks: labels cover assistant tokens only, end of turn included."""
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from coati.utils.errors import CoatiUsageError

IGNORE_INDEX = -100


def load_tokenizer(path: str, trust_remote_code: bool = False, template_config: Optional[str] = None) -> PreTrainedTokenizerBase:
    """The tokenizer in `path` (EOS standing in for a missing pad token), with the chat template and
    optional end-of-turn token of the JSON `template_config` when given."""
    if not Path(path).is_dir():
        raise CoatiUsageError(f"tokenizer directory {path} does not exist or is not a directory")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if template_config:
        config = json.loads(Path(template_config).read_text())
        if "chat_template" not in config:
            raise CoatiUsageError(f"{template_config}: field 'chat_template' is missing")
        tokenizer.chat_template = config["chat_template"]
        if config.get("end_of_turn_token"):
            tokenizer.eos_token = config["end_of_turn_token"]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def assistant_spans(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Dict[str, str]]) -> List[tuple]:
    """Character spans of each assistant turn in the rendered conversation, end-of-turn token included.

    Rendering message prefixes finds where each turn starts and ends, so any template whose renders
    are prefix-consistent works, whatever its markup.
    """
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(tokenizer.apply_chat_template(list(messages[:i]), tokenize=False, add_generation_prompt=True))
        rendered = tokenizer.apply_chat_template(list(messages[: i + 1]), tokenize=False)
        eos = tokenizer.eos_token or ""
        end = rendered.rfind(eos, start) + len(eos) if eos and eos in rendered[start:] else len(rendered.rstrip())
        spans.append((start, end))
    return spans


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Dict[str, str]], max_length: int
) -> Optional[Dict[str, List[int]]]:
    """`input_ids` and `labels` for one conversation, truncated to `max_length` tokens from the right.

    Returns None when truncation leaves no assistant token to learn from.
    """
    text = tokenizer.apply_chat_template(list(messages), tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                        truncation=True, max_length=max_length)
    spans = assistant_spans(tokenizer, messages)
    labels = [
        token if any(s <= start and end <= e for s, e in spans) else IGNORE_INDEX
        for token, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"])
    ]
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": encoded["input_ids"], "labels": labels}


def tokenize_preference(
    tokenizer: PreTrainedTokenizerBase,
    context: Sequence[Dict[str, str]],
    chosen: Sequence[Dict[str, str]],
    rejected: Sequence[Dict[str, str]],
    max_length: int,
) -> Optional[Dict[str, List[int]]]:
    """`chosen_*` and `rejected_*` input_ids/labels for context+chosen and context+rejected.

    Returns None when truncation leaves either side without a response token.
    """
    sides = {name: tokenize_conversation(tokenizer, list(context) + list(turns), max_length)
             for name, turns in (("chosen", chosen), ("rejected", rejected))}
    if any(encoded is None for encoded in sides.values()):
        return None
    return {f"{name}_{field}": values for name, encoded in sides.items() for field, values in encoded.items()}
