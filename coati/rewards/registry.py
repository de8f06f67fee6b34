"""Reward functions by name, and a weighted sum of them.

Contract: `fn(prompts, completions, **sample_fields)` returns a list of floats (one per completion), a
dict of named lists (each a component, logged on its own), or a `RewardOutput` (the reward, and diagnostics
that are logged but not added). `sample_fields` are the prompt data's other columns, e.g. `gt_answer`.
Built-ins: `math_answer`, `answer_format`, `code_tests`; a reward server by its `http(s)://` URL; your own as
`package.module:function`; each with an optional weight: `--reward_fn math_answer answer_format=0.1`.
"""
import importlib
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from coati.utils.errors import CoatiUsageError

from .code import code_tests
from .math import answer_format, math_answer
from .output import RewardOutput
from .remote import RemoteReward, Sequences, is_url

RewardFn = Callable[..., object]
BUILTIN: Dict[str, RewardFn] = {"math_answer": math_answer, "answer_format": answer_format, "code_tests": code_tests}


class RewardFunctionError(CoatiUsageError):
    """A reward function raised or returned something unusable; the message names it."""


def resolve(name: str, builtins: Optional[Dict[str, RewardFn]] = None) -> RewardFn:
    """A built-in by name (from `builtins`, default `BUILTIN`), a reward server's `http(s)://` URL (`RemoteReward`;
    `builtins` may hold one configured for it), or `package.module:function`."""
    builtins = BUILTIN if builtins is None else builtins
    if name in builtins:
        return builtins[name]
    if is_url(name):
        return RemoteReward(name)
    if ":" not in name:
        raise CoatiUsageError(f"unknown reward function {name!r}: use one of {', '.join(builtins)} or package.module:function")
    module_name, attr = name.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise CoatiUsageError(f"reward function {name!r} cannot be imported: {error}") from None
    if not callable(fn):
        raise CoatiUsageError(f"reward function {name!r} is not callable")
    return fn


class RewardTimeoutError(RewardFunctionError):
    """A reward function's call took longer than its timeout; the message names it."""


def call_with_timeout(name: str, fn: RewardFn, timeout_s: Optional[float], **kwargs: Any) -> Any:
    """`fn(**kwargs)` in a daemon thread, waited for at most `timeout_s` seconds (None: no limit). A call that
    does not return in time raises `RewardTimeoutError`; its thread cannot be stopped but, being a daemon,
    does not keep the process alive."""
    if timeout_s is None:
        return fn(**kwargs)
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn(**kwargs)
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
class WeightedReward:
    """The weighted sum of named reward functions; also returns every component for logging. Each call of a
    function may take at most `timeout_s` seconds (None: no limit)."""

    parts: List[Tuple[str, RewardFn, float]]
    timeout_s: Optional[float] = None

    @classmethod
    def from_specs(cls, specs: Sequence[str], timeout_s: Optional[float] = None,
                   builtins: Optional[Dict[str, RewardFn]] = None) -> "WeightedReward":
        """From `name` or `name=weight` strings; `builtins` replaces `BUILTIN` (built-ins configured by flags)."""
        parts = []
        for spec in specs:
            name, weight = split_spec(spec)
            try:
                value = float(weight) if weight else 1.0
            except ValueError:
                raise CoatiUsageError(f"--reward_fn {spec}: the weight {weight!r} is not a number") from None
            if not math.isfinite(value):
                raise CoatiUsageError(f"--reward_fn {spec}: the weight must be a finite number")
            parts.append((_label(name, [label for label, _, _ in parts]), resolve(name, builtins), value))
        return cls(parts, timeout_s)

    @property
    def takes_sequences(self) -> bool:
        """Whether a part (a `RemoteReward`) reads the full token sequences: then pass `sequences`."""
        return any(getattr(fn, "takes_sequences", False) for _, fn, _ in self.parts)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], sequences: Optional[Sequences] = None,
                 **fields: Sequence[object]) -> Tuple[List[float], Dict[str, List[float]]]:
        """(total reward per completion, {component name: values}); diagnostics are components too, not in the total.
        `sequences` goes to the parts that take it."""
        total = [0.0] * len(completions)
        components: Dict[str, List[float]] = {}
        for name, fn, weight in self.parts:
            extra = {"sequences": sequences} if getattr(fn, "takes_sequences", False) else {}
            rewards, diagnostics = _checked(name, fn, prompts, completions, {**fields, **extra}, self.timeout_s)
            for component, values in rewards.items():
                components[component] = values
                total = [t + weight * v for t, v in zip(total, values)]
            components.update(diagnostics)
        return total, components


def _label(name: str, taken: Sequence[str]) -> str:
    """The name a reward's values are logged under: its own, or `reward_server` (`_2`, ...) for a URL."""
    if not is_url(name):
        return name
    count = 1 + sum(label.startswith("reward_server") for label in taken)
    return "reward_server" if count == 1 else f"reward_server_{count}"


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


def _checked(name: str, fn: RewardFn, prompts: Sequence[str], completions: Sequence[str],
             fields: Dict[str, Sequence[object]], timeout_s: Optional[float] = None
             ) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
    """`fn`'s result as ({reward component: floats}, {diagnostic: floats}), or a `RewardFunctionError` that names
    `fn` and the problem."""
    try:
        result = call_with_timeout(name, fn, timeout_s, prompts=list(prompts), completions=list(completions), **fields)
    except CoatiUsageError:   # a timeout, an unreachable reward server: their messages are already clear
        raise
    except Exception as error:
        raise RewardFunctionError(f"reward function {name} raised {type(error).__name__}: {error}") from error
    diagnostics = {}
    if isinstance(result, RewardOutput):
        diagnostics = dict(result.diagnostics)
        result = result.values
    named = result if isinstance(result, dict) else {name: result}
    return _floats(named, name, len(completions)), _floats(diagnostics, name, len(completions))


def _floats(named: Dict[str, Any], name: str, count: int) -> Dict[str, List[float]]:
    """Each named sequence as `count` finite floats, labelled `name` or `name/component`."""
    checked = {}
    for component, values in named.items():
        label = name if component == name else f"{name}/{component}"
        try:
            floats = [float(v) for v in values]
        except (TypeError, ValueError):
            raise RewardFunctionError(f"reward function {label} must return numbers, got {values!r:.80}") from None
        if len(floats) != count:
            raise RewardFunctionError(f"reward function {label} returned {len(floats)} values for {count} completions")
        if not all(math.isfinite(v) for v in floats):
            raise RewardFunctionError(f"reward function {label} returned a NaN or infinite value")
        checked[label] = floats
    return checked
