"""Process reward models (PRMs): a token classifier (step correct or not) read at the token that ends each step of a
solution, trained on step-labelled data (`prepare_dataset.py --type prm`, `train_prm.py`) and used inside PPO/GRPO,
where each step's score becomes a reward on the token that ends it.

A step ends at its last token, the one before the step separator (saved in the model's config as `step_separator`,
`\\n` by default, as TRL's PRMTrainer) or, for the last step, before the stop token; a last step cut off by the
length limit is not scored."""
import json
from pathlib import Path
from typing import Optional, Tuple

import torch
from transformers import AutoModelForTokenClassification, PreTrainedModel

from coati.config import DEFAULT_STEP_SEPARATOR

from .logprobs import mask_positions
from .reward_model import from_pretrained_with_head

STEP_SEPARATOR_KEY = "step_separator"
CORRECT = 1
"""The class whose probability is a step's score."""


def load_prm(path: str, pad_token_id: int, separator: Optional[str] = None, trust_remote_code: bool = False,
             attn_implementation: Optional[str] = None) -> PreTrainedModel:
    """A PRM from `path`: an earlier PRM, or a causal LM to start one from (a new two-class token head); `separator`
    (default: the PRM's own, else `\\n`) is saved with it."""
    model = from_pretrained_with_head(AutoModelForTokenClassification, path, "process reward model", num_labels=2,
                                      trust_remote_code=trust_remote_code, attn_implementation=attn_implementation)
    model.config.pad_token_id = pad_token_id
    setattr(model.config, STEP_SEPARATOR_KEY, separator or step_separator(model))
    return model


def load_frozen_prm(path: str, device: torch.device, dtype: torch.dtype = torch.float32,
                    trust_remote_code: bool = False) -> PreTrainedModel:
    """A trained PRM (train_prm.py's output), frozen, in eval mode, on `device`."""
    model = AutoModelForTokenClassification.from_pretrained(path, torch_dtype=dtype, trust_remote_code=trust_remote_code)
    model.requires_grad_(False)
    return model.to(device).eval()


def is_prm_folder(path: str) -> bool:
    """Whether `path` holds a token-classification model (a PRM), by its config's architecture."""
    config = Path(path) / "config.json"
    return config.is_file() and any(a.endswith("ForTokenClassification")
                                    for a in json.loads(config.read_text()).get("architectures") or [])


def step_separator(model: torch.nn.Module) -> str:
    """The separator a PRM was trained with."""
    return getattr(model.config, STEP_SEPARATOR_KEY, None) or DEFAULT_STEP_SEPARATOR


def separator_tokens(tokenizer, separator: str) -> torch.Tensor:
    """(vocab,) bool: which token ids hold `separator` (alone, or merged with neighbouring text)."""
    vocab = len(tokenizer)
    return torch.tensor([separator in tokenizer.decode([i]) for i in range(vocab)], dtype=torch.bool)


def step_ends(completion_ids: torch.Tensor, action_mask: torch.Tensor, separators: torch.Tensor,
              terminated: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(batch, N) bool: the completion tokens that end a step, where a PRM trained on `tokenize_steps`' labels reads
    it: each token followed by a separator token, and the last token before the stop token unless it is a separator
    itself. A last step cut off by the length limit (`terminated` False) has not ended and is not scored, so a policy
    cannot collect step rewards for unfinished text; without `terminated`, completions are taken as ended."""
    mask = action_mask.bool()
    is_separator = separators.to(completion_ids.device)[completion_ids.clamp(0, separators.numel() - 1)] & mask
    ends = torch.zeros_like(mask)
    ends[:, :-1] = is_separator[:, 1:] & mask[:, :-1] & ~is_separator[:, :-1]
    ended = terminated.bool() if terminated is not None else torch.ones_like(mask[:, 0])
    last = mask.long().sum(-1) - 1 - (terminated.long() if terminated is not None else 0)
    keep = (last >= 0) & ended
    rows, last = torch.arange(completion_ids.size(0), device=completion_ids.device)[keep], last[keep]
    ends[rows, last] |= ~is_separator[rows, last]
    return ends


@torch.no_grad()
def step_scores(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                action_mask: torch.Tensor, separators: torch.Tensor,
                terminated: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The PRM's probability that each step is correct, on the token that ends it (batch, N; 0 elsewhere), and where
    steps end (bool), for left-padded prompts followed by completions (`step_ends`)."""
    logits = model(input_ids=sequences, attention_mask=attention_mask,
                   position_ids=mask_positions(attention_mask)).logits[:, prompt_length:].float()
    ends = step_ends(sequences[:, prompt_length:], action_mask, separators, terminated)
    return torch.softmax(logits, dim=-1)[..., CORRECT] * ends, ends


class StepScorer:
    """A frozen PRM scoring completions' steps for PPO/GRPO: `coef` times each step's score on the token that ends it,
    and where the steps end (`step_scores`)."""

    def __init__(self, model: torch.nn.Module, tokenizer, coef: float = 1.0) -> None:
        self.model, self.coef = model, coef
        self.separators = separator_tokens(tokenizer, step_separator(model))

    def __call__(self, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                 action_mask: torch.Tensor, terminated: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        scores, ends = step_scores(self.model, sequences, attention_mask, prompt_length, action_mask, self.separators,
                                   terminated)
        return self.coef * scores, ends
