"""verl's reward functions, `compute_score(data_source, solution_str, ground_truth, extra_info=None)`, as coati's.

verl scores one completion per call: `solution_str` is its text, `ground_truth` the row's `reward_model` column's
`ground_truth` (verl's parquet rows: `{"ground_truth": ..., "style": "rule"}`), `data_source` and `extra_info` the
row's columns of those names. It returns a number, or a dict whose `score` is the reward (its other numbers are
logged beside it, its other values shown in the sample tables). `VerlScore` makes such a function one that takes
TRL's arguments, so `--reward_funcs my_reward.py:compute_score` (verl's `custom_reward_function.path` and `.name`)
takes it as it is.
"""
import inspect
from numbers import Number
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .output import RewardOutput

GROUND_TRUTH_COLUMNS = ("reward_model", "ground_truth")
"""Where a row's ground truth is: verl's `reward_model` column (its `ground_truth`), or a column of its own."""


def is_verl_function(fn: Callable) -> bool:
    """Whether `fn` takes verl's arguments (a `solution_str`) rather than TRL's (`completions`)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "solution_str" in parameters and "completions" not in parameters


class VerlScore:
    """A verl `compute_score`, called once per completion with verl's arguments (those it takes), taking TRL's (the
    completions and the data's columns) and returning their scores, a dict's other numbers as diagnostics."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "compute_score")
        self.takes = _parameters(fn)

    def __call__(self, completions: Sequence[Any], reward_model: Optional[Sequence[Any]] = None,
                 ground_truth: Optional[Sequence[Any]] = None, data_source: Optional[Sequence[Any]] = None,
                 extra_info: Optional[Sequence[Any]] = None, **_: Any) -> RewardOutput:
        rows = len(completions)
        truths = list(ground_truth) if ground_truth is not None else [_truth(value) for value in reward_model or []]
        sources = list(data_source) if data_source is not None else [None] * rows
        extras = list(extra_info) if extra_info is not None else [None] * rows
        scores = [self.fn(**self._arguments(sources[i], _text(completions[i]), truths[i], extras[i]))
                  for i in range(rows)]
        numbers, others = _extras(scores)
        return RewardOutput([_score(score) for score in scores], numbers, others)

    def _arguments(self, data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any) -> Dict[str, Any]:
        """verl's four arguments, those the function takes (verl's own `gsm8k.compute_score` takes two)."""
        given = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
                 "extra_info": dict(extra_info or {})}
        return {name: value for name, value in given.items() if self.takes is None or name in self.takes}

    @staticmethod
    def missing_columns(columns: Sequence[str]) -> Optional[str]:
        """What the data lacks for verl's arguments (a row's ground truth), or None."""
        if any(column in columns for column in GROUND_TRUTH_COLUMNS):
            return None
        return "a ground truth: verl's 'reward_model' column ({'ground_truth': ...}) or a 'ground_truth' column"


def _parameters(fn: Callable) -> Optional[Tuple[str, ...]]:
    """The names `fn` takes by keyword, or None where it takes any (`**kwargs`)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _truth(value: Any) -> Any:
    """The ground truth in a `reward_model` cell (verl's `{"ground_truth": ...}`), or the cell itself."""
    return value.get("ground_truth") if isinstance(value, Mapping) else value


def _text(completion: Any) -> str:
    """A completion's text: the text itself, or a conversational completion's (its messages') content."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


def _score(score: Any) -> Any:
    """The reward of one verl result: the number, or a dict's `score`."""
    return score.get("score") if isinstance(score, Mapping) else score


def _extras(scores: List[Any]) -> Tuple[Dict[str, List[float]], Dict[str, List[Any]]]:
    """(the numbers, and the other values, that every dict result holds beside its `score`, by key): the numbers
    (booleans as 0/1: DAPO's `acc`) are logged beside the reward, the rest shown in the sample tables (its `pred`)."""
    if not scores or not all(isinstance(score, Mapping) for score in scores):
        return {}, {}
    keys = [key for key in scores[0] if key != "score" and all(key in score for score in scores)]
    numbers = {str(key): [float(score[key]) for score in scores] for key in keys
               if all(isinstance(score[key], Number) for score in scores)}
    others = {str(key): [score[key] for score in scores] for key in keys if str(key) not in numbers}
    return numbers, others
