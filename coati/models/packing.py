"""Padding-free packed batches on the model side: attention kept within each packed row, and per-row sums.

A packed batch (`coati.dataset.collators.pack_sequences`) is one (1, total) sequence of pieces. A piece whose position
ids start at 0 is a row; a piece that starts at position q > 0 is a branch of the row before it: it sees that row's
first q tokens (the prompt a preference pair shares) and itself, so the prompt is computed once for both responses.
SDPA is wrapped by `packed_sdpa`, which runs PyTorch's SDPA piece by piece, so a packed forward costs the sum of the
pieces' squared lengths in attention, not the square of their total, and no (total x total) mask is built.
FlashAttention-2 keeps attention within rows by itself (from the cumulative row lengths); it knows no branches, so
pairs are packed without shared prompts there.

On-policy batches (left-padded prompts, right-padded completions) are packed by `pack_rollouts`: the completions of
one prompt (a GRPO group) become branches of its first row, so the prompt is computed once per group.
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from coati.dataset.collators import pack_sequences
from coati.utils.errors import CoatiUsageError

from .vision import image_inputs

_PLAIN_SDPA: Optional[Callable[..., Tuple[torch.Tensor, Any]]] = None
"""transformers' own SDPA attention, which `packed_sdpa` hands every unpacked batch to."""

Piece = Tuple[int, int, int, int]
"""(start, end, start of its row, prompt tokens shared with that row) of one piece of a packed sequence."""


def is_packed(batch: Dict[str, Any], prefix: str = "") -> bool:
    return f"{prefix}seq_lens" in batch


def _pieces(query: torch.Tensor, position_ids: Optional[torch.Tensor],
            cu_seq_lens_q: Optional[torch.Tensor]) -> Optional[List[Piece]]:
    """The pieces of a packed sequence, told by its position ids: a piece begins wherever they do not go on by one.
    A batch is packed when the forward was given row lengths (a causal LM's packed forward), or when it is one
    sequence whose position ids go back (a sequence classifier's forward takes no row lengths); None otherwise."""
    if position_ids is None or query.size(0) != 1 or position_ids.size(-1) < 2:
        return None
    positions = position_ids.reshape(-1)
    if cu_seq_lens_q is None and not bool((positions[1:] <= positions[:-1]).any()):
        return None
    starts = [0] + ((positions[1:] != positions[:-1] + 1).nonzero().flatten() + 1).tolist()
    first = positions[starts].tolist()
    pieces, row = [], 0
    for start, end, shared in zip(starts, starts[1:] + [positions.numel()], first):
        row = start if shared == 0 else row
        pieces.append((start, end, row, shared))
    return pieces


