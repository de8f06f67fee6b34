"""Every training loss in one place: pairwise reward-model losses, the DPO family, and PPO/GRPO's policy
and value losses with their aggregation (the KL estimators they use are with the log-probs, `coati.models.logprobs`).
Each states its equation in its docstring."""
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from coati.utils.errors import CoatiUsageError
from coati.utils.registry import AGGREGATIONS, BEHAVIOUR_CORRECTIONS, POLICY_LOSSES

from .logprobs import over_chunks


COLOSSALCHAT_NAMES = ("DpoLoss", "OddsRatioLoss")
"""ColossalChat's loss classes, which `coati.compat.losses` holds and this module's old import path gives."""


def __getattr__(name: str):
    if name not in COLOSSALCHAT_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("coati.compat.losses"), name)


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.mean()


class LogSigLoss(torch.nn.Module):
    """Bradley-Terry pairwise loss, -log sigmoid(beta (r_chosen - r_rejected)) (InstructGPT, Ouyang et al.
    2022); `beta` scales the margin (1: the plain loss)."""

    def __init__(self, beta: float = 1.0, reduction: str = "mean") -> None:
        super().__init__()
        self.beta, self.reduction = beta, reduction

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        return _reduce(-F.logsigmoid(self.beta * (chosen_reward - reject_reward)), self.reduction)


class LogExpLoss(torch.nn.Module):
    """log(1 + exp(r_rejected - r_chosen)) (Anthropic HH, Bai et al. 2022); equal to LogSigLoss, via softplus."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        return _reduce(F.softplus(reject_reward - chosen_reward), self.reduction)


@dataclass
class PreferenceLossOutput:
    """Per-item losses and implicit rewards of a preference loss; `extras` are per-item values to log."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    extras: Dict[str, torch.Tensor] = field(default_factory=dict)

    def __iter__(self) -> Iterator[torch.Tensor]:
        """Unpacks as ColossalChat's losses return: `losses, chosen_rewards, rejected_rewards = loss_fn(...)`."""
        return iter((self.losses, self.chosen_rewards, self.rejected_rewards))


class DPOLoss(torch.nn.Module):
    """DPO (Rafailov et al. 2023): -log sigmoid(beta * [(pi_c - ref_c) - (pi_r - ref_r)] - gamma) on summed
    log-probs, gamma being SimPO's target margin (0: plain DPO), with cDPO label smoothing eps (Mitchell 2023):
    -(1-eps) log sigmoid(h) - eps log sigmoid(-h).
    `loss_type="ipo"` (Azar et al. 2023): ([(pi_c - ref_c) - (pi_r - ref_r)] - 1 / (2 beta))^2 on length-normalised log-probs.
    `reference_free` takes the reference log-probs as 0 (no reference model); `length_normalization` divides
    every log-prob by its response's length (as IPO always does)."""

    def __init__(self, beta: float = 0.1, label_smoothing: float = 0.0, loss_type: str = "sigmoid",
                 gamma: float = 0.0, reference_free: bool = False, length_normalization: bool = False) -> None:
        super().__init__()
        if loss_type not in ("sigmoid", "ipo"):
            raise ValueError(f"unknown DPO loss_type {loss_type!r}; expected 'sigmoid' or 'ipo'")
        self.beta, self.label_smoothing, self.loss_type, self.gamma = beta, label_smoothing, loss_type, gamma
        self.needs_reference = not reference_free
        self.length_normalized = loss_type == "ipo" or length_normalization

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: Optional[torch.Tensor] = None,
                ref_rejected: Optional[torch.Tensor] = None) -> PreferenceLossOutput:
        ref_chosen = torch.zeros_like(chosen) if ref_chosen is None else ref_chosen
        ref_rejected = torch.zeros_like(rejected) if ref_rejected is None else ref_rejected
        chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
        h = chosen_ratio - rejected_ratio
        if self.loss_type == "ipo":
            losses = (h - 1 / (2 * self.beta)) ** 2
        else:
            losses = _smoothed_logsigmoid_loss(self.beta * h - self.gamma, self.label_smoothing)
        return PreferenceLossOutput(losses, self.beta * chosen_ratio.detach(), self.beta * rejected_ratio.detach())


