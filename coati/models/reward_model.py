"""Reward models: a causal-LM backbone with a scalar head, stored as HF `*ForSequenceClassification` (one label).

Stored that way, `from_pretrained` loads the backbone and its head, and any causal-LM checkpoint starts
one (the head is then new). The reward of a sequence is read at its last non-pad token. A vision-language model,
which transformers has no sequence classifier for, is its image-text-to-text model with a one-output head in place of
its LM head (`load_vision_value_model`), so that it reads the images as the policy does.
"""
from typing import Any, Callable, Dict, List, Optional

import torch
import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel

from coati.dataset.collators import both_sides, row_ends
from coati.utils.errors import CoatiUsageError, warn_user

from .logprobs import mask_positions, padded_positions
from .packing import chosen_then_rejected, is_packed
from .vision import auto_model_class, image_inputs, is_vision_model


def from_pretrained_with_head(auto_cls: Any, path: str, role: str, **kwargs: Any) -> PreTrainedModel:
    """`auto_cls.from_pretrained(path, **kwargs)` for a model with a head that `path` may lack (a causal LM
    to start from): a new head is said in one line of ours, instead of transformers' two-line notice."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model, info = auto_cls.from_pretrained(path, output_loading_info=True, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
    new = sorted([*info["missing_keys"], *info.get("mismatched_keys", ())])
    if new and all(key.endswith(".bias") and f"{key[:-5]}.weight" not in new for key in new):
        warn_user(f"{role}: {', '.join(new)} start freshly initialised ({path} holds the head's weights, not its bias: "
                  "a reward model's head has none)")
    elif new:
        warn_user(f"{role}: {', '.join(new)} start from random weights ({path} does not hold them in this shape, as "
                  "expected when starting from a language model)")
    return model


def load_reward_model(path: str, pad_token_id: int, trust_remote_code: bool = False,
                      attn_implementation: Optional[str] = None) -> PreTrainedModel:
    """A reward model from `path`: an earlier reward model, or a causal LM (or vision-language model) to start one
    from."""
    if is_vision_model(path):
        model = load_vision_value_model(path, "reward model", trust_remote_code=trust_remote_code,
                                        attn_implementation=attn_implementation)
    else:
        model = from_pretrained_with_head(AutoModelForSequenceClassification, path, "reward model", num_labels=1,
                                          trust_remote_code=trust_remote_code, attn_implementation=attn_implementation)
    model.config.pad_token_id = pad_token_id
    return model


def load_vision_value_model(path: str, role: str, trust_remote_code: bool = False, **kwargs: Any) -> PreTrainedModel:
    """The vision-language model of `path` with a one-output head in place of its LM head, untied from the input
    embeddings: a reward model or critic that reads the images. A folder saved from one (coati's reward model or
    critic) loads with its head; a policy's folder starts a new head, initialised as HF initialises a classifier's."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for part in (config, config.get_text_config()):
        part.tie_word_embeddings = False
    mapping = auto_model_class(path)._model_mapping
    if type(config) not in mapping:
        raise CoatiUsageError(f"{role}: {path} is a vision-language model ({config.model_type}) that transformers has "
                              "no image-text-to-text class for")
    return from_pretrained_with_head(_with_value_head(mapping[type(config)]), path, role, config=config,
                                     ignore_mismatched_sizes=True, trust_remote_code=trust_remote_code, **kwargs)


def _with_value_head(model_class: Any) -> Any:
    """`model_class` (an image-text-to-text model) under its own name, built with a one-output LM head."""

    def __init__(self: PreTrainedModel, config: PretrainedConfig, *args: Any, **kwargs: Any) -> None:
        model_class.__init__(self, config, *args, **kwargs)
        head = torch.nn.Linear(self.get_output_embeddings().in_features, 1, bias=False)
        torch.nn.init.normal_(head.weight, std=getattr(config.get_text_config(), "initializer_range", 0.02))
        self.set_output_embeddings(head)

    return type(model_class.__name__, (model_class,), {"__init__": __init__})


def last_attended(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's index of its last attended token, left- or right-padded."""
    return (attention_mask * torch.arange(attention_mask.size(1), device=attention_mask.device)).argmax(-1)


def sequence_rewards(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     images: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
    """One scalar reward per row, in float32, read at the row's last non-pad token. Positions count real
    tokens only, so a left-padded row (as rollouts are) scores as it would unpadded, for absolute
    position embeddings too. `images`: the rows' image inputs, for a vision-language reward model (which scores
    every position: the row's last is read)."""
    scores = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=padded_positions(model, input_ids, attention_mask, images), **(images or {})).logits
    if scores.dim() == 3:
        last = last_attended(attention_mask)
        scores = scores[torch.arange(input_ids.size(0), device=input_ids.device), last]
    return scores.squeeze(-1).float()


def pair_rewards(model: torch.nn.Module, batch: Dict[str, Any]) -> torch.Tensor:
    """Rewards of a preference batch's chosen rows then rejected rows, in one forward (padded or packed)."""
    if not is_packed(batch):
        return sequence_rewards(model, both_sides(batch, "input_ids"), both_sides(batch, "attention_mask"),
                                image_inputs(batch, repeat=2))
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
        last = last_attended(mask)
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
