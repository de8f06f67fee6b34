"""Reward functions by name, and a weighted sum of them.

Contract (TRL's): `fn(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns)`
returns one value per completion: a float, or None where the function does not apply to that row (it is then left
out of the sum and of that function's metrics; a row no function scores gets 0, with a warning). `prompts` and
`completions` come in the data's own format: text for TRL's standard rows, message lists for conversational ones
(each completion one assistant message). `columns` are the prompt data's other columns, e.g. `gt_answer`;
`log_extra(column, values)` adds a column to the sample table, `log_metric(name, value)` logs a number. A function
may be `async def`, and may also return a dict of named lists (each a component, logged on its own) or a
`RewardOutput` (the reward, and diagnostics that are logged but not added).
Built-ins: `math_answer`, `answer_format`, `code_tests`, and `judge` (an LLM judge, `coati.rewards.judge`, which the
training scripts configure with their `--judge_*` flags); a reward server by its `http(s)://` URL (these get text);
your own as `package.module:function`, `module.function` (TRL's form; the working directory is importable) or
`path/to/file.py:function` (TRL's arguments, verl's `compute_score(data_source, solution_str, ground_truth,
extra_info)` or OpenRLHF's `reward_func(queries, prompts, labels)`), logged as `rewards/function/...`; each with an
optional weight: `--reward_fn math_answer answer_format=0.1`.
"""
import asyncio
import inspect
import math
import re
import sysconfig
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from coati.utils.errors import CoatiUsageError, warn_user
from coati.utils.registry import REWARD_FUNCTIONS

from .code import code_tests
from .math import answer_format, math_answer
from .output import RewardOutput
from .remote import RemoteReward, Sequences, is_url
from .openrlhf import OpenRLHFReward, is_openrlhf_function
from .verl import VerlScore, is_verl_function

RewardFn = Callable[..., object]
BUILTIN: Dict[str, RewardFn] = {"math_answer": math_answer, "answer_format": answer_format, "code_tests": code_tests}


class RewardFunctionError(CoatiUsageError):
    """A reward function raised or returned something unusable; the message names it, and `details` holds the
    function's own traceback frames where it raised (printed before the message)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


COATI_SOURCE = str(Path(__file__).resolve().parents[1])


def user_frames(error: BaseException) -> str:
    """`error`'s traceback without coati's and the standard library's frames: where in the user's own code it
    raised."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith((COATI_SOURCE, sysconfig.get_paths()["stdlib"]))]
    if not frames:
        return ""
    text = "".join(traceback.format_list(frames))
    return f"Traceback (the reward function's frames):\n{text}{''.join(traceback.format_exception_only(error))}"


def resolve(name: str, builtins: Optional[Dict[str, RewardFn]] = None) -> RewardFn:
    """A built-in by name (from `builtins`, default `BUILTIN`), a reward server's `http(s)://` URL (`RemoteReward`;
    `builtins` may hold one configured for it), or `package.module:function` (REWARD_FUNCTIONS; verl's
    `compute_score(data_source, solution_str, ground_truth, extra_info)` and OpenRLHF's `reward_func(queries, prompts,
    labels)` are taken too, `coati.rewards.verl` and `coati.rewards.openrlhf`)."""
    builtins = BUILTIN if builtins is None else builtins
    if name in builtins:
        return builtins[name]
    if is_url(name):
        return RemoteReward(name)
    return as_trl_reward(REWARD_FUNCTIONS.get(name))


def as_trl_reward(fn: Callable) -> Callable:
    """`fn` as a reward function of TRL's arguments: verl's `compute_score` wrapped in `VerlScore`, OpenRLHF's
    `reward_func` in `OpenRLHFReward`, any other as it is."""
    if is_verl_function(fn):
        return VerlScore(fn)
    return OpenRLHFReward(fn) if is_openrlhf_function(fn) else fn


class RewardTimeoutError(RewardFunctionError):
    """A reward function's call took longer than its timeout; the message names it."""


