"""Checkpoints that load on their own: the tokenizer written beside each checkpoint's model weights."""
from pathlib import Path
from typing import Any

from .base import Callback


class TokenizerInCheckpoints(Callback):
    """After each checkpoint, the run's tokenizer (and its chat template) in its `modeling` folder on the master, so
    `from_pretrained(checkpoint/modeling)` loads model and tokenizer, and `--pretrain` may name the checkpoint."""

    def __init__(self, tokenizer: Any, is_master: bool) -> None:
        self.tokenizer, self.is_master = tokenizer, is_master

    def on_checkpoint_saved(self, path: str) -> None:
        if self.is_master and (Path(path) / "modeling").is_dir():
            self.tokenizer.save_pretrained(str(Path(path) / "modeling"))
