"""Supervised fine-tuning: masked next-token loss over the assistant tokens."""
import math
from typing import Dict

from coati.dataset.tokenization import IGNORE_INDEX
from coati.models.logprobs import model_label_logps

from .base import Batch, BatchResult, SLTrainer


class SFTTrainer(SLTrainer):
    """Next-token cross-entropy on label tokens, normalised by the label-token count of the whole
    accumulated step across ranks (not a mean of per-micro-batch means); the LM head sees only the columns from
    the batch's first label on. Padded and packed batches give the same loss. Logs `loss`; evaluation adds `perplexity`. Takes every `SLTrainer` argument."""

    def _count_items(self, batch: Batch) -> int:
        return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())

    def _compute_batch(self, batch: Batch) -> BatchResult:
        logps, mask = model_label_logps(self.model, batch)
        loss_sum = -logps.sum()
        return BatchResult(loss_sum, {"loss": (loss_sum.item(), int(mask.sum()))})

    def _eval_results(self, metrics: Dict[str, float]) -> Dict[str, float]:
        return {**metrics, "perplexity": math.exp(min(metrics.get("loss", 0.0), 50.0))}