def _call(fn: RewardFn, **kwargs: Any) -> Any:
    """`fn(**kwargs)`, run to its end on an event loop of its own when `fn` is `async def`."""
    value = fn(**kwargs)
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value
        value = asyncio.run(wait())
    return value


def call_with_timeout(name: str, fn: RewardFn, timeout_s: Optional[float], **kwargs: Any) -> Any:
    """`fn(**kwargs)` (awaited, for a coroutine function) in a daemon thread, waited for at most `timeout_s` seconds
    (None: no limit, in this thread). A call that does not return in time raises `RewardTimeoutError`; its thread
    cannot be stopped but, being a daemon, does not keep the process alive."""
    if timeout_s is None:
        return _call(fn, **kwargs)
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = _call(fn, **kwargs)
        except BaseException as error:   # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"reward-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RewardTimeoutError(f"reward function {name} did not return within --reward_timeout {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@dataclass
class RewardInputs:
    """What TRL passes each reward function beside the data's columns: `prompts` and `completions` in the data's own
    format, the completions' token ids, and the trainer's state (a `transformers.TrainerState`)."""

    prompts: List[Any]
    completions: List[Any]
    completion_ids: List[List[int]]
    trainer_state: Any = None


EXTRA_PREFIX = "log_extra/"
"""Components under this prefix are `log_extra` columns: shown in sample tables, not reduced into metrics."""
METRIC_PREFIX = "log_metric/"
"""Components under this prefix are `log_metric` values (one per row, all equal): logged under the bare name."""


