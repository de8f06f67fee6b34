"""On-policy distillation: a frozen teacher scores the policy's own samples token by token (GKD, Agarwal et al. 2024;
Thinking Machines' on-policy distillation, 2025), so the student learns where it actually goes wrong.

- **Reverse KL as an advantage.** Each sampled token's `log p_teacher(y_t) - log p_policy(y_t)` (minus the per-token
  reverse KL estimate), times `coef`, is added to that token's advantage (GRPO's group advantage, or zero where there
  is no reward), or, in PPO, to its reward before GAE, as the KL penalty is: tokens the teacher finds likelier than
  the student does are pushed up. Logged per row as `rollout/distill_reverse_kl`.
- **Top-k forward KL / GKD as a loss.** With `top_k` > 0 the teacher's `top_k` likeliest tokens at each position (and
  their log-probs) are kept with the experience, and `coati.trainer.components.DistillTerm` adds a `DISTILL_LOSSES`
  entry between the student's and the teacher's distributions on them to the actor's loss.
- **Where the teacher runs.** `ModelTeacher`: a folder loaded frozen in the trainer's processes
  (`--teacher_model`). `ServedTeacher`: any OpenAI-compatible `/completions` endpoint that returns prompt log-probs
  by token id (`--teacher_url`: `vllm serve`, or `python -m coati.inference.judge_server --model TEACHER`), so a
  teacher too large for the trainer's devices runs elsewhere. It is sent each row's token ids (prompt and
  completion, padding left out) with `prompt_logprobs`, `--teacher_batch_size` rows per request, at most
  `SERVED_CONCURRENCY` requests in flight, and answers vLLM's shape: per position a map from token id to its
  `logprob` (and `rank`). Its bearer token is read from `COATI_TEACHER_TOKEN`, else `OPENAI_API_KEY`.
  Its top-k log-probs are normalised over its whole vocabulary (`ModelTeacher`'s over the policy's); the losses
  renormalise over the top-k, so both teachers give one loss.
- **A term that does nothing stops the run.** When the teacher's log-prob equals the policy's on every sampled token
  (the teacher is the policy itself, or its scores never arrived), both terms are zero; the run stops with one line
  instead of training on nothing, as atropos #456's distillation silently did. "Equals" is within `SAME_SCORES_ATOL`
  of the precision the teacher ran in: the two log-probs come from different forwards (another model object, process
  or batch layout), which may round differently in the last bits.
"""
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from coati.models.logprobs import action_top_k
from coati.rewards.remote import RemoteRewardError, request_json, token_from_env
from coati.utils.errors import CoatiUsageError

from .experience import Experience

