"""Log-probabilities of label tokens: the quantity every preference and policy loss is built on; and the per-token
KL estimates between two models from their log-probs of the same tokens (`KL_ESTIMATORS`)."""
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch.utils.checkpoint import checkpoint

from coati.dataset.collators import both_sides
from coati.dataset.tokenization import IGNORE_INDEX

from .packing import chosen_then_rejected, is_packed, model_inputs, pack_rollouts, row_sums, shares_prompts
from .vision import image_inputs, rope_positions


def mask_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only, so a left-padded row sees the positions it would unpadded."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def padded_positions(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor,
                     images: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
    """The position ids of padded rows: Qwen2-VL's 3-D ones where the rows have `images` and the model reads them
    so, else those of `mask_positions`."""
    positions = rope_positions(model, sequences, attention_mask, images) if images else None
    return mask_positions(attention_mask) if positions is None else positions


def kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1 = log r: unbiased, high variance, can be negative."""
    return log_ratio


def kl_k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2: biased, low variance, never negative."""
    return 0.5 * log_ratio ** 2


def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 = e^{-log r} - 1 + log r: unbiased for samples from pi, never negative."""
    return torch.exp(-log_ratio) - 1 + log_ratio


KLEstimator = Callable[[torch.Tensor], torch.Tensor]
"""A per-token KL estimate from the log ratio log pi - log ref (`KL_ESTIMATORS`' functions)."""


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: KLEstimator = kl_k3) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from log-probs of the sampled tokens, by `estimator` (resolved from its
    registered name once, where the part that uses it is built: `KL_ESTIMATORS.get(name)`)."""
    return estimator(logps - ref_logps)


LOGP_CHUNK_ROWS = 1024
"""Positions whose log-softmax (or entropy) is taken at once: the float copy and exp() of a chunk's logits are the
only vocabulary-sized temporaries, and with gradients each chunk is recomputed in backward where it would keep one."""


def _chunk_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def over_chunks(fn: Callable[..., torch.Tensor], logits: torch.Tensor, *aligned: torch.Tensor,
                recompute: bool = True) -> torch.Tensor:
    """`fn(logits_rows, *aligned_rows)` -> one value per position, applied `LOGP_CHUNK_ROWS` positions at a time (and,
    with `recompute`, recomputed in backward when gradients flow), so no vocabulary-sized temporary of the whole batch
    exists besides the logits themselves. `aligned` tensors have the logits' shape without the vocabulary dimension.
    A caller whose `fn` keeps nothing vocabulary-sized for backward passes `recompute=False` and saves the time."""
    rows = logits.shape[:-1].numel()
    if rows <= LOGP_CHUNK_ROWS:
        return fn(logits, *aligned)
    flat = logits.reshape(rows, logits.size(-1))
    flat_aligned = [t.reshape(rows) for t in aligned]
    recompute = recompute and torch.is_grad_enabled() and logits.requires_grad
    parts = []   # split, not sliced: backward then joins the chunks' gradients once
    for chunk in zip(flat.split(LOGP_CHUNK_ROWS), *(t.split(LOGP_CHUNK_ROWS) for t in flat_aligned)):
        parts.append(checkpoint(fn, *chunk, use_reentrant=False) if recompute else fn(*chunk))
    return torch.cat(parts).view(logits.shape[:-1])


def token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) under each row of `logits` (..., vocab), in float32: a gather minus logsumexp, chunk by chunk
    (`over_chunks`). `targets` must be valid token ids. Float32 logits are not recomputed in backward: the logsumexp
    keeps only views of them (measured: recomputing cost 20 % of an SFT step at a 32k vocabulary); lower-precision
    logits are, since each chunk's float copy would be kept."""
    return over_chunks(_chunk_logps, logits, targets, recompute=logits.dtype != torch.float32)


_NO_LOGITS_TO_KEEP: set = set()
"""Model classes whose forward does not take `logits_to_keep` (custom or older modelling code)."""


def tail_logits(model: torch.nn.Module, keep: Union[int, torch.Tensor], **inputs: Any) -> torch.Tensor:
    """The LM head's logits at the last `keep` positions only, or at the positions a 1-d tensor `keep` lists
    (transformers' `logits_to_keep`), so the positions no loss reads (prompts, padding before the first label) never
    reach the head; all positions, then cut, for a model that does not take it."""
    if type(model) not in _NO_LOGITS_TO_KEEP:
        try:
            return model(**inputs, logits_to_keep=keep).logits
        except TypeError as error:
            if "logits_to_keep" not in str(error):
                raise
            _NO_LOGITS_TO_KEEP.add(type(model))
    logits = model(**inputs).logits
    return logits[:, keep] if isinstance(keep, torch.Tensor) else logits[:, -keep:]


