"""PPO's critic: a backbone with a per-token value head, stored as HF `*ForTokenClassification` (one label).

Stored that way, `from_pretrained` loads any causal LM or reward model as a critic: a reward model's
`score` head becomes the value head (ColossalChat starts the critic from the reward model), and a
causal LM gets a new head. A vision-language model, which transformers has no token classifier for, is its
image-text-to-text model with a one-output head in place of its LM head, so that it reads the images as the policy
does (`load_vision_value_model`: a vision-language reward model's head becomes the value head there too).
"""
from typing import Any, Dict, Optional

import torch
from transformers import AutoConfig, AutoModelForTokenClassification, PretrainedConfig, PreTrainedModel

from .logprobs import padded_positions
from .packing import pack_rollouts, shares_prompts
from .reward_model import from_pretrained_with_head, load_vision_value_model, model_with_head
from .vision import is_vision_model


def load_critic(path: str, pad_token_id: int, trust_remote_code: bool = False) -> PreTrainedModel:
    """A critic from `path` (reward model, earlier critic, causal LM or vision-language model), with no dropout on
    its values."""
    if is_vision_model(path):
        model = load_vision_value_model(path, "critic", trust_remote_code=trust_remote_code)
    else:
        config = AutoConfig.from_pretrained(path, num_labels=1, trust_remote_code=trust_remote_code)
        config.classifier_dropout = 0.0
        model = from_pretrained_with_head(AutoModelForTokenClassification, path, "critic", config=config,
                                          trust_remote_code=trust_remote_code)
    model.config.pad_token_id = pad_token_id
    return model


def action_values(critic: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor,
                  prompt_length: int, packed: bool = False,
                  images: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
    """V(s_t) for each completion token t of `sequences[:, prompt_length:]`: the value read at the token
    before it, so values line up with `action_logps`. (batch, N), float32. `packed`: one forward without padding,
    each prompt once (`pack_rollouts`; a token classifier takes no row lengths, its rows are told by positions).
    `images`: the rows' image inputs, for a vision-language critic (padded rows only)."""
    if packed:
        rollouts = pack_rollouts(sequences, attention_mask, prompt_length, shares_prompts(critic))
        inputs = {name: rollouts.inputs[name] for name in ("input_ids", "position_ids")}
        return rollouts.rows(critic(**inputs).logits[:, rollouts.kept].squeeze(-1)).float()
    return token_values(critic, sequences, attention_mask, images)[:, prompt_length - 1:-1].float()


def token_values(critic: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor,
                 images: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
    """The critic's value at every position of left- or right-padded `sequences`, (batch, length); with `images`,
    read with them (at Qwen2-VL's 3-D positions where the critic has them, as `action_logps` reads the policy)."""
    return critic(input_ids=sequences, attention_mask=attention_mask,
                  position_ids=padded_positions(critic, sequences, attention_mask, images),
                  **(images or {})).logits.squeeze(-1)


class Critic(torch.nn.Module):
    """ColossalChat's `Critic(pretrained, config, **from_pretrained_kwargs)`: coati's critic (`.model`, a
    `*ForTokenClassification` with one label) whose forward gives a value at every position, (batch, length)."""

    def __init__(self, pretrained: Optional[str] = None, config: Optional[PretrainedConfig] = None, **kwargs: Any) -> None:
        super().__init__()
        self.model = model_with_head(AutoModelForTokenClassification, pretrained, config, "critic", **kwargs)
        self.config = self.model.config

    def forward(self, input_ids: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return token_values(self.model, input_ids, torch.ones_like(input_ids) if attention_mask is None else attention_mask)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> Optional[torch.nn.Module]:
        return self.model.get_output_embeddings()
