"""ColossalChat's `coati.dataset.loader.RawConversationDataset`, read by its `lora_finetune.py`: a JSONL file of
conversations tokenized on first access, each message rendered on its own after the system prompt, left-padded (or
cut) to `max_length`, the assistant's messages the labels. A row may also be an RL prompt, `{"messages": ...,
"gt_answer": ...}` or with `test_cases`, which come through. coati's own SFT reads conversations with `coati prepare`."""
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch
from torch.utils.data import Dataset

THINK_ANSWER_PROMPT = (
    "You are a helpful assistant. Think the problem through first, inside <think> </think>, then give only the final "
    "answer, without explanation, inside <answer> </answer>, e.g. <think> the reasoning </think><answer> 123 </answer>."
)
"""The system prompt where none is given (coati's wording of ColossalChat's think-then-answer instruction)."""
PASSED_THROUGH = ("gt_answer", "test_cases")
"""An RL row's fields that come through with its tokens."""


def apply_chat_template_and_mask(tokenizer: Any, chat: Union[List[Dict[str, str]], Dict[str, Any]],
                                 max_length: Optional[int] = None, system_prompt: Optional[str] = None,
                                 padding: bool = True, truncation: bool = True,
                                 ignore_idx: int = -100) -> Dict[str, Any]:
    """One row as ColossalChat tokenizes it: every message rendered with the system prompt before it (and the
    generation prompt after it, a BOS token after the first message dropped), then padded on the left to
    `max_length` and cut to it from the right; labels are the assistant messages' tokens, `ignore_idx` elsewhere
    (ColossalChat's default, the label Hugging Face's losses skip)."""
    system = {"role": "system", "content": THINK_ANSWER_PROMPT if system_prompt is None else system_prompt}
    extra = {key: chat[key] for key in PASSED_THROUGH if isinstance(chat, dict) and chat.get(key) is not None}
    messages = [chat["messages"]] if isinstance(chat, dict) else chat
    tokens: List[int] = []
    in_loss: List[bool] = []
    for index, message in enumerate(messages):
        rendered = tokenizer.apply_chat_template([system, message], tokenize=True, add_generation_prompt=True)
        if index > 0 and rendered and rendered[0] == tokenizer.bos_token_id:
            rendered = rendered[1:]
        tokens += rendered
        in_loss += [message["role"] == "assistant"] * len(rendered)
    attention = [1] * len(tokens)
    if max_length is not None and padding and len(tokens) < max_length:
        missing = max_length - len(tokens)
        tokens, in_loss, attention = ([tokenizer.pad_token_id] * missing + tokens, [False] * missing + in_loss,
                                      [0] * missing + attention)
    if max_length is not None and truncation:
        tokens, in_loss, attention = tokens[:max_length], in_loss[:max_length], attention[:max_length]
    input_ids = torch.tensor(tokens, dtype=torch.long)
    labels = input_ids.masked_fill(~torch.tensor(in_loss, dtype=torch.bool), ignore_idx)
    return {"input_ids": input_ids, "attention_mask": torch.tensor(attention, dtype=torch.long), "labels": labels,
            **extra}


class RawConversationDataset(Dataset):
    """The rows of the JSONL file `input_file`, each tokenized (`apply_chat_template_and_mask`) when first read."""

    def __init__(self, tokenizer: Any, input_file: Union[str, Path], max_length: int,
                 system_prompt: Optional[str] = None) -> None:
        self.tokenizer, self.max_length, self.system_prompt = tokenizer, max_length, system_prompt
        lines = Path(input_file).read_text(encoding="utf-8").splitlines()
        self.raw_texts = [json.loads(line) for line in lines if line.strip()]
        self.tokenized_texts: List[Optional[Dict[str, Any]]] = [None] * len(self.raw_texts)

    def __len__(self) -> int:
        return len(self.raw_texts)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        if self.tokenized_texts[index] is None:
            self.tokenized_texts[index] = apply_chat_template_and_mask(self.tokenizer, self.raw_texts[index],
                                                                       self.max_length, self.system_prompt)
        return self.tokenized_texts[index]