REVERSE_KL_STAT = "distill_reverse_kl"
SAME_SCORES_ATOL = {torch.float32: 1e-4, torch.float64: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
"""The largest |log p_teacher - log p_policy| over a batch's sampled tokens at which the teacher scores them as the
policy does, by the dtype the teacher's forward ran in: rounding differences between two forwards of one model are
far below these (the last bits in fp32), while a distinct model differs by far more (two randomly initialised tiny
Llamas: 0.75 at most, 0.19 on average, over 160 tokens)."""
SERVED_DTYPE = torch.bfloat16
"""The precision a served teacher is taken to score in (the usual serving dtype), for `SAME_SCORES_ATOL`."""


class DistillationError(CoatiUsageError):
    """The teacher cannot distil into this policy (another vocabulary), or its term is identically zero."""


@dataclass(frozen=True)
class DistillConfig:
    """`coef`: the weight of the per-token reverse KL in the advantages (0: off); `top_k`: teacher tokens kept per
    position for a distillation loss (0: none)."""

    coef: float = 1.0
    top_k: int = 0


class Teacher:
    """A frozen teacher of a policy with `vocab_size` tokens: `scores` gives the experience's teacher fields, and
    `with_advantages` turns them into the reverse-KL term."""

    def __init__(self, config: DistillConfig, vocab_size: int) -> None:
        self.config, self.vocab_size = config, vocab_size

    @property
    def dtype(self) -> torch.dtype:
        """The precision the teacher's forward runs in (`SAME_SCORES_ATOL`)."""
        return SERVED_DTYPE

    def scores(self, experience: Experience, per_rows: Callable[[Callable[[slice], Any], Experience], Any],
               ) -> Dict[str, Optional[torch.Tensor]]:
        """The experience's teacher fields: the teacher's log-probs of the sampled tokens (batch, N), and its top-k
        log-probs and ids (batch, N, k) where a loss needs them (`per_rows` runs a forward over the rows in chunks)."""
        raise NotImplementedError

    def token_rewards(self, experience: Experience) -> Tuple[torch.Tensor, Dict[str, List[float]]]:
        """`coef` times each sampled token's log p_teacher - log p_policy (zero where the mask is), and the
        experience's per-row stats with it as `rollout/distill_reverse_kl`; a `DistillationError` when that difference
        is within rounding of zero on every token."""
        e, mask = experience, experience.action_mask.bool()
        reverse_kl = (e.action_log_probs - e.teacher_log_probs) * mask
        check_teacher_differs(reverse_kl, mask, SAME_SCORES_ATOL[self.dtype])
        stats = {**e.rollout_stats, REVERSE_KL_STAT: (reverse_kl.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()}
        return -self.config.coef * reverse_kl, stats

    def with_advantages(self, experience: Experience) -> Experience:
        """`experience` with `token_rewards` added to each token's advantage (GRPO's: the advantages become per
        token)."""
        e, (rewards, stats) = experience, self.token_rewards(experience)
        advantages = e.advantages
        if self.config.coef > 0:
            per_token = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(rewards)
            advantages = (per_token + rewards) * e.action_mask
        return replace(e, advantages=advantages, rollout_stats=stats)


class ModelTeacher(Teacher):
    """A frozen `model` in the trainer's processes, whose vocabulary starts with the policy's `vocab_size` tokens (a
    vision-language teacher reads the rows' images, as the policy does)."""

    def __init__(self, model: torch.nn.Module, config: DistillConfig, vocab_size: int) -> None:
        super().__init__(config, vocab_size)
        self.model = model

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def scores(self, experience: Experience, per_rows: Callable[[Callable[[slice], Any], Experience], Any],
               ) -> Dict[str, Optional[torch.Tensor]]:
        e = experience
        logps, top_logps, top_ids = per_rows(lambda rows: action_top_k(
            self.model, e.sequences[rows], e.attention_mask[rows], e.prompt_length, self.config.top_k, self.vocab_size,
            packed=e.packed, images=e.images(rows)), e)
        return {"teacher_log_probs": logps, "teacher_top_logps": top_logps, "teacher_top_ids": top_ids}


TEACHER_TOKEN_ENVS = ("COATI_TEACHER_TOKEN", "OPENAI_API_KEY")
"""Where a served teacher's bearer token is read from, first set first; never a flag."""
SERVED_CONCURRENCY = 4
"""Requests to a served teacher in flight at once, per rank."""
WIDEST_TOP = 20
"""The most tokens per position a served teacher is asked for (vLLM's default `--max-logprobs`) where tokens beyond
the policy's vocabulary (padding rows of the teacher's embedding, which a trained model rarely ranks high) are among
its `top_k` likeliest; a larger `top_k` is asked as it is."""


def teacher_token() -> Optional[str]:
    """The served teacher's bearer token (`TEACHER_TOKEN_ENVS`), or None."""
    return token_from_env(TEACHER_TOKEN_ENVS)


@dataclass
class ServedTeacher(Teacher):
    """The teacher behind an OpenAI-compatible API at `url` (its base, e.g. `http://host:8000/v1`), asked for prompt
    log-probs of the rows' token ids by the model name `model`; see the module's notes."""

    url: str
    config: DistillConfig
    vocab_size: int
    model: str
    batch_size: int = 16
    timeout_s: float = 120.0
    retries: int = 3
    backoff_s: float = 1.0
    token: Optional[str] = field(default_factory=teacher_token, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")

    def scores(self, experience: Experience, per_rows: Callable[[Callable[[slice], Any], Experience], Any],
               ) -> Dict[str, Optional[torch.Tensor]]:
        e, k = experience, self.config.top_k
        rows = row_token_ids(e)
        batches = [rows[i:i + self.batch_size] for i in range(0, len(rows), self.batch_size)]
        with ThreadPoolExecutor(max_workers=max(1, min(SERVED_CONCURRENCY, len(batches)))) as pool:
            scored = [row for rows_scored in pool.map(self._scored, batches) for row in rows_scored]
        shape = (len(rows), e.action_mask.size(1))
        logps = torch.zeros(shape)
        top_logps, top_ids = torch.full(shape + (max(k, 1),), -math.log(max(k, 1))), torch.zeros(
            shape + (max(k, 1),), dtype=torch.long)
        for i, positions in enumerate(scored):
            for j, (logp, tops) in enumerate(positions):
                logps[i, j] = logp
                if k:
                    top_ids[i, j] = torch.tensor([token for token, _ in tops])
                    top_logps[i, j] = torch.tensor([value for _, value in tops])
        device = e.sequences.device
        return {"teacher_log_probs": logps.to(device), "teacher_top_logps": top_logps.to(device) if k else None,
                "teacher_top_ids": top_ids.to(device) if k else None}

    def _scored(self, rows: List[Tuple[List[int], int]]) -> List[List[Tuple[float, List[Tuple[int, float]]]]]:
        """Per row and completion position: the sampled token's log-prob, and the teacher's `top_k` likeliest tokens
        of the policy's vocabulary as (id, log-prob). Where the teacher ranks tokens beyond that vocabulary among its
        likeliest, it is asked again for twice as many, up to `WIDEST_TOP`."""
        k, asked = self.config.top_k, self.config.top_k
        while True:
            answers = self._request(rows, asked)
            scored = [[self._position(entries, t, ids[t]) for t in range(start, len(ids))]
                      for entries, (ids, start) in zip(answers, rows)]
            if all(len(tops) >= k for row in scored for _, tops in row):
                return scored
            if asked >= max(k, WIDEST_TOP):
                raise DistillationError(
                    f"teacher {self.url}: fewer than {k} of its {asked} likeliest tokens at a position lie within the "
                    f"policy's {self.vocab_size} tokens; the teacher needs the policy's vocabulary (or a smaller "
                    "--distill_top_k)")
            asked = min(2 * asked, max(k, WIDEST_TOP))

    def _request(self, rows: List[Tuple[List[int], int]], top: int) -> List[List[Optional[Dict[str, Any]]]]:
        """Each row's prompt log-probs (one map per position, the first None), with the `top` likeliest tokens at
        each position, from one request."""
        body = {"model": self.model, "prompt": [ids for ids, _ in rows], "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": top}
        answer = request_json(f"{self.url}/completions", json.dumps(body).encode(), f"teacher {self.url}", self.token,
                              " or ".join(TEACHER_TOKEN_ENVS), self.timeout_s, self.retries, self.backoff_s,
                              "is the teacher being served? Check --teacher_url")
        try:
            choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
            entries = [c["prompt_logprobs"] for c in choices]
        except (KeyError, TypeError, AttributeError):
            raise DistillationError(f"teacher {self.url} answered without prompt_logprobs in its choices (an "
                                    f"OpenAI-compatible server that returns them, such as vLLM's): "
                                    f"{str(answer)[:200]}") from None
        if len(entries) != len(rows) or any(not isinstance(x, list) or len(x) != len(ids)
                                            for x, (ids, _) in zip(entries, rows)):
            raise DistillationError(f"teacher {self.url} answered prompt log-probs that do not match the "
                                    f"{len(rows)} rows sent (one per token of each)")
        return entries

    def _position(self, entries: List[Optional[Dict[str, Any]]], position: int,
                  token: int) -> Tuple[float, List[Tuple[int, float]]]:
        """The sampled `token`'s log-prob at `position`, and the teacher's likeliest tokens there that the policy has
        (at most `top_k`), as (id, log-prob), likeliest first."""
        entry = {int(t): float(v["logprob"]) for t, v in (entries[position] or {}).items()}
        if token not in entry:
            raise DistillationError(f"teacher {self.url} gave no log-prob for the sampled token {token} at position "
                                    f"{position}")
        ranked = sorted(((t, v) for t, v in entry.items() if t < self.vocab_size), key=lambda item: -item[1])
        return entry[token], ranked[:self.config.top_k]


def row_token_ids(experience: Experience) -> List[Tuple[List[int], int]]:
    """Each row's attended token ids (its prompt, then its completion through the last token that counts), and where
    the completion starts among them."""
    e, rows = experience, []
    for sequence, attention in zip(e.sequences.tolist(), e.attention_mask.tolist()):
        ids = [token for token, seen in zip(sequence, attention) if seen]
        rows.append((ids, sum(attention[:e.prompt_length])))
    return rows


def _ask_teacher_once(url: str, endpoint: str, body: Optional[Dict[str, Any]], timeout_s: float) -> Any:
    """One request, not retried, to a served teacher's `endpoint` (`url` is its `--teacher_url`; GET without a `body`),
    with its token; `RemoteRewardError` in one line naming `--teacher_url` where it fails."""
    return request_json(endpoint, None if body is None else json.dumps(body).encode(), f"--teacher_url {url}",
                        teacher_token(), " or ".join(TEACHER_TOKEN_ENVS), timeout_s, 0, 0.0,
                        "is the teacher being served?")


def served_model_name(url: str, timeout_s: float = 30.0) -> str:
    """The first model the server at `url` lists (`GET /models`); one line when it cannot be asked."""
    try:
        answer = _ask_teacher_once(url, f"{url.rstrip('/')}/models", None, timeout_s)
    except RemoteRewardError as error:
        if error.status == 404:
            raise DistillationError(f"{error}; give the API's base, which for vLLM ends in /v1") from None
        raise
    try:
        return answer["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise DistillationError(f"--teacher_url {url} lists no model at /models: {str(answer)[:200]}") from None


PROBE_TOKENS = 2000
"""Tokens of the policy's vocabulary, evenly spaced, whose text a served teacher's tokenizer must split as the policy's
does."""


def check_served_vocabulary(url: str, model: str, policy: Any) -> bool:
    """Whether the served teacher's tokenizer could be compared with `policy` (the policy's tokenizer): the text of
    `PROBE_TOKENS` of its tokens goes to the server's `/tokenize` (vLLM's, beside `/v1`), which must split it into
    the same ids; a `DistillationError` in one line where it does not. False when the server has no `/tokenize` (or
    answers it with no token ids)."""
    step = max(1, len(policy) // PROBE_TOKENS)
    probe = policy.decode(list(range(0, len(policy), step)), skip_special_tokens=True)
    body = {"model": model, "prompt": probe, "add_special_tokens": False}
    base = url.rstrip("/").removesuffix("/v1")
    try:
        answer = _ask_teacher_once(url, f"{base}/tokenize", body, 60.0)
    except RemoteRewardError as error:
        if error.status in (404, 405):
            return False
        raise
    served = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(served, list):
        return False
    own = policy(probe, add_special_tokens=False, verbose=False)["input_ids"]
    if served != own:
        first = next((i for i, (a, b) in enumerate(zip(served, own)) if a != b), min(len(served), len(own)))
        raise DistillationError(
            f"--teacher_url {url}: its tokenizer splits a text of the policy's tokens into other ids than the policy's "
            f"({len(served)} vs {len(own)} tokens, first differing at token {first}). The teacher scores the policy's "
            "token ids, so both need one vocabulary")
    return True


def check_teacher_differs(reverse_kl: torch.Tensor, mask: torch.Tensor, atol: float) -> None:
    """One line when the teacher's log-probs are within `atol` of the policy's on every sampled token (and there are
    some): `reverse_kl` holds log p_policy - log p_teacher per token."""
    if not mask.any():
        return
    largest = reverse_kl[mask].abs().max().item()
    if not largest > atol:
        raise DistillationError(f"the distillation term is zero on every one of the {int(mask.sum())} sampled tokens "
                                f"in this batch: the teacher's log-probs are within {atol:g} of the policy's (at most "
                                f"{largest:.3g} apart), so it scores them as the policy does. Is --teacher_model the "
                                "policy itself?")


def check_vocabulary(teacher_vocab: Optional[dict], policy_vocab: dict, teacher: str) -> None:
    """The teacher's tokenizer (where it has one) must map every token to the policy's id: it scores the policy's
    token ids. One line naming the first difference otherwise."""
    if teacher_vocab is None or teacher_vocab == policy_vocab:
        return
    differing = sorted(set(teacher_vocab.items()) ^ set(policy_vocab.items()), key=lambda item: item[1])
    token, _ = differing[0]
    raise DistillationError(
        f"--teacher_model {teacher}: its tokenizer's vocabulary differs from the policy's ({len(teacher_vocab)} vs "
        f"{len(policy_vocab)} tokens; {token!r} is {teacher_vocab.get(token)} there and {policy_vocab.get(token)} "
        "here). The teacher scores the policy's token ids, so both need one vocabulary")
