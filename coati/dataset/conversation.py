"""ColossalChat's conversation template (`coati.dataset.conversation`): a chat template with the system message
that opens each conversation, the token ids that stop generation, and the text that ends an assistant turn.

`setup_conversation_template` reads ColossalChat's template config, as `prepare_dataset.py
--conversation_template_config` does; `Conversation.get_prompt` renders with the tokenizer's chat template.
"""
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from transformers import PreTrainedTokenizerBase

from coati.utils.errors import CoatiUsageError, warn_user

ROLES = ("user", "assistant")


@dataclass
class Conversation:
    """One conversation under a template; `messages` are its user/assistant turns, the system message apart."""

    tokenizer: PreTrainedTokenizerBase
    system_message: Optional[str]
    chat_template: str
    stop_ids: List[int]
    end_of_assistant: Optional[str] = None
    messages: List[Dict[str, str]] = field(default_factory=list)
    roles = list(ROLES)

    @classmethod
    def from_config(cls, tokenizer: PreTrainedTokenizerBase, config: Dict[str, Any]) -> "Conversation":
        """The template of a config dict (ColossalChat's keys); the tokenizer takes its chat template."""
        tokenizer.chat_template = config["chat_template"]
        return cls(tokenizer, config.get("system_message"), config["chat_template"],
                   list(config.get("stop_ids") or [tokenizer.eos_token_id]), config.get("end_of_assistant"))

    def clear(self) -> None:
        self.messages = []

    def append_message(self, role: str, message: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role {role!r}: a conversation takes {' and '.join(ROLES)} turns")
        self.messages.append({"role": role, "content": message})

    def get_prompt(self, length: Optional[int] = None, add_generation_prompt: bool = False) -> str:
        """The first `length` turns (all by default), after the system message, rendered as text."""
        turns = self.messages[: len(self.messages) if length is None else length]
        system = [] if self.system_message is None else [{"role": "system", "content": self.system_message}]
        return self.tokenizer.apply_chat_template(system + turns, tokenize=False, add_generation_prompt=add_generation_prompt)

    def save_prompt(self) -> str:
        return self.get_prompt()

    def copy(self) -> "Conversation":
        return copy.copy(self)


def setup_conversation_template(tokenizer: PreTrainedTokenizerBase, chat_template_config: Optional[Dict[str, Any]] = None,
                                save_path: Optional[str] = None) -> Conversation:
    """ColossalChat's template from `chat_template_config` (`chat_template` defaults to the tokenizer's own,
    `stop_ids` to its EOS); with `save_path`, the completed config is written there, as ColossalChat does."""
    config = dict(chat_template_config or {})
    if not config.get("chat_template"):
        if not tokenizer.chat_template:
            raise CoatiUsageError("the conversation template config has no chat_template and the tokenizer has none; "
                                  "add a \"chat_template\"")
        config["chat_template"] = tokenizer.chat_template
    if "system_message" not in config:
        warn_user("the conversation template config has no system_message; conversations start without one")
    config.setdefault("stop_ids", [tokenizer.eos_token_id])
    if save_path is not None:
        Path(save_path).parent.mkdir(parents=True, exist_ok=True)
        Path(save_path).write_text(json.dumps(config, indent=4, ensure_ascii=False))
    return Conversation.from_config(tokenizer, config)
