"""Log-probabilities of label tokens: the quantity every preference and policy loss is built on."""
from typing import Dict, Tuple

import torch

from coati.dataset.collators import both_sides
from coati.dataset.tokenization import IGNORE_INDEX


def mask_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only, so a left-padded row sees the positions it would unpadded."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) under each row of `logits` (..., vocab), in float32: a gather minus logsumexp, so no
    full log-softmax is kept. `targets` must be valid token ids."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def label_logps(logits: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token log p(label) of next-token `logits` (batch, T, vocab) against `labels` (batch, T), and the
    mask of tokens that count (labels other than IGNORE_INDEX). Both are (batch, T-1), in float32."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    return token_logps(logits[:, :-1], targets.clamp(min=0)) * mask, mask


def sequence_logps(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed label log-probs and label-token counts per row, from one forward of `model`."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logps, mask = label_logps(logits, labels)
    return logps.sum(-1), mask.sum(-1)


def pair_sequence_logps(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """`sequence_logps` of a preference batch's chosen rows then rejected rows, in one forward."""
    return sequence_logps(model, both_sides(batch, "input_ids"), both_sides(batch, "attention_mask"),
                          both_sides(batch, "labels"))


def action_logps(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                 return_logits: bool = False):
    """Log-probs (batch, N) of the completion tokens `sequences[:, prompt_length:]` given what precedes them,
    for left-padded prompts (positions counted from the mask); with `return_logits`, also their logits."""
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=mask_positions(attention_mask)).logits
    logits = logits[:, prompt_length - 1:-1]
    logps = token_logps(logits, sequences[:, prompt_length:])
    return (logps, logits) if return_logits else logps
