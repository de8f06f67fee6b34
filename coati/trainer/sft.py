"""Supervised fine-tuning: masked next-token loss over the assistant tokens."""
import math
from typing import Dict

import torch.nn.functional as F

from coati.dataset.tokenization import IGNORE_INDEX

from .base import Batch, BatchResult, SLTrainer


class SFTTrainer(SLTrainer):
    """Next-token cross-entropy on label tokens, normalised by the label-token count of the whole
    accumulated step across ranks (not a mean of per-micro-batch means). Logs `loss`; evaluation
    adds `perplexity`. Takes every `SLTrainer` argument."""

    def _count_items(self, batch: Batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())

    def _compute_batch(self, batch: Batch) -> BatchResult:
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        targets = batch["labels"][:, 1:]
        loss_sum = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(),
                                   ignore_index=IGNORE_INDEX, reduction="sum")
        tokens = int((targets != IGNORE_INDEX).sum())
        return BatchResult(loss_sum, {"loss": (loss_sum.item(), tokens)})

    def _eval_results(self, metrics: Dict[str, float]) -> Dict[str, float]:
        return {**metrics, "perplexity": math.exp(min(metrics.get("loss", 0.0), 50.0))}

