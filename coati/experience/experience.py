"""One batch of on-policy experience, and the GRPO experience maker that produces it."""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch

from coati.models.generation import GenerationOutput, InferenceEngine, SamplingConfig
from coati.models.logprobs import action_logps
from coati.models.loss import kl_penalty
from coati.rewards import WeightedReward

from .advantages import group_advantages, tied_groups


@dataclass
class Experience:
    """Rollouts and everything the update needs. Token tensors over completion columns are (batch, N);
    `sequences`/`attention_mask` hold prompt + completion. `info` keeps text and per-sample stats for logs."""

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    prompt_length: int
    action_log_probs: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    ref_log_probs: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    returns: Optional[torch.Tensor] = None
    kl: Optional[torch.Tensor] = None
    loss_mask: Optional[torch.Tensor] = None
    info: Dict[str, Any] = field(default_factory=dict)


@dataclass
class GRPOSettings:
    """Rollout settings; `kl_estimator` serves both the logged KL and the trainer's KL loss."""

    num_generations: int = 8
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    kl_estimator: str = "k3"
    scale_rewards: bool = True
    drop_tied_groups: bool = False


class GRPOExperienceMaker:
    """`num_generations` completions per prompt, scored by the reward function; advantages are the rewards
    normalised within each prompt's group (no critic). With `drop_tied_groups` (DAPO), groups whose
    rewards all tie are kept in the batch (every rank steps alike) but masked out of the loss."""

    def __init__(self, actor: torch.nn.Module, engine: InferenceEngine, tokenizer: Any, reward_fn: WeightedReward,
                 settings: GRPOSettings, ref_model: Optional[torch.nn.Module] = None) -> None:
        self.actor, self.engine, self.tokenizer, self.reward_fn = actor, engine, tokenizer, reward_fn
        self.settings, self.ref_model = settings, ref_model

    def score(self, batch: Dict[str, Any], out: GenerationOutput, with_text: bool = False):
        """Rewards of generated completions: (total, components), and the decoded prompts and completions
        with `with_text`. The batch's other fields (e.g. `gt_answer`) go to the reward function."""
        prompts = self.tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
        completions = [self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True)
                       for row, m in zip(out.sequences[:, out.prompt_length:], out.action_mask)]
        fields_ = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask")}
        total, components = self.reward_fn(prompts, completions, **fields_)
        return (total, components, prompts, completions) if with_text else (total, components)

    @torch.no_grad()
    def make(self, batch: Dict[str, Any]) -> Experience:
        n = self.settings.num_generations
        batch = {k: v.repeat_interleave(n, 0) if isinstance(v, torch.Tensor) else [x for x in v for _ in range(n)]
                 for k, v in batch.items()}
        input_ids = batch["input_ids"]
        out = self.engine.generate(input_ids, batch["attention_mask"], self.settings.sampling)
        total, components, prompts, completions = self.score(batch, out, with_text=True)
        rewards = torch.tensor(total, dtype=torch.float32, device=input_ids.device)
        advantages = group_advantages(rewards, n, self.settings.scale_rewards)
        old_logps = action_logps(self.actor, out.sequences, out.attention_mask, out.prompt_length)
        ref_logps = kl = None
        if self.ref_model is not None:
            ref_logps = action_logps(self.ref_model, out.sequences, out.attention_mask, out.prompt_length)
            kl = kl_penalty(old_logps, ref_logps, self.settings.kl_estimator) * out.action_mask
        loss_mask = out.action_mask.clone()
        tied = tied_groups(rewards, n)
        if self.settings.drop_tied_groups:
            loss_mask[tied] = False
        info = {"prompts": prompts, "completions": completions, "reward_components": components,
                "tied_fraction": tied.float().mean().item()}
        return Experience(out.sequences, out.attention_mask, out.action_mask, out.prompt_length, old_logps, rewards,
                          advantages, ref_log_probs=ref_logps, kl=kl, loss_mask=loss_mask, info=info)
