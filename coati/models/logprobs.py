"""Log-probabilities of label tokens: the quantity every preference and policy loss is built on."""
from typing import Tuple

import torch

from coati.dataset.tokenization import IGNORE_INDEX


def label_logps(logits: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token log p(label) of next-token `logits` (batch, T, vocab) against `labels` (batch, T), and the
    mask of tokens that count (labels other than IGNORE_INDEX). Both are (batch, T-1), in float32; a
    gather minus logsumexp, so no (batch, T, vocab) log-softmax is kept."""
    logits, targets = logits[:, :-1].float(), labels[:, 1:]
    mask = targets != IGNORE_INDEX
    picked = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked - logits.logsumexp(-1)) * mask, mask


def sequence_logps(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed label log-probs and label-token counts per row, from one forward of `model`."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logps, mask = label_logps(logits, labels)
    return logps.sum(-1), mask.sum(-1)


def action_logps(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                 return_logits: bool = False):
    """Log-probs (batch, N) of the completion tokens `sequences[:, prompt_length:]` given what precedes them,
    for left-padded prompts (positions counted from the mask); with `return_logits`, also their logits."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=positions).logits
    logits = logits[:, prompt_length - 1:-1].float()
    targets = sequences[:, prompt_length:]
    logps = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    return (logps, logits) if return_logits else logps
