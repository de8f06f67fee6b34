"""Online DPO written outside coati, as one objective (`--objective online_dpo_objective:OnlineDPO`): each prompt's
two sampled completions (`--num_generations 2`), scored by the run's rewards, form a pair, the better one chosen;
the loss is DPO's on that pair against the frozen reference (Guo et al. 2024, Direct Language Model Alignment from
Online AI Feedback). Pairs whose rewards tie are left out."""
import torch
import torch.nn.functional as F

from coati.models.logprobs import action_logps
from coati.trainer.components import ObjectiveConfig, ObjectiveOutput


class OnlineDPO:
    """-log sigmoid(beta * [(log pi - log ref)(chosen) - (log pi - log ref)(rejected)]), summed log-probs, averaged
    over the untied pairs; `beta` from `--objective_option beta=...` (default 0.1)."""

    needs_reference = True

    def __init__(self, config: ObjectiveConfig) -> None:
        self.beta = float(config.options.get("beta", 0.1))

    def __call__(self, actor: torch.nn.Module, experience) -> ObjectiveOutput:
        mask = experience.action_mask.float()
        logps = action_logps(actor, experience.sequences, experience.attention_mask, experience.prompt_length)
        ratios = ((logps - experience.ref_log_probs) * mask).sum(-1).view(-1, 2)
        rewards = experience.rewards.view(-1, 2)
        sign = torch.where(rewards[:, 0] >= rewards[:, 1], 1.0, -1.0)
        margin = sign * (ratios[:, 0] - ratios[:, 1])
        untied = rewards[:, 0] != rewards[:, 1]
        losses = -F.logsigmoid(self.beta * margin) * untied
        loss = losses.sum() / untied.sum().clamp(min=1)
        pairs = int(untied.sum())
        metrics = {"loss": (loss.item(), 1), "dpo/untied_pairs": (float(pairs), 1)}
        if pairs:
            metrics.update({"loss/dpo": (losses.sum().item(), pairs),
                            "dpo/margin": ((margin.detach() * untied).sum().item(), pairs)})
        return ObjectiveOutput(loss, metrics)


def distinct_characters(completions, **kwargs):
    """A reward that rarely ties, for the test: how many different characters the completion's text holds."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(set(text))) for text in texts]
