"""Process reward model training: two-class token classification at the token that ends each step."""
from typing import Dict

import torch
import torch.nn.functional as F

from coati.dataset.tokenization import IGNORE_INDEX

from .base import Batch, BatchResult, SLTrainer

STEP_METRICS = 3
"""Steps 1..3 get an accuracy of their own; later ones share `accuracy/later_steps` (fixed names, so every rank
reduces the same metrics)."""


class PRMTrainer(SLTrainer):
    """Cross-entropy of the step labels (1 correct, 0 not) at the positions that carry one, normalised by the labelled
    steps of the whole accumulated step across ranks. Logs `loss`, `accuracy` (of every step), `accuracy/step_K` for
    the first steps and `accuracy/later_steps`, and `first_error_accuracy`: solutions whose first wrong step (or
    having none) the model names exactly, as ProcessBench scores PRMs. Takes every `SLTrainer` argument."""

    def _count_items(self, batch: Batch) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    def _compute_batch(self, batch: Batch) -> BatchResult:
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"]
        labelled = labels != IGNORE_INDEX
        loss_sum = F.cross_entropy(logits[labelled].float(), labels[labelled], reduction="sum")
        correct = (logits.argmax(-1) == labels) & labelled
        return BatchResult(loss_sum, {"loss": (loss_sum.item(), int(labelled.sum())),
                                      **step_metrics(correct, labelled),
                                      "first_error_accuracy": first_error_hits(logits.argmax(-1), labels, labelled)})


def step_metrics(correct: torch.Tensor, labelled: torch.Tensor) -> Dict[str, tuple]:
    """(hits, steps) overall and by step number."""
    index = labelled.long().cumsum(-1) * labelled
    metrics = {"accuracy": (int(correct.sum()), int(labelled.sum()))}
    for k in range(1, STEP_METRICS + 1):
        metrics[f"accuracy/step_{k}"] = (int((correct & (index == k)).sum()), int((index == k).sum()))
    later = index > STEP_METRICS
    metrics["accuracy/later_steps"] = (int((correct & later).sum()), int(later.sum()))
    return metrics


def first_error_hits(predicted: torch.Tensor, labels: torch.Tensor, labelled: torch.Tensor) -> tuple:
    """(rows whose first step labelled 0, or none, the prediction finds exactly, rows with a labelled step)."""
    hits = rows = 0
    for row_predicted, row_labels, row_labelled in zip(predicted, labels, labelled):
        if not row_labelled.any():
            continue
        truth, guess = row_labels[row_labelled].tolist(), row_predicted[row_labelled].tolist()
        rows += 1
        hits += _first_zero(truth) == _first_zero(guess)
    return hits, rows


def _first_zero(values: list) -> int:
    return values.index(0) if 0 in values else len(values)
