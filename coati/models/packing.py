"""Padding-free packed batches on the model side: attention kept within each packed row, and per-row sums.

A packed batch (`coati.dataset.collators.pack_sequences`) is one (1, total) sequence whose position ids restart at
each row. FlashAttention-2 keeps attention within rows by itself (from the cumulative row lengths, or from the
position ids). SDPA is wrapped by `packed_sdpa`, which runs PyTorch's SDPA row by row on such a sequence, so a packed
forward costs the sum of the rows' squared lengths in attention, not the square of their total, and no
(total x total) mask is built.
"""
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from coati.utils.errors import CoatiUsageError

_PLAIN_SDPA: Optional[Callable[..., Tuple[torch.Tensor, Any]]] = None
"""transformers' own SDPA attention, which `packed_sdpa` hands every unpacked batch to."""


def is_packed(batch: Dict[str, Any], prefix: str = "") -> bool:
    return f"{prefix}seq_lens" in batch


def _row_bounds(query: torch.Tensor, position_ids: Optional[torch.Tensor],
                cu_seq_lens_q: Optional[torch.Tensor]) -> Optional[List[int]]:
    """Where each packed row starts and ends: from the cumulative lengths when the forward was given them, else from
    a single sequence whose position ids go back to 0 (as FlashAttention-2 tells a packed batch); None when unpacked.
    (A model whose top-level forward takes no extra keywords, a sequence classifier, is told by its position ids.)"""
    if cu_seq_lens_q is not None:
        return cu_seq_lens_q.tolist()
    if position_ids is None or query.size(0) != 1 or position_ids.size(-1) < 2:
        return None
    positions = position_ids.reshape(-1)
    if not bool((positions[1:] < positions[:-1]).any()):
        return None
    return (positions == 0).nonzero().flatten().tolist() + [positions.numel()]


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                is_causal: Optional[bool] = None, position_ids: Optional[torch.Tensor] = None,
                cu_seq_lens_q: Optional[torch.Tensor] = None, **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except on a packed (1, heads, total, dim) batch: causal SDPA within each row."""
    bounds = _row_bounds(query, position_ids, cu_seq_lens_q)
    if bounds is None:
        return _PLAIN_SDPA(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                           is_causal=is_causal, **kwargs)
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    rows = [F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=dropout,
                                           scale=scaling, is_causal=True)
            for s, e in zip(bounds, bounds[1:])]
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None


def model_inputs(batch: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """The forward's keyword arguments for `batch`'s `prefix` rows: ids and attention mask when padded; ids, position
    ids and cumulative row lengths (FlashAttention-2's varlen keywords, which `packed_sdpa` reads too) when packed."""
    if not is_packed(batch, prefix):
        return {"input_ids": batch[f"{prefix}input_ids"], "attention_mask": batch[f"{prefix}attention_mask"]}
    lengths = batch[f"{prefix}seq_lens"]
    cumulative = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    return {"input_ids": batch[f"{prefix}input_ids"], "position_ids": batch[f"{prefix}position_ids"],
            "cu_seq_lens_q": cumulative, "cu_seq_lens_k": cumulative, "max_length_q": longest, "max_length_k": longest}


def row_sums(values: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Per-row sums of `values` (1, K), which covers the last K positions of a packed sequence of rows `seq_lens`."""
    row_of = torch.repeat_interleave(torch.arange(seq_lens.numel(), device=values.device), seq_lens.to(values.device))
    row_of = row_of[row_of.numel() - values.size(-1):]
    return values.new_zeros(seq_lens.numel()).index_add(0, row_of, values.reshape(-1))


def row_ends(seq_lens: torch.Tensor) -> torch.Tensor:
    """Index of each packed row's last token."""
    return seq_lens.cumsum(0) - 1


def enable_packed_attention(model: torch.nn.Module) -> None:
    """Make `model` attend within packed rows: FlashAttention-2 already does; SDPA does once `packed_sdpa` stands in
    for it (unpacked batches run exactly as before), and a model loaded with eager attention that supports SDPA is
    switched to it. Then check it on two rows, so a model whose attention ignores the row boundaries (custom modelling
    code) is refused instead of attending across rows."""
    global _PLAIN_SDPA
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _PLAIN_SDPA is None:
        _PLAIN_SDPA = sdpa_attention_forward
        AttentionInterface.register("sdpa", packed_sdpa)
    if model.config._attn_implementation == "eager" and getattr(model, "_supports_sdpa", False):
        model.config._attn_implementation = "sdpa"
    _check_rows_kept_apart(model)


@torch.no_grad()
def _check_rows_kept_apart(model: torch.nn.Module) -> None:
    """The second of two packed rows must score as it does alone."""
    weight = next(model.parameters())
    if weight.device.type == "meta":
        return
    vocab = model.config.vocab_size
    first, second = torch.arange(3, 11) % vocab, torch.arange(11, 16) % vocab
    inputs = {"input_ids": torch.cat([first, second])[None].to(weight.device),
              "position_ids": torch.cat([torch.arange(8), torch.arange(5)])[None].to(weight.device)}
    training = model.training
    model.eval()
    try:
        together = _last_score(model(**inputs).logits)
        alone = _last_score(model(input_ids=second[None].to(weight.device)).logits)
    finally:
        model.train(training)
    tolerance = 1e-3 if weight.dtype == torch.float32 else 3e-2
    if not torch.allclose(together.float(), alone.float(), rtol=tolerance, atol=tolerance):
        raise CoatiUsageError(f"--packing: {type(model).__name__}'s attention ({model.config._attn_implementation}) does "
                              "not stay within each packed row; use SDPA or FlashAttention-2 attention, or train "
                              "without --packing")


def _last_score(logits: torch.Tensor) -> torch.Tensor:
    """The output at the sequence's last token: a causal LM's last logits, a sequence classifier's pooled score."""
    return logits[0, -1] if logits.dim() == 3 else logits[0]