class SimPOLoss(torch.nn.Module):
    """SimPO (Meng et al. 2024), reference-free: -log sigmoid(beta * (pi_c / |y_c| - pi_r / |y_r|) - gamma),
    on length-normalised log-probs, with the same label smoothing as DPO."""

    needs_reference = False
    length_normalized = True

    def __init__(self, beta: float = 2.0, gamma: float = 0.5, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.beta, self.gamma, self.label_smoothing = beta, gamma, label_smoothing

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor) -> PreferenceLossOutput:
        losses = _smoothed_logsigmoid_loss(self.beta * (chosen - rejected) - self.gamma, self.label_smoothing)
        return PreferenceLossOutput(losses, self.beta * chosen.detach(), self.beta * rejected.detach())


class ORPOLoss(torch.nn.Module):
    """ORPO (Hong et al. 2024), reference-free: -a_c + lam * -log sigmoid(log odds(a_c) - log odds(a_r)),
    where a is the length-normalised log-prob and odds(a) = e^a / (1 - e^a); the first term is the SFT loss."""

    needs_reference = False
    length_normalized = True

    def __init__(self, lam: float = 0.1) -> None:
        super().__init__()
        self.lam = lam

    def forward(self, chosen: torch.Tensor, rejected: torch.Tensor) -> PreferenceLossOutput:
        log_odds = (chosen - rejected) - (_log1m_exp(chosen) - _log1m_exp(rejected))
        ratio_loss = -F.logsigmoid(log_odds)
        nll = -chosen
        return PreferenceLossOutput(nll + self.lam * ratio_loss, self.lam * chosen.detach(), self.lam * rejected.detach(),
                                    {"nll_loss": nll.detach(), "log_odds_ratio": log_odds.detach()})


class KTOLoss(torch.nn.Module):
    """KTO (Ethayarajh et al. 2024): with r = pi - ref (summed log-probs) and z0 the batch KL estimate,
    desirable items cost w_D (1 - sigmoid(beta (r - z0))), undesirable ones w_U (1 - sigmoid(beta (z0 - r)))."""

    def __init__(self, beta: float = 0.1, desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> None:
        super().__init__()
        self.beta, self.desirable_weight, self.undesirable_weight = beta, desirable_weight, undesirable_weight

    def forward(self, logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
                kl: torch.Tensor) -> torch.Tensor:
        """Per-item losses; `desirable` is a bool tensor, `kl` the detached, clamped KL estimate z0."""
        ratio = logps - ref_logps
        desirable_loss = self.desirable_weight * (1 - torch.sigmoid(self.beta * (ratio - kl)))
        undesirable_loss = self.undesirable_weight * (1 - torch.sigmoid(self.beta * (kl - ratio)))
        return torch.where(desirable, desirable_loss, undesirable_loss)


def _smoothed_logsigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def _log1m_exp(logp: torch.Tensor) -> torch.Tensor:
    """log(1 - e^logp) for logp < 0, kept finite as logp reaches 0."""
    return torch.log1p(-torch.exp(logp).clamp(max=1 - 1e-6))


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set: over everything, or along `dim` (0 where a row is all masked)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Variance (biased) of `values` where `mask` is set."""
    return masked_mean((values - masked_mean(values, mask)) ** 2, mask)



def token_mean(token_losses: torch.Tensor, mask: torch.Tensor, norm_length: int) -> torch.Tensor:
    """Mean over all tokens of the batch (DAPO, Yu et al. 2025): sum_i,t l_it / sum_i |y_i|."""
    return masked_mean(token_losses, mask)


def seq_mean_token_mean(token_losses: torch.Tensor, mask: torch.Tensor, norm_length: int) -> torch.Tensor:
    """Per-sequence means, then their mean (GRPO, Shao et al. 2024): (1/B) sum_i (1/|y_i|) sum_t l_it."""
    return masked_mean(token_losses, mask, dim=-1).mean()


def seq_mean_token_sum_norm(token_losses: torch.Tensor, mask: torch.Tensor, norm_length: int) -> torch.Tensor:
    """Token sums over batch x a constant length, so no length bias (Dr. GRPO, Liu et al. 2025):
    sum_i,t l_it / (B * L), L = `norm_length` (the completion limit) or the padded width."""
    return (token_losses * mask).sum() / (token_losses.size(0) * (norm_length or token_losses.size(-1)))


def _on_support(logps: torch.Tensor) -> torch.Tensor:
    """Log-probs renormalised over the last dimension (a top-k support)."""
    return logps - torch.logsumexp(logps, dim=-1, keepdim=True)


def forward_kl_topk(student_logps: torch.Tensor, teacher_logps: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """KL(teacher || student) per position, both renormalised over the teacher's top-k tokens: mode-covering (the
    student spreads over what the teacher considers), the supervised KD loss of Hinton et al. 2015 on the student's
    own samples."""
    teacher, student = _on_support(teacher_logps), _on_support(student_logps)
    return (teacher.exp() * (teacher - student)).sum(-1)


def generalized_jsd(student_logps: torch.Tensor, teacher_logps: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """GKD's generalised Jensen-Shannon divergence (Agarwal et al. 2024) per position, over the teacher's top-k tokens
    renormalised: beta KL(T || M) + (1 - beta) KL(S || M), M = beta T + (1 - beta) S, a bounded divergence; as in
    TRL's GKDTrainer, beta = 0 means the forward KL(T || S) and beta = 1 the reverse KL(S || T)."""
    teacher, student = _on_support(teacher_logps), _on_support(student_logps)
    if beta <= 0:
        return (teacher.exp() * (teacher - student)).sum(-1)
    if beta >= 1:
        return (student.exp() * (student - teacher)).sum(-1)
    mixture = torch.logsumexp(torch.stack([teacher + math.log(beta), student + math.log(1 - beta)]), dim=0)
    return beta * (teacher.exp() * (teacher - mixture)).sum(-1) + (1 - beta) * (student.exp() * (student - mixture)).sum(-1)