def label_logps(logits: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token log p(label) of next-token `logits` (batch, T, vocab) against `labels` (batch, T), and the
    mask of tokens that count (labels other than IGNORE_INDEX). Both are (batch, T-1), in float32."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    return token_logps(logits[:, :-1], targets.clamp(min=0)) * mask, mask


def model_label_logps(model: torch.nn.Module, batch: Dict[str, Any], prefix: str = "") -> Tuple[torch.Tensor, torch.Tensor]:
    """`label_logps` of `batch`'s `prefix` rows (padded or packed) from one forward of `model` whose LM head sees
    only the columns from the batch's first label token on (the prompts' columns before it are no loss's);
    (rows or 1, columns kept) each."""
    labels = batch[f"{prefix}labels"]
    counted = (labels[:, 1:] != IGNORE_INDEX).any(0).nonzero()
    first = int(counted[0]) + 1 if counted.numel() else labels.size(1) - 1   # the first column any row's loss reads
    logits = tail_logits(model, labels.size(1) - first + 1, **model_inputs(batch, prefix))
    return label_logps(logits, labels[:, first - 1:])


def sequence_logps(model: torch.nn.Module, batch: Dict[str, Any], prefix: str = "") -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed label log-probs and label-token counts per row of `batch`'s `prefix` rows, from one forward."""
    logps, mask = model_label_logps(model, batch, prefix)
    if is_packed(batch, prefix):
        lengths = batch[f"{prefix}seq_lens"]
        return row_sums(logps, lengths), row_sums(mask.long(), lengths)
    return logps.sum(-1), mask.sum(-1)


def pair_sequence_logps(model: torch.nn.Module, batch: Dict[str, Any]) -> Tuple[torch.Tensor, torch.Tensor]:
    """`sequence_logps` of a preference batch's chosen rows then rejected rows, in one forward."""
    if is_packed(batch):
        sums, counts = sequence_logps(model, batch)
        return chosen_then_rejected(sums), chosen_then_rejected(counts)
    both = {field: both_sides(batch, field) for field in ("input_ids", "attention_mask", "labels")}
    return sequence_logps(model, {**both, **image_inputs(batch, repeat=2)})


def action_logps(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                 return_logits: bool = False, packed: bool = False,
                 images: Optional[Dict[str, torch.Tensor]] = None):
    """Log-probs (batch, N) of the completion tokens `sequences[:, prompt_length:]` given what precedes them,
    for left-padded prompts (positions counted from the mask); with `return_logits`, also their logits. The LM head
    sees the completion's positions only. `packed`: one forward of the rows without padding, each prompt computed
    once for the completions that follow it (`pack_rollouts`); the same values, laid out as the padded ones.
    `images`: the rows' image inputs (`joined_image_inputs`), for a vision-language model (padded rows only)."""
    if packed:
        rollouts = pack_rollouts(sequences, attention_mask, prompt_length, shares_prompts(model))
        logits = rollouts.rows(tail_logits(model, rollouts.kept, **rollouts.inputs))
    else:
        completion = sequences.size(1) - prompt_length
        logits = tail_logits(model, completion + 1, input_ids=sequences, attention_mask=attention_mask,
                             position_ids=padded_positions(model, sequences, attention_mask, images),
                             **(images or {}))[:, :-1]
    logps = token_logps(logits, sequences[:, prompt_length:])
    return (logps, logits) if return_logits else logps


def logps_at(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log p(token) (..., k) for each of `token_ids` (..., k) under `logits` (..., vocab), in float32."""
    logits = logits.float()
    return logits.gather(-1, token_ids) - torch.logsumexp(logits, dim=-1, keepdim=True)


@torch.no_grad()
def action_top_k(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                 k: int, vocab_size: int, packed: bool = False, images: Optional[Dict[str, torch.Tensor]] = None,
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """`model`'s log-probs of the completion tokens (batch, N), and for `k` > 0 its `k` likeliest tokens at each
    completion position among the first `vocab_size` (another model's vocabulary): their log-probs and ids
    (batch, N, k); else None, None. `images`: the rows' image inputs, as `action_logps` takes them."""
    logps, logits = action_logps(model, sequences, attention_mask, prompt_length, return_logits=True, packed=packed,
                                 images=images)
    if k <= 0:
        return logps, None, None
    logits = logits[..., :vocab_size].float()
    top, ids = logits.topk(k, dim=-1)
    return logps, top - torch.logsumexp(logits, dim=-1, keepdim=True), ids