@dataclass
class WeightedReward:
    """The weighted sum of named reward functions; also returns every component for logging. Each call of a
    function may take at most `timeout_s` seconds (None: no limit). Built-ins and reward servers (`builtin` parts)
    get text; your functions get TRL's arguments (`RewardInputs`)."""

    parts: List[Tuple[str, RewardFn, float]]
    timeout_s: Optional[float] = None
    builtin: List[str] = field(default_factory=list)
    specs: Dict[str, str] = field(default_factory=dict)
    """Each part's label -> the name it was given by (`package.module:function`), which error messages use."""
    _warned_unscored: bool = field(default=False, repr=False)
    takes_sequences: bool = field(init=False, repr=False)
    """Whether a part (a `RemoteReward`, an `OpenRLHFReward`) reads the full token sequences: then pass `sequences`."""
    takes_inputs: bool = field(init=False, repr=False)
    """Whether a part is a function of yours, which reads TRL's arguments: then pass `inputs`."""

    def __post_init__(self) -> None:
        self.takes_sequences = any(getattr(fn, "takes_sequences", False) for _, fn, _ in self.parts)
        self.takes_inputs = any(label not in self.builtin for label, _, _ in self.parts)

    @classmethod
    def from_specs(cls, specs: Sequence[str], timeout_s: Optional[float] = None,
                   builtins: Optional[Dict[str, RewardFn]] = None) -> "WeightedReward":
        """From `name` or `name=weight` strings; `builtins` replaces `BUILTIN` (built-ins configured by flags)."""
        parts, builtin, names = [], [], {}
        for spec in specs:
            name, weight = split_spec(spec)
            try:
                value = float(weight) if weight else 1.0
            except ValueError:
                raise CoatiUsageError(f"--reward_fn {spec}: the weight {weight!r} is not a number") from None
            if not math.isfinite(value):
                raise CoatiUsageError(f"--reward_fn {spec}: the weight must be a finite number")
            label = _label(name, [label for label, _, _ in parts])
            parts.append((label, resolve(name, builtins), value))
            names[label] = name
            if name in (BUILTIN if builtins is None else builtins) or is_url(name):
                builtin.append(label)
        return cls(parts, timeout_s, builtin, names)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], sequences: Optional[Sequences] = None,
                 inputs: Optional[RewardInputs] = None, **fields: Sequence[object]) -> Tuple[List[float], Dict[str, List[Any]]]:
        """(total reward per completion, {component name: values}); diagnostics, `log_extra` columns and `log_metric`
        values are components too, not in the total. `prompts`/`completions` are text; `inputs`, when given, is what
        your functions get instead (TRL's arguments). `sequences` goes to the parts that take it (a reward server,
        OpenRLHF's `reward_func`)."""
        total = [0.0] * len(completions)
        scored = [False] * len(completions)
        components: Dict[str, List[Any]] = {}
        for name, fn, weight in self.parts:
            extra = {"sequences": sequences} if getattr(fn, "takes_sequences", False) else {}
            if name in self.builtin or inputs is None:
                arguments = {"prompts": list(prompts), "completions": list(completions), **fields, **extra}
            else:
                arguments = {**fields, **self._trl_arguments(inputs, components, len(completions)), **extra}
            rewards, diagnostics, columns = _checked(name, fn, arguments, len(completions), self.timeout_s,
                                                     self.specs.get(name, name))
            for component, values in rewards.items():
                components[component] = values
                for i, v in enumerate(values):
                    if not math.isnan(v):
                        total[i] += weight * v
                        scored[i] = True
            components.update(diagnostics)
            components.update({f"{EXTRA_PREFIX}{column}": values for column, values in columns.items()})
        if not all(scored) and not self._warned_unscored:
            self._warned_unscored = True
            warn_user(f"every reward function returned None for {scored.count(False)} of {len(completions)} "
                      "completions; such a completion gets 0 (said once)")
        return total, components

    def check_columns(self, columns: Sequence[str], data: str) -> None:
        """Every parameter a function requires is one it is passed (TRL's arguments for yours, the text and the
        sequences for built-ins) or a column of the data (`data` names it), said before any model loads rather than
        at the first scoring."""
        for label, fn, _ in self.parts:
            builtin = label in self.builtin
            passed = BUILTIN_ARGUMENTS if builtin else TRL_ARGUMENTS
            missing = ", ".join(repr(name) for name in required_parameters(fn)
                                if name not in passed and name not in columns)
            lacking = getattr(fn, "missing_columns", lambda _: None)(columns)
            if lacking:
                raise CoatiUsageError(f"reward function {self.specs.get(label, label)} (verl's arguments) needs "
                                      f"{lacking}, which {data} has not (its columns: {', '.join(columns)})")
            if missing:
                fix = (f"give the data a column {missing}" if builtin else
                       "add the column, or give the parameter a default")
                raise CoatiUsageError(f"reward function {self.specs.get(label, label)} takes {missing}, which {data} has "
                                      f"no column for (its columns: {', '.join(columns)}); {fix}")

    @staticmethod
    def _trl_arguments(inputs: RewardInputs, components: Dict[str, List[Any]], rows: int) -> Dict[str, Any]:
        def log_extra(column: str, values: Sequence[Any]) -> None:
            components[f"{EXTRA_PREFIX}{column}"] = list(values)

        def log_metric(name: str, value: float) -> None:
            components[f"{METRIC_PREFIX}{name}"] = [float(value)] * rows

        return {"prompts": list(inputs.prompts), "completions": list(inputs.completions),
                "completion_ids": list(inputs.completion_ids), "trainer_state": inputs.trainer_state,
                "log_extra": log_extra, "log_metric": log_metric}


TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
"""What TRL passes every reward function beside the data's columns."""
BUILTIN_ARGUMENTS = ("prompts", "completions", "sequences")
"""What built-ins and reward servers are passed beside the data's columns."""


def required_parameters(fn: Callable) -> List[str]:
    """The parameters `fn` cannot be called without (none known where its signature cannot be read)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def table_columns(components: Dict[str, Sequence[Any]], row: int) -> Dict[str, Any]:
    """One sample-table row's component columns: numbers as floats, `log_extra` columns as given, by their name."""
    return {(name[len(EXTRA_PREFIX):] if name.startswith(EXTRA_PREFIX) else name):
            (values[row] if name.startswith(EXTRA_PREFIX) else float(values[row])) for name, values in components.items()}