@dataclass(frozen=True)
class PolicyLossConfig:
    """What a policy loss is given besides the log-probs and advantages: the clip range (`--clip_eps_low`,
    `--clip_eps_high`) and its own hyperparameters (`--policy_loss_option NAME=VALUE ...`)."""

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    options: Dict[str, Any] = field(default_factory=dict)


class PolicyTerms(NamedTuple):
    """A policy loss's per-token values (batch, T): the losses (before the off-policy weight and the aggregation),
    the importance ratio pi / pi_old (the skip threshold and the logs read it), and where a clip (or truncation)
    acted below and above (bool), logged as `clip_ratio/low` and `clip_ratio/high`, and where a dual clip bounded
    the loss (bool, None for a loss without one), logged as `clip_ratio/dual`."""

    token_losses: torch.Tensor
    ratio: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    clipped_dual: Optional[torch.Tensor] = None


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, config: PolicyLossConfig) -> PolicyTerms:
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per token; the clip acts below for A < 0, above for A > 0."""
    low, high = 1 - config.clip_eps_low, 1 + config.clip_eps_high
    token_losses = -torch.min(ratio * advantages, ratio.clamp(low, high) * advantages)
    return PolicyTerms(token_losses, ratio, (ratio < low) & (advantages < 0), (ratio > high) & (advantages > 0))


def ppo_clip(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             config: PolicyLossConfig) -> PolicyTerms:
    """PPO (Schulman et al. 2017): r_t = pi(y_t) / pi_old(y_t), clipped token by token (DAPO's clip-higher when the
    bounds differ). With the option `dual_clip` c > 1 (dual-clip PPO, Ye et al. 2020; verl's `clip_ratio_c`), a
    token with A < 0 loses at most -c A: a ratio far above 1 on a bad token is not pushed down without bound."""
    terms = _clipped_surrogate(torch.exp(logps - old_logps), advantages, config)
    if config.options.get("dual_clip") is None:
        return terms
    bound = -config.options["dual_clip"] * advantages
    dual = (advantages < 0) & (terms.token_losses > bound)
    return terms._replace(token_losses=torch.where(dual, bound.expand_as(terms.token_losses), terms.token_losses),
                          clipped_dual=dual)




def gspo_clip(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              config: PolicyLossConfig) -> PolicyTerms:
    """GSPO (Zheng et al. 2025): s_i = exp((1/|y_i|) sum_t log(pi(y_it) / pi_old(y_it))), one ratio per sequence,
    clipped as a whole (use small clip ranges, ~3e-4 / 4e-4, and --loss_agg seq-mean-token-mean)."""
    ratio = torch.exp(masked_mean(logps - old_logps, mask, dim=-1)).unsqueeze(-1).expand_as(logps)
    return _clipped_surrogate(ratio, advantages, config)




def cispo(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
          config: PolicyLossConfig) -> PolicyTerms:
    """CISPO (MiniMax-M1, 2025): l_t = -sg(min(r_t, 1 + eps_high)) A_t log pi(y_t). The importance weight is
    truncated and its gradient stopped, so every token keeps a gradient (a clipped PPO token has none); the gradient
    is min(r_t, 1 + eps_high) A_t grad log pi. Truncated tokens are logged as `clip_ratio/high`. ScaleRL uses a cap
    of 5: `--clip_eps_high 4`. The option `floor` (`--policy_loss_option floor=0.8`; verl's 1 - clip_ratio_low)
    also raises weights below it to it, logged as `clip_ratio/low`; by default there is none, as in TRL."""
    ratio = torch.exp(logps - old_logps)
    cap, floor = 1 + config.clip_eps_high, config.options.get("floor", 0.0)
    weight = ratio.clamp(min=floor, max=cap).detach()
    return PolicyTerms(-weight * advantages * logps, ratio, ratio < floor, ratio > cap)




def sapo(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         config: PolicyLossConfig) -> PolicyTerms:
    """SAPO (Gao et al. 2025): l_t = -f(r_t) A_t, f(r) = (4 / tau) sigmoid(tau (r - 1)), a soft gate in place of the
    hard clip: f(1) = 2 / tau and f'(1) = 1, so on-policy it is the policy gradient, and a token far off-policy
    fades smoothly instead of being cut. tau is `temperature_pos` (default 1.0) where A > 0, `temperature_neg`
    (default 1.05) elsewhere (`--policy_loss_option temperature_neg=1.05`). Nothing is clipped."""
    ratio = torch.exp(logps - old_logps)
    pos, neg = config.options.get("temperature_pos", 1.0), config.options.get("temperature_neg", 1.05)
    tau = torch.where(advantages > 0, torch.full_like(ratio, pos), torch.full_like(ratio, neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    nothing = torch.zeros_like(ratio, dtype=torch.bool)
    return PolicyTerms(-gate * advantages, ratio, nothing, nothing)




def gmpo(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         config: PolicyLossConfig) -> PolicyTerms:
    """GMPO (Zhao et al. 2025): one ratio per sequence, the geometric mean of its token ratios, each clipped in log
    space to [-eps_low, eps_high] where the advantage's sign makes the clip bind: s_i = exp(mean_t sgn(A) min(sgn(A)
    log r_t, sgn(A) clip(log r_t))), l_i = -A_i s_i on each of its tokens, A_i the sequence's mean advantage (use
    wide clip ranges, 0.4 in the paper, and --loss_agg seq-mean-token-mean)."""
    log_ratio = logps - old_logps
    advantage = masked_mean(advantages.expand_as(logps), mask, dim=-1).unsqueeze(-1)
    sign = torch.sign(advantage)
    clamped = log_ratio.clamp(-config.clip_eps_low, config.clip_eps_high)
    kept = sign * torch.min(sign * log_ratio, sign * clamped)
    ratio = torch.exp(masked_mean(kept, mask, dim=-1)).unsqueeze(-1)
    token_losses = (-advantage * ratio).expand_as(logps)
    return PolicyTerms(token_losses, torch.exp(log_ratio), (log_ratio < -config.clip_eps_low) & (advantage < 0),
                       (log_ratio > config.clip_eps_high) & (advantage > 0))


@dataclass(frozen=True)
class BehaviourConfig:
    """What a behaviour correction is given: the cap of the truncating ones (`--behaviour_cap`) and its own
    hyperparameters (`--behaviour_correction_option NAME=VALUE ...`: the masking ones' `low`/`high` band)."""

    cap: float = 5.0
    options: Dict[str, Any] = field(default_factory=dict)

    def band(self, low: float, high: float) -> Tuple[float, float]:
        return self.options.get("low", low), self.options.get("high", high)


def truncated_is(log_ratio: torch.Tensor, mask: torch.Tensor, config: BehaviourConfig) -> torch.Tensor:
    """Token-level truncated importance sampling: min(r_t, cap) (decoupled PPO's weight, Fu et al. 2025; TIS for the
    engine/trainer mismatch, Yao et al. 2025)."""
    return torch.exp(log_ratio).clamp(max=config.cap)




def masked_is(log_ratio: torch.Tensor, mask: torch.Tensor, config: BehaviourConfig) -> torch.Tensor:
    """Token-level masked importance sampling (MIS, Liu et al. 2025): r_t where r_t <= `high` (default 2), else 0:
    a token the engine sampled far more readily than the trainer would is dropped instead of capped."""
    ratio = torch.exp(log_ratio)
    _, high = config.band(*masked_is.band)
    return torch.where(ratio <= high, ratio, torch.zeros_like(ratio))


masked_is.band = (0.0, 2.0)


def icepop(log_ratio: torch.Tensor, mask: torch.Tensor, config: BehaviourConfig) -> torch.Tensor:
    """IcePop (Ling team, Ring-1T, 2025): r_t inside the band [`low`, `high`] (default [0.5, 5]), 0 outside: masking on
    both sides, so tokens the trainer finds far likelier than the engine did are dropped too."""
    ratio = torch.exp(log_ratio)
    low, high = config.band(*icepop.band)
    return torch.where((ratio >= low) & (ratio <= high), ratio, torch.zeros_like(ratio))


icepop.band = (0.5, 5.0)


def _sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log prod_t r_t over each sample's masked tokens, as (batch, 1)."""
    return (log_ratio * mask).sum(dim=-1, keepdim=True)


def sequence_is(log_ratio: torch.Tensor, mask: torch.Tensor, config: BehaviourConfig) -> torch.Tensor:
    """Sequence-level truncated importance sampling: every token of a sample weighted by min(prod_t r_t, cap), the
    sample's own likelihood ratio (unbiased for sequence-level rewards up to the cap)."""
    capped = _sequence_log_ratio(log_ratio, mask).clamp(max=math.log(config.cap))
    return torch.exp(capped).expand_as(log_ratio)




def sequence_masked_is(log_ratio: torch.Tensor, mask: torch.Tensor, config: BehaviourConfig) -> torch.Tensor:
    """Sequence-level masked importance sampling (Liu et al. 2025): prod_t r_t for a sample whose ratio is inside
    [`low`, `high`] (default [0.5, 2]), 0 for the whole sample otherwise."""
    low, high = config.band(*sequence_masked_is.band)
    sequence = _sequence_log_ratio(log_ratio, mask)
    inside = (sequence >= math.log(low)) & (sequence <= math.log(high))
    return torch.where(inside, torch.exp(sequence.clamp(max=math.log(high))), torch.zeros_like(sequence)).expand_as(log_ratio)


sequence_masked_is.band = (0.5, 2.0)


def check_options(registry: Any, name: str, flag: str, options: Dict[str, Any]) -> None:
    """Refuse, before training, options the part `name` of `registry` does not take, and, where it declares its
    options, a value that is not a number above 0 (what every built-in policy loss's and correction's option is)."""
    registry.check_options(name, options, flag)
    if registry.options_of(name) is None:
        return
    for option, value in options.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise CoatiUsageError(f"{flag}: {registry.kind} {name!r}: option {option}={value!r} must be a number "
                                  "above 0")


class PolicyLoss(torch.nn.Module):
    """The actor's policy-gradient loss: the registered per-token loss `loss` (POLICY_LOSSES: "ppo", the PPO
    clipped surrogate -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(log pi - log pi_old), with DAPO's
    clip-higher; "gspo"; "cispo"; "sapo"), weighted for off-policy samples and aggregated.

    Constructed as ColossalChat's: `PolicyLoss(clip_eps=0.2, skip_threshold=20.0)`. `clip_eps` is both bounds
    unless `clip_eps_low` / `clip_eps_high` are given; when the mean ratio over the completion tokens exceeds
    `skip_threshold` (old log-probs far from the current policy), the batch contributes no gradient. `options` are
    the loss's own hyperparameters (SAPO's temperatures)."""

    def __init__(self, clip_eps: float = 0.2, skip_threshold: float = 20.0, *, clip_eps_low: Optional[float] = None,
                 clip_eps_high: Optional[float] = None, aggregation: str = "token-mean", norm_length: int = 0,
                 behaviour_cap: float = 5.0, loss: str = "ppo", options: Optional[Dict[str, Any]] = None,
                 behaviour_correction: str = "truncated", behaviour_options: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        self.loss = POLICY_LOSSES.get(loss)
        check_options(POLICY_LOSSES, loss, "--policy_loss_option", dict(options or {}))
        self.correction = BEHAVIOUR_CORRECTIONS.get(behaviour_correction)
        check_options(BEHAVIOUR_CORRECTIONS, behaviour_correction, "--behaviour_correction_option",
                      dict(behaviour_options or {}))
        self.behaviour = BehaviourConfig(behaviour_cap, dict(behaviour_options or {}))
        low, high = self.behaviour.band(*getattr(self.correction, "band", (0.0, math.inf)))   # a masking one's band
        if low >= high:
            raise ValueError(f"--behaviour_correction_option: behaviour correction {behaviour_correction!r} keeps "
                             f"ratios in [low, high], and low {low} is not below high {high}: every token would be "
                             "masked out")
        self.config = PolicyLossConfig(clip_eps if clip_eps_low is None else clip_eps_low,
                                       clip_eps if clip_eps_high is None else clip_eps_high, dict(options or {}))
        self.skip_threshold = skip_threshold
        self.aggregation, self.norm_length, self.behaviour_cap = aggregation, norm_length, behaviour_cap
        self.aggregation_fn = AGGREGATIONS.get(aggregation)

    @classmethod
    def from_settings(cls, settings: Any, norm_length: int = 0) -> "PolicyLoss":
        """The loss its settings section (`coati.config.PolicyLossSettings`) describes; `norm_length` is the
        completion limit a constant-length aggregation divides by."""
        return cls(clip_eps_low=settings.clip_eps_low, clip_eps_high=settings.clip_eps_high,
                   aggregation=settings.loss_agg, norm_length=norm_length, behaviour_cap=settings.behaviour_cap,
                   loss=settings.policy_loss, options=dict(settings.policy_loss_options),
                   behaviour_correction=settings.behaviour_correction,
                   behaviour_options=dict(settings.behaviour_correction_options))

    @property
    def clip_eps_low(self) -> float:
        return self.config.clip_eps_low

    @property
    def clip_eps_high(self) -> float:
        return self.config.clip_eps_high

    def aggregate(self, token_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-token values (the policy term, or the KL and entropy terms beside it) as one number, by this loss's
        aggregation, so every term of the actor's loss weighs tokens alike."""
        return self.aggregation_fn(token_values, mask.to(token_values.dtype), self.norm_length)

    def forward(self, logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                behaviour_logps: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """(loss, stats); `advantages` per token (batch, T) or per row (batch,). Stats, as fractions of
        tokens: `clip_ratio/low` and `clip_ratio/high` (where the loss's clip acted below and above; for "ppo",
        r < 1 - eps_low with A < 0 and r > 1 + eps_high with A > 0), `clip_ratio/region` (either), `clip_ratio/dual`
        (where a dual clip bounded the loss, for a loss that has one), `approx_kl` (mean (log r)^2 / 2),
        `token_loss` (the mean per-token loss, whatever the aggregation) and `skipped` (1 when the ratio passed
        `skip_threshold`).

        With `behaviour_logps` (samples generated by older weights than `old_logps`, the proximal policy, or by an
        inference engine), each token's loss is weighted by the `behaviour_correction` of r = pi_old / pi_behaviour
        (BEHAVIOUR_CORRECTIONS): by default min(r, `behaviour_cap`), decoupled PPO's off-policy correction (Fu et
        al. 2025, AReaL) and truncated importance sampling for the engine/trainer mismatch (Yao et al. 2025); or
        masked, IcePop, sequence-level. Stats add the mean weight (`behaviour_weight`), the fraction of tokens whose
        weight is not r (`behaviour_capped`: capped or masked) and the ratio's mean, min and max
        (`behaviour_ratio`, `behaviour_ratio_min`, `behaviour_ratio_max`)."""
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(-1)
        terms = self.loss(logps, old_logps, advantages, mask.to(logps.dtype), self.config)
        token_losses, ratio = terms.token_losses, terms.ratio
        weights = capped = None
        if behaviour_logps is not None:
            log_ratio = (old_logps - behaviour_logps).detach()
            weights = torch.exp(log_ratio)
            capped = self.correction(log_ratio, mask.to(logps.dtype), self.behaviour).detach()
            token_losses = token_losses * capped
        loss = self.aggregate(token_losses, mask)
        skip = bool(masked_mean(ratio.detach(), mask) > self.skip_threshold)
        if skip:
            loss = loss * 0.0
        with torch.no_grad():
            mask = mask.float()
            low, high = terms.clipped_low.expand_as(ratio), terms.clipped_high.expand_as(ratio)
            stats = {"clip_ratio/low": masked_mean(low.float(), mask), "clip_ratio/high": masked_mean(high.float(), mask),
                     "clip_ratio/region": masked_mean((low | high).float(), mask),
                     "approx_kl": masked_mean(0.5 * (logps - old_logps) ** 2, mask),
                     "token_loss": masked_mean(token_losses, mask), "skipped": torch.tensor(float(skip))}
            if terms.clipped_dual is not None:
                stats["clip_ratio/dual"] = masked_mean(terms.clipped_dual.float(), mask)
            if weights is not None:
                stats.update(behaviour_stats(weights, capped, mask))
        return loss, stats


def behaviour_stats(weights: torch.Tensor, capped: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The off-policy ratios pi_old / pi_behaviour over the masked tokens and the weights a correction made of them:
    the weights' mean, the fraction of tokens whose weight is not their ratio (capped or masked), and the ratio's
    mean, min and max (1 where no token is masked in)."""
    tokens = weights[mask.bool()]
    present = tokens.numel() > 0
    changed = ~torch.isclose(capped, weights, rtol=1e-6, atol=0.0)
    return {"behaviour_weight": masked_mean(capped, mask),
            "behaviour_capped": masked_mean(changed.float(), mask),
            "behaviour_ratio": masked_mean(weights, mask),
            "behaviour_ratio_min": tokens.min() if present else weights.new_tensor(1.0),
            "behaviour_ratio_max": tokens.max() if present else weights.new_tensor(1.0)}


class ValueLoss(torch.nn.Module):
    """PPO clipped value loss: 0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2), masked mean,
    with returns R = A + V_old. Called as ColossalChat's: `(values, old_values, advantages, mask)`, the
    advantages before any normalisation."""

    def __init__(self, clip_eps: float = 0.2) -> None:
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, values: torch.Tensor, old_values: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        returns = advantages + old_values
        clipped = old_values + (values - old_values).clamp(-self.clip_eps, self.clip_eps)
        losses = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)
        return masked_mean(losses, mask.to(losses.dtype))


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    return logits.logsumexp(-1) - (torch.softmax(logits, -1) * logits).sum(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each next-token distribution, (batch, T, vocab) -> (batch, T), chunk by chunk (`over_chunks`)."""
    return over_chunks(_entropy, logits)
