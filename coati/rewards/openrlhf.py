"""OpenRLHF's reward functions, `reward_func(queries, prompts, labels, **kwargs)`, as coati's.

OpenRLHF (`--reward.remote_url my_reward.py`) calls it with lists: `queries`, each full sequence as text (prompt and
completion, with the chat template's special tokens), `prompts` (here their text, without the template), and
`labels`, each row's `--data.label_key` column (coati's `label` column, which `--dataset_columns KEY=label` names).
It returns a tensor of rewards, or a dict of `rewards`, `scores` (OpenRLHF's filter reads them) and `extra_logs`
(numbers logged beside the reward).
`OpenRLHFReward` makes such a function one that takes TRL's arguments, so `--reward_fn my_reward.py:reward_func`
takes it as it is.
"""
import inspect
from typing import Any, Callable, List, Optional, Sequence

from .output import RewardOutput
from .remote import Sequences

LABEL_COLUMN = "label"
"""The column whose values OpenRLHF's reward function gets as `labels` (its `--data.label_key` names it there)."""


def is_openrlhf_function(fn: Callable) -> bool:
    """Whether `fn` takes OpenRLHF's arguments (`queries` and `labels`) rather than TRL's (`completions`)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "queries" in parameters and "labels" in parameters and "completions" not in parameters


class OpenRLHFReward:
    """An OpenRLHF `reward_func`, called once per batch with OpenRLHF's arguments, taking TRL's (the prompts, the
    completions, the full sequences and the data's columns) and returning its rewards, `extra_logs` as
    diagnostics."""

    takes_sequences = True
    """`WeightedReward` passes it the full `sequences` as well: OpenRLHF's `queries`."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "reward_func")

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], sequences: Optional[Sequences] = None,
                 label: Optional[Sequence[Any]] = None, **_: Any) -> RewardOutput:
        prompt_texts = [_text(prompt) for prompt in prompts]
        queries = sequences.texts if sequences else [p + _text(c) for p, c in zip(prompt_texts, completions)]
        labels = list(label) if label is not None else [None] * len(completions)
        answer = self.fn(queries, prompt_texts, labels)
        if isinstance(answer, dict):
            logs = {name: _numbers(values) for name, values in (answer.get("extra_logs") or {}).items()}
            return RewardOutput(_numbers(answer["rewards"]), logs)
        return RewardOutput(_numbers(answer), {})


def _numbers(values: Any) -> List[float]:
    """A tensor, an array or a list of rewards as a list of floats."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [float(value) for value in values]


def _text(value: Any) -> str:
    """A prompt's or completion's text: the text itself, or a conversation's (its messages') content."""
    if isinstance(value, str):
        return value
    return "".join(str(message.get("content") or "") for message in value)