def _label(name: str, taken: Sequence[str]) -> str:
    """The name a reward's values are logged under: a function's own name (`package.module:function` gives
    `function`, as TRL logs it; `function_2`... when two share it), or `reward_server` (`_2`, ...) for a URL."""
    base = "reward_server" if is_url(name) else re.split(r"[:.]", name)[-1]
    count = 1 + sum(label == base or label.startswith(f"{base}_") and label[len(base) + 1:].isdigit() for label in taken)
    return base if count == 1 else f"{base}_{count}"


def split_spec(spec: str) -> Tuple[str, str]:
    """(name, weight) of `name=weight`; a URL's own `=` (in its query) stays in the name."""
    if not is_url(spec):
        name, _, weight = spec.partition("=")
        return name, weight
    name, _, weight = spec.rpartition("=")
    query = name.partition("?")[2]
    if query and "=" not in query.split("&")[-1]:   # `?key=value`: the `=` is the query's
        return spec, ""
    try:
        float(weight)
    except ValueError:
        return spec, ""
    return name, weight


def _checked(name: str, fn: RewardFn, arguments: Dict[str, Any], count: int, timeout_s: Optional[float] = None,
             spec: Optional[str] = None) -> Tuple[Dict[str, List[float]], Dict[str, List[float]], Dict[str, List[Any]]]:
    """`fn(**arguments)`'s result as ({reward component: floats, NaN where it returned None}, {diagnostic: floats},
    {sample-table column: values}) labelled `name` or `name/component`: `count` finite floats each, else a
    `RewardFunctionError` that names `fn` by `spec` (the name it was given by) and the problem."""
    spec = spec or name
    named, diagnostics, columns = _result(name, fn, arguments, timeout_s, spec)
    checked: Tuple[Dict[str, List[float]], Dict[str, List[float]]] = ({}, {})
    for given, into, allow_none in ((named, checked[0], True), (diagnostics, checked[1], False)):
        for component, values in given.items():
            suffix = "" if component == name else f"/{component}"
            shown = f"{spec}{suffix}"
            try:
                if isinstance(values, (str, bytes)) or any(isinstance(v, (str, bytes)) for v in values):
                    raise TypeError("text is not a reward")
                floats = [math.nan if v is None and allow_none else float(v) for v in values]
            except (TypeError, ValueError):
                raise RewardFunctionError(f"reward function {shown} must return numbers (or None), "
                                          f"got {values!r:.80}") from None
            if len(floats) != count:
                raise RewardFunctionError(f"reward function {shown} returned {len(floats)} values for {count} "
                                          "completions")
            if not all(math.isfinite(v) for v, raw in zip(floats, values) if raw is not None):
                raise RewardFunctionError(f"reward function {shown} returned a NaN or infinite value")
            into[f"{name}{suffix}"] = floats
    return checked[0], checked[1], columns


def _result(name: str, fn: RewardFn, arguments: Dict[str, Any], timeout_s: Optional[float],
            spec: str) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, List[Any]]]:
    """`fn(**arguments)`'s values by component (its own under `name`), diagnostics and sample-table columns as it
    returned them; what it raises becomes a `RewardFunctionError` naming it by `spec`."""
    try:
        result = call_with_timeout(spec, fn, timeout_s, **arguments)
    except CoatiUsageError:   # a timeout, an unreachable reward server: their messages are already clear
        raise
    except Exception as error:
        raise RewardFunctionError(f"reward function {spec} raised {type(error).__name__}: {error}",
                                  user_frames(error)) from error
    diagnostics, columns = {}, {}
    if isinstance(result, RewardOutput):
        if not isinstance(result.diagnostics, dict):
            raise RewardFunctionError(f"reward function {spec} returned diagnostics that are not an object of number "
                                      f"lists (name -> one number per completion): {result.diagnostics!r:.80}")
        diagnostics = dict(result.diagnostics)
        columns = {f"{name}/{column}": list(values) for column, values in result.columns.items()}
        result = result.values
    return (result if isinstance(result, dict) else {name: result}), diagnostics, columns
