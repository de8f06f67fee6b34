"""Reward models: a causal-LM backbone with a scalar head, stored as HF `*ForSequenceClassification` (one label).

Stored that way, `from_pretrained` loads the backbone and its head, and any causal-LM checkpoint starts
one (the head is then new). The reward of a sequence is read at its last non-pad token.
"""
from typing import Any, Callable, Dict, List, Optional

import torch
import transformers
from transformers import AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel

from coati.dataset.collators import both_sides, row_ends
from coati.utils.errors import CoatiUsageError, warn_user

from .logprobs import mask_positions
from .packing import chosen_then_rejected, is_packed


def from_pretrained_with_head(auto_cls: Any, path: str, role: str, **kwargs: Any) -> PreTrainedModel:
    """`auto_cls.from_pretrained(path, **kwargs)` for a model with a head that `path` may lack (a causal LM
    to start from): a new head is said in one line of ours, instead of transformers' two-line notice."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model, info = auto_cls.from_pretrained(path, output_loading_info=True, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
    if info["missing_keys"]:
        warn_user(f"{role}: {path} has no {', '.join(sorted(info['missing_keys']))}; it starts from random weights "
                  "(as expected when starting from a causal LM)")
    return model


def load_reward_model(path: str, pad_token_id: int, trust_remote_code: bool = False,
                      attn_implementation: Optional[str] = None) -> PreTrainedModel:
    """A reward model from `path`: an earlier reward model, or a causal LM to start one from."""
    model = from_pretrained_with_head(AutoModelForSequenceClassification, path, "reward model", num_labels=1,
                                      trust_remote_code=trust_remote_code, attn_implementation=attn_implementation)
    model.config.pad_token_id = pad_token_id
    return model


def sequence_rewards(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One scalar reward per row, in float32, read at the row's last non-pad token. Positions count real
    tokens only, so a left-padded row (as rollouts are) scores as it would unpadded, for absolute
    position embeddings too."""
    position_ids = mask_positions(attention_mask)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits.squeeze(-1).float()


def pair_rewards(model: torch.nn.Module, batch: Dict[str, Any]) -> torch.Tensor:
    """Rewards of a preference batch's chosen rows then rejected rows, in one forward (padded or packed)."""
    if not is_packed(batch):
        return sequence_rewards(model, both_sides(batch, "input_ids"), both_sides(batch, "attention_mask"))
    return packed_rewards(model, batch)


def packed_rewards(model: torch.nn.Module, batch: Dict[str, Any]) -> torch.Tensor:
    """One reward per row of a packed batch, read at each row's last token from the scores the model's `score` head
    gives every position (the pooled output reads only the pack's last token): a branch's last token is its row's.
    A sequence classifier's forward takes no row lengths; its attention tells the rows by their position ids."""
    head = _score_head(model)
    scores: List[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, inputs, output: scores.append(output))
    try:
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    finally:
        handle.remove()
    return chosen_then_rejected(scores[-1][0, row_ends(batch["seq_lens"]), 0].float())


def _score_head(model: torch.nn.Module) -> torch.nn.Module:
    """The scalar head (`score`, as transformers' `*ForSequenceClassification` names it) inside `model`'s wrappers."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "score":
            return module
    raise CoatiUsageError(f"--packing: {type(model).__name__} has no `score` head to read each packed row's reward "
                          "from; train this reward model without --packing")


def model_with_head(auto_cls: Any, pretrained: Optional[str], config: Optional[PretrainedConfig], role: str,
                    **kwargs: Any) -> PreTrainedModel:
    """ColossalChat's model construction: from `pretrained` (with `config` when given), else from `config` alone."""
    if pretrained is not None:
        extra = {"config": config} if config is not None else {"num_labels": 1}
        return from_pretrained_with_head(auto_cls, pretrained, role, **extra, **kwargs)
    if config is not None:
        config.num_labels = 1
        return auto_cls.from_config(config, **kwargs)
    raise ValueError(f"{role}: either pretrained or config must be provided")


class RewardModel(torch.nn.Module):
    """ColossalChat's `RewardModel(pretrained, config, **from_pretrained_kwargs)`: coati's reward model (`.model`, a
    `*ForSequenceClassification` with one label, so it saves and loads like coati's) whose forward gives one
    reward per row, read at the row's last attended token."""

    def __init__(self, pretrained: Optional[str] = None, config: Optional[PretrainedConfig] = None, **kwargs: Any) -> None:
        super().__init__()
        self.model = model_with_head(AutoModelForSequenceClassification, pretrained, config, "reward model", **kwargs)
        self.config = self.model.config

    def forward(self, input_ids: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None, **kwargs: Any) -> torch.Tensor:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        hidden = self.model.base_model(input_ids=input_ids, attention_mask=mask,
                                       position_ids=mask_positions(mask)).last_hidden_state
        last = (mask * torch.arange(input_ids.size(1), device=input_ids.device)).argmax(-1)
        return _score_head(self.model)(hidden[torch.arange(input_ids.size(0)), last]).squeeze(-1)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> Optional[torch.nn.Module]:
        return self.model.get_output_embeddings()

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> torch.nn.Module:
        return self.model.resize_token_embeddings(*args, **kwargs)


class RLVRRewardModel:
    """ColossalChat's verifiable-reward "model": each row's reward is the sum of `reward_fn_list`'s functions,
    called as `fn(input_ids, attention_mask, response_start=, response_end=, gt_answer=, **kwargs)` per row."""

    def __init__(self, reward_fn_list: List[Callable], **kwargs: Any) -> None:
        self.reward_fn_list = reward_fn_list
        self.kwargs = kwargs

    def __call__(self, input_ids: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None,
                 response_start: Optional[List] = None, response_end: Optional[List] = None,
                 gt_answer: Optional[List] = None) -> torch.Tensor:
        rows = input_ids.size(0)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        per_row = [[None] * rows if column is None else column for column in (response_start, response_end, gt_answer)]
        return torch.tensor([sum(float(fn(input_ids[i], mask[i], response_start=per_row[0][i], response_end=per_row[1][i],
                                           gt_answer=per_row[2][i], **self.kwargs)) for fn in self.reward_fn_list)
                             for i in range(rows)], device=input_ids.device)

    def to(self, device: Any) -> "RLVRRewardModel":
        return self

    def eval(self) -> "RLVRRewardModel":
        return self
