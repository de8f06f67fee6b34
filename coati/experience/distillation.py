"""On-policy distillation: a frozen teacher scores the policy's own samples token by token (GKD, Agarwal et al. 2024;
Thinking Machines' on-policy distillation, 2025), so the student learns where it actually goes wrong.

- **Reverse KL as an advantage.** Each sampled token's `log p_teacher(y_t) - log p_policy(y_t)` (minus the per-token
  reverse KL estimate), times `coef`, is added to that token's advantage (GRPO's group advantage, or zero where there
  is no reward): tokens the teacher finds likelier than the student does are pushed up. Logged per row as
  `rollout/distill_reverse_kl`.
- **Top-k forward KL / GKD as a loss.** With `top_k` > 0 the teacher's `top_k` likeliest tokens at each position (and
  their log-probs) are kept with the experience, and `coati.trainer.components.DistillTerm` adds a `DISTILL_LOSSES`
  entry between the student's and the teacher's distributions on them to the actor's loss.
- **A term that does nothing stops the run.** When the teacher's log-prob equals the policy's on every sampled token
  (the teacher is the policy itself, or its scores never arrived), both terms are identically zero; the run stops with
  one line instead of training on nothing, as atropos #456's distillation silently did.
"""
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from coati.models.logprobs import action_top_k
from coati.utils.errors import CoatiUsageError

from .experience import Experience

REVERSE_KL_STAT = "distill_reverse_kl"


class DistillationError(CoatiUsageError):
    """The teacher cannot distil into this policy (another vocabulary), or its term is identically zero."""


@dataclass(frozen=True)
class DistillConfig:
    """`coef`: the weight of the per-token reverse KL in the advantages (0: off); `top_k`: teacher tokens kept per
    position for a distillation loss (0: none)."""

    coef: float = 1.0
    top_k: int = 0


class Teacher:
    """A frozen `model` (whose vocabulary starts with the policy's `vocab_size` tokens) that scores experience."""

    def __init__(self, model: torch.nn.Module, config: DistillConfig, vocab_size: int) -> None:
        self.model, self.config, self.vocab_size = model, config, vocab_size

    def score(self, experience: Experience, per_rows: Callable[[Callable[[slice], Any], Experience], Any]) -> None:
        """The teacher's log-probs of the sampled tokens, and its top-k where a loss needs them, into `experience`
        (`per_rows` runs a forward over the rows in chunks)."""
        e = experience
        e.teacher_log_probs, e.teacher_top_logps, e.teacher_top_ids = per_rows(lambda rows: action_top_k(
            self.model, e.sequences[rows], e.attention_mask[rows], e.prompt_length, self.config.top_k, self.vocab_size,
            packed=e.packed), e)

    def add_advantages(self, experience: Experience) -> None:
        """`coef` times each sampled token's log p_teacher - log p_policy added to its advantage (the advantages become
        per token); a `DistillationError` when that difference is zero on every token."""
        e, mask = experience, experience.action_mask.bool()
        reverse_kl = (e.action_log_probs - e.teacher_log_probs) * mask
        check_not_identically_zero(reverse_kl, mask)
        e.rollout_stats[REVERSE_KL_STAT] = (reverse_kl.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
        if self.config.coef > 0:
            advantages = e.advantages if e.advantages.dim() == 2 else e.advantages.unsqueeze(-1).expand_as(reverse_kl)
            e.advantages = (advantages - self.config.coef * reverse_kl) * mask


def check_not_identically_zero(reverse_kl: torch.Tensor, mask: torch.Tensor, episode: Optional[int] = None) -> None:
    """One line when the teacher's log-probs equal the policy's on every sampled token (and there are some)."""
    if mask.any() and not reverse_kl[mask].abs().max().item() > 0:
        when = f"in episode {episode}" if episode is not None else "in this batch"
        raise DistillationError(f"the distillation term is zero on every one of the {int(mask.sum())} sampled tokens "
                                f"{when}: the teacher scores them exactly as the policy does. Is --teacher_model the "
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
