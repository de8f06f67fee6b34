"""Rollout generation behind a small engine interface, so a vLLM/SGLang backend can replace the default
without touching trainers.

`HFEngine` samples from a transformers causal LM with its KV cache. Prompts come left-padded;
each sequence stops at its first end-of-turn/EOS token, and finished rows leave the batch (their
cache rows are dropped), so a finished sequence stops costing compute.
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Protocol, Sequence

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from coati.config import SamplingConfig
from coati.utils.errors import NonFiniteError

from .logprobs import padded_positions, token_logps
from .vision import joined_image_inputs, placeholder_token_ids


@dataclass
class GenerationOutput:
    """`sequences` = left-padded prompt (its first `prompt_length` columns) + completion, right-padded.
    `action_mask` (batch, completion columns) marks generated tokens up to and including the stop token."""

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    prompt_length: int
    logprobs: Optional[torch.Tensor] = None
    """(batch, completion columns): each generated token's log-prob under the generating weights, 0 past the
    end; only when asked for (`HFEngine.generate(..., logprobs=True)`)."""


class GenerationEngine(Protocol):
    """A generation engine: one model completing one padded batch of prompts (`HFEngine`). Workflows generate
    through a rollout pool (`coati.rollout.RolloutPool`), which holds one or more copies of the policy."""

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: SamplingConfig) -> GenerationOutput:
        """Completions of left-padded prompts."""


def sample_next(logits: torch.Tensor, config: SamplingConfig, seen: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One token per row from next-token `logits` (rows, vocab) with the repetition penalty on the tokens `seen`
    (rows, vocab: True where the row's prompt or completion holds the token), then temperature, top-k, top-p and
    min-p, in transformers' order."""
    if seen is not None and config.repetition_penalty != 1.0:
        penalised = torch.where(logits > 0, logits / config.repetition_penalty, logits * config.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    if not config.do_sample or config.temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / config.temperature
    if config.top_k > 0:
        kth = torch.topk(logits, min(config.top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs                                            # mass of strictly better tokens
        sorted_logits = sorted_logits.masked_fill(before >= config.top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    if config.min_p > 0:
        probs = probs.masked_fill(probs < config.min_p * probs.amax(-1, keepdim=True), 0.0)
    return torch.multinomial(probs, 1).squeeze(-1)


def seen_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(rows, vocab): True where a row's prompt (its attended positions) holds the token: what the repetition penalty
    starts from."""
    seen = torch.zeros(input_ids.size(0), vocab_size + 1, dtype=torch.bool, device=input_ids.device)
    seen.scatter_(1, input_ids.masked_fill(attention_mask == 0, vocab_size), True)   # padding: the spare column
    return seen[:, :vocab_size]


class HFEngine:
    """Generation with a transformers causal LM (the actor itself: weights are shared, never copied), at most
    `max_batch_rows` rows decoded at once (0: every row of a call), to bound the KV cache's memory."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, stop_token_ids: Sequence[int],
                 max_batch_rows: int = 0) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.stop_token_ids = tuple(stop_token_ids)
        self.max_batch_rows = max_batch_rows
        self.never_sampled = placeholder_token_ids(model)

    def _forward(self, input_ids, attention_mask, position_ids, cache, images=None) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True, **(images or {}))
        return out.logits[:, -1]

    def _without_placeholders(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` with a vision-language model's image placeholder tokens made impossible (`placeholder_token_ids`)."""
        if self.never_sampled:
            logits[:, self.never_sampled] = float("-inf")
        return logits

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: SamplingConfig,
                 logprobs: bool = False, images: Optional[Sequence[Dict[str, torch.Tensor]]] = None) -> GenerationOutput:
        """Completions of the left-padded prompts; with `logprobs`, each sampled token's log-prob, read off the
        sampling step's own logits (at temperature 1, as the trainer computes them), so no second forward is
        needed for behaviour log-probs. `images`: each row's image inputs, for a vision-language model."""
        rows = input_ids.size(0)
        size = self.max_batch_rows or rows
        decoded = [self._decode(input_ids[start:start + size], attention_mask[start:start + size], config, logprobs,
                                None if images is None else images[start:start + size])
                   for start in range(0, rows, size)]
        lengths = torch.cat([d.lengths for d in decoded])
        action_mask = torch.arange(config.max_new_tokens, device=input_ids.device) < lengths.unsqueeze(-1)
        tokens = torch.cat([d.tokens for d in decoded]).masked_fill(~action_mask, self.pad_token_id)
        token_logps_ = torch.cat([d.logprobs for d in decoded]) if logprobs else None
        return GenerationOutput(
            sequences=torch.cat([input_ids, tokens], dim=-1),
            attention_mask=torch.cat([attention_mask, action_mask.to(attention_mask.dtype)], dim=-1),
            action_mask=action_mask,
            prompt_length=input_ids.size(1),
            logprobs=None if token_logps_ is None else token_logps_ * action_mask,
        )

    def _decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: SamplingConfig,
                logprobs: bool, images: Optional[Sequence[Dict[str, torch.Tensor]]] = None) -> "Decoded":
        for decoded in self.stream(input_ids, attention_mask, config, logprobs, images):
            pass
        return decoded

    @torch.no_grad()
    def stream(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: SamplingConfig,
               logprobs: bool = False, images: Optional[Sequence[Dict[str, torch.Tensor]]] = None
               ) -> Iterator["Decoded"]:
        """The decoding so far, after each step (one token for every row still going; the same object, updated).
        `images` (each row's image inputs) go into the prompt's forward, with a vision-language model's own positions
        (`rope_positions`); the tokens after it continue from the prompt's highest position."""
        rows = input_ids.size(0)
        stops = torch.tensor(config.stop_token_ids or self.stop_token_ids, device=input_ids.device)
        decoded = Decoded(tokens=torch.full((rows, config.max_new_tokens), self.pad_token_id, dtype=torch.long,
                                            device=input_ids.device),
                          lengths=torch.full((rows,), config.max_new_tokens, dtype=torch.long, device=input_ids.device),
                          logprobs=torch.zeros(rows, config.max_new_tokens, device=input_ids.device) if logprobs else None)
        cache = DynamicCache()
        pixels = joined_image_inputs(images, input_ids.device) if images else {}
        positions = padded_positions(self.model, input_ids, attention_mask, pixels)
        logits = self._forward(input_ids, attention_mask, positions, cache, pixels)
        if not torch.isfinite(logits).all():
            raise NonFiniteError("generation: the policy's next-token logits are NaN or infinite, so its weights "
                                 "diverged at the last update; lower --lr, or resume from the last checkpoint")
        active = torch.arange(rows, device=input_ids.device)
        mask, next_position = attention_mask, (positions.amax(0) if positions.dim() == 3 else positions)[:, -1] + 1
        seen = seen_tokens(input_ids, attention_mask, logits.size(-1)) if config.repetition_penalty != 1.0 else None
        for step in range(config.max_new_tokens):
            logits = self._without_placeholders(logits)
            token = sample_next(logits, config, None if seen is None else seen[active])
            decoded.tokens[active, step] = token
            if seen is not None:
                seen[active, token] = True
            if decoded.logprobs is not None:
                decoded.logprobs[active, step] = token_logps(logits, token)
            finished = torch.isin(token, stops)
            decoded.lengths[active[finished]] = step + 1
            decoded.steps = step + 1
            yield decoded
            if step == config.max_new_tokens - 1 or finished.all():
                break
            if finished.any():
                keep = (~finished).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                active, token, mask, next_position = active[keep], token[keep], mask[keep], next_position[keep]
            mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=-1)
            step_positions = next_position.unsqueeze(-1)
            if positions.dim() == 3:   # every rotary section of a text token takes the same position
                step_positions = step_positions.unsqueeze(0).expand(3, -1, -1)
            logits = self._forward(token.unsqueeze(-1), mask, step_positions, cache)
            next_position = next_position + 1


@dataclass
class Decoded:
    """Generation in progress: `tokens` (rows, max_new_tokens), pad past each row's end or not yet sampled;
    `lengths`, each row's length once it stopped (max_new_tokens while it goes on); `steps` taken so far."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    logprobs: Optional[torch.Tensor] = None
    steps: int = 0


def generate_streaming(model: torch.nn.Module, input_ids: torch.Tensor, tokenizer: PreTrainedTokenizerBase,
                       max_length: int, num_beams: int = 1, do_sample: bool = True, early_stopping: bool = False,
                       top_k: Optional[int] = None, top_p: Optional[float] = None, temperature: Optional[float] = None,
                       prepare_inputs_fn: Optional[Callable] = None, update_model_kwargs_fn: Optional[Callable] = None,
                       **model_kwargs: Any) -> Iterator[torch.Tensor]:
    """ColossalChat's streaming generation (its chat demo prints as tokens come): after each new token, the
    left-padded `input_ids` followed by the tokens generated so far, until `max_length` tokens in all or every row
    has stopped at the tokenizer's EOS. Sampled (`do_sample`) or greedy; beam search does not stream."""
    if num_beams != 1:
        raise ValueError("generate_streaming: beam search does not stream; use num_beams=1")
    if prepare_inputs_fn is not None or update_model_kwargs_fn is not None:
        raise ValueError("generate_streaming: coati prepares the model's inputs and KV cache itself; "
                         "prepare_inputs_fn and update_model_kwargs_fn are not taken")
    if max_length <= input_ids.size(1):
        raise ValueError(f"generate_streaming: max_length {max_length} leaves no room after the "
                         f"{input_ids.size(1)}-token prompt")
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        attention_mask = input_ids.ne(tokenizer.pad_token_id).long()
    config = SamplingConfig(max_new_tokens=max_length - input_ids.size(1), temperature=temperature or 1.0,
                            top_k=top_k or 0, top_p=top_p or 1.0, do_sample=do_sample)
    engine = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    for decoded in engine.stream(input_ids, attention_mask, config):
        yield torch.cat([input_ids, decoded.tokens[:, :decoded.steps]], dim=-1)