def _piece_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, piece: Piece, dropout: float,
                     scaling: Optional[float]) -> torch.Tensor:
    """Causal SDPA over one piece; a branch also sees the first `shared` tokens of its row."""
    start, end, row, shared = piece
    if not shared:
        return F.scaled_dot_product_attention(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                              dropout_p=dropout, scale=scaling, is_causal=True)
    length = end - start
    keys = torch.cat([key[:, :, row:row + shared], key[:, :, start:end]], dim=2)
    values = torch.cat([value[:, :, row:row + shared], value[:, :, start:end]], dim=2)
    causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    mask = torch.cat([torch.ones(length, shared, dtype=torch.bool, device=query.device), causal], dim=1)
    return F.scaled_dot_product_attention(query[:, :, start:end], keys, values, attn_mask=mask, dropout_p=dropout,
                                          scale=scaling)


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                is_causal: Optional[bool] = None, position_ids: Optional[torch.Tensor] = None,
                cu_seq_lens_q: Optional[torch.Tensor] = None, **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except on a packed (1, heads, total, dim) batch: SDPA piece by piece."""
    pieces = _pieces(query, position_ids, cu_seq_lens_q)
    if pieces is None:
        return _PLAIN_SDPA(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                           is_causal=is_causal, **kwargs)
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    outputs = [_piece_attention(query, key, value, piece, dropout, scaling) for piece in pieces]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def model_inputs(batch: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """The forward's keyword arguments for `batch`'s `prefix` rows: ids and attention mask (and the images) when padded; ids, position
    ids and cumulative row lengths (FlashAttention-2's varlen keywords, which `packed_sdpa` reads too) when packed."""
    if not is_packed(batch, prefix):
        return {"input_ids": batch[f"{prefix}input_ids"], "attention_mask": batch[f"{prefix}attention_mask"],
                **image_inputs(batch)}
    lengths = batch[f"{prefix}seq_lens"]
    cumulative = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    return {"input_ids": batch[f"{prefix}input_ids"], "position_ids": batch[f"{prefix}position_ids"],
            "cu_seq_lens_q": cumulative, "cu_seq_lens_k": cumulative, "max_length_q": longest, "max_length_k": longest}


@dataclass
class PackedRollouts:
    """A left-padded on-policy batch packed: `inputs` (ids, position ids, row lengths) for the forward, `kept` the
    ascending positions of the packed sequence whose outputs are read, and `reads` (batch, completion columns) the
    index into `kept` of the output that predicts each completion column (a column outside the attention mask reads
    its row's last prompt token: a finite value that the action mask drops, as padding is in the padded batch)."""

    inputs: Dict[str, torch.Tensor]
    kept: torch.Tensor
    reads: torch.Tensor

    def rows(self, outputs: torch.Tensor) -> torch.Tensor:
        """(1, len(kept), ...) outputs of the packed forward as (batch, completion columns, ...)."""
        return outputs[0, self.reads]


def pack_rollouts(sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                  share_prompts: bool = True) -> PackedRollouts:
    """Pack each row's real tokens (`attention_mask`) of `sequences`, prompt then completion, into one sequence. With
    `share_prompts`, a row whose prompt equals the last full row's is a branch of it: only its completion is packed,
    at positions after the prompt, and its first token is predicted from that row's last prompt token."""
    tokens, masks = sequences.cpu(), attention_mask.bool().cpu()
    pieces: List[List[int]] = []
    firsts: List[int] = []
    reads = torch.zeros(tokens.size(0), tokens.size(1) - prompt_length, dtype=torch.long)
    total, head = 0, None   # head: the last full row's prompt and the packed index of its last token
    for row in range(tokens.size(0)):
        prompt = tokens[row, :prompt_length][masks[row, :prompt_length]]
        real = masks[row, prompt_length:]
        completion = tokens[row, prompt_length:][real]
        if share_prompts and head is not None and torch.equal(prompt, head[0]):
            last_prompt, piece, first = head[1], completion, prompt.numel()
        else:
            last_prompt, piece, first = total + prompt.numel() - 1, torch.cat([prompt, completion]), 0
            head = (prompt, last_prompt)
        start = total + piece.numel() - completion.numel()   # packed index of the completion's first token
        order = real.long().cumsum(0) - 1                     # each real column's index within the completion
        reads[row] = torch.where(real & (order > 0), start + order - 1, torch.full_like(order, last_prompt))
        if piece.numel():
            pieces.append(piece.tolist())
            firsts.append(first)
            total += piece.numel()
    inputs = model_inputs(pack_sequences(pieces, pieces, first_positions=firsts))
    kept, reads = torch.unique(reads.flatten(), return_inverse=True)
    device = sequences.device
    return PackedRollouts({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()},
                          kept.to(device), reads.view_as(tokens[:, prompt_length:]).to(device))


def shares_prompts(model: torch.nn.Module) -> bool:
    """Whether `model`'s attention lets packed branches share their row's prompt: `packed_sdpa` does,
    FlashAttention-2 (rows from cumulative lengths only) does not."""
    inner = model.unwrap() if hasattr(model, "unwrap") else model   # a boosted model
    return getattr(getattr(inner, "config", None), "_attn_implementation", "sdpa") != "flash_attention_2"


def row_sums(values: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Per-row sums of `values` (1, K), which covers the last K positions of a packed sequence of rows `seq_lens`."""
    row_of = torch.repeat_interleave(torch.arange(seq_lens.numel(), device=values.device), seq_lens.to(values.device))
    row_of = row_of[row_of.numel() - values.size(-1):]
    return values.new_zeros(seq_lens.numel()).index_add(0, row_of, values.reshape(-1))


def chosen_then_rejected(values: torch.Tensor) -> torch.Tensor:
    """Per-row values of a packed preference batch (chosen, rejected of each pair in turn) as every chosen value, then
    every rejected one: the order of the padded batch."""
    return values.view(-1, 2).t().reshape(-1)


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
