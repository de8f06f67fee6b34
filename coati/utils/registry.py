"""Named parts (advantage estimators, policy losses, objectives, loss aggregations, KL estimators, reward shapers,
reward functions, tools, tool-call parsers): a function registered under a name with a decorator, so a new algorithm is one function, and the flags' choices
are the registry's names (help text and code cannot disagree).

The registries are declared here, with the names of their built-ins and the module that registers those: the
command line lists and checks the names without importing that module (and torch with it), so `--help` and flag
errors answer at once; the first `get` imports it."""
import argparse
import ast
import importlib
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

from coati.utils.errors import CoatiUsageError

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one kind by name. `@registry.register("name")` adds one; `registry.get(name)` finds it, or
    imports `package.module:function` (whose module may register it on import), or refuses the name listing
    the choices."""

    def __init__(self, kind: str, home: Optional[str] = None, builtins: Sequence[str] = ()) -> None:
        self.kind, self.home, self.builtins = kind, home, tuple(builtins)
        self._entries: Dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            if name in self._entries and self._entries[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is registered already")
            self._entries[name] = fn
            return fn

        return add

    def names(self) -> List[str]:
        """The built-ins' names, then those registered since; nothing is imported."""
        return list(self.builtins) + [name for name in self._entries if name not in self.builtins]

    def choice(self) -> Callable[[str], str]:
        """An argparse `type`: a registered name, or a `package.module:function` that imports (checked now)."""
        def check(name: str) -> str:
            if name in self.names():
                return name
            if not is_import_path(name):   # answered without importing the built-ins' module (and torch)
                raise argparse.ArgumentTypeError(self._unknown(name))
            try:
                self.get(name)
            except CoatiUsageError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
            return name

        check.__name__ = self.kind
        return check

    def _load_builtins(self) -> None:
        if self.home is None:
            return
        importlib.import_module(self.home)
        missing = [name for name in self.builtins if name not in self._entries]
        if missing:
            raise RuntimeError(f"{self.home} does not register the {self.kind} built-ins {missing} declared for it")

    def get(self, name: str) -> F:
        if name not in self._entries:
            self._load_builtins()
        if name in self._entries:
            return self._entries[name]
        if is_import_path(name):
            return import_function(name, self.kind)
        raise CoatiUsageError(self._unknown(name))

    def _unknown(self, name: str) -> str:
        names = f"one of {', '.join(self.names())} or " if self.names() else ""
        return f"unknown {self.kind} {name!r}; expected {names}package.module:function (or path/to/file.py:function)"


def is_import_path(name: str) -> bool:
    """Whether `name` names a function to import: `package.module:function`, `path/to/file.py:function`, or TRL's
    `module.function`."""
    return ":" in name or ("." in name.strip(".") and "/" not in name)


def import_function(name: str, kind: str = "function") -> Callable:
    """The function `name` names (`is_import_path`), with the working directory importable (as TRL's scripts make it,
    whatever directory the launcher started the script from); one line where it cannot be imported."""
    import os
    import sys

    if ":" in name:
        module_name, attr = name.rsplit(":", 1)
    else:
        module_name, attr = name.rsplit(".", 1)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = _load_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError, OSError) as error:
        raise CoatiUsageError(f"{kind} {name!r} cannot be imported: {error} (the working directory {os.getcwd()} is "
                              "searched too)") from None
    if not callable(fn):
        raise CoatiUsageError(f"{kind} {name!r} is not callable")
    return fn


def _load_file(path: str) -> Any:
    """The module in the Python file `path`, loaded once (kept in `sys.modules` under its path)."""
    import importlib.util
    import os
    import sys

    path = os.path.abspath(path)
    if path in sys.modules:
        return sys.modules[path]
    if not os.path.isfile(path):
        raise ImportError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path] = module
    spec.loader.exec_module(module)
    return module


def option(text: str) -> Tuple[str, Any]:
    """An argparse `type` for a registered function's hyperparameter, NAME=VALUE: VALUE read as a Python literal (a
    number, True/False, a quoted string, a list), else kept as text."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE, e.g. tau=0.5")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", "coati.experience.advantages",
                                          ("grpo", "rloo", "reinforce_pp", "maxent", "process"))
"""`fn(rewards (N,), config: AdvantageConfig) -> advantages (N,)`, or (N, T) per token for an estimator that reads a
process reward model's step scores (`config.step_rewards`); `rewards` holds consecutive groups of
`config.group_size` completions of one prompt, `config.options` the estimator's hyperparameters (`--adv_option`).
A new estimator is one decorated function."""
AGGREGATIONS: Registry = Registry("loss aggregation", "coati.models.loss",
                                  ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
"""`fn(token_losses (batch, T), mask (float), norm_length) -> loss`, by the name `--loss_agg` takes."""
KL_ESTIMATORS: Registry = Registry("KL estimator", "coati.models.loss", ("k1", "k2", "k3"))
"""`fn(log_ratio) -> per-token estimate of KL(pi || ref)`, log_ratio = log pi - log ref of the sampled
tokens (Schulman 2020), by the name `--kl_estimator` takes."""
BEHAVIOUR_CORRECTIONS: Registry = Registry("behaviour correction", "coati.models.loss",
                                           ("truncated", "masked", "icepop", "sequence", "sequence_masked"))
"""`fn(log_ratio (batch, T), mask (float), config: BehaviourConfig) -> weights (batch, T)`, log_ratio = log pi_old -
log pi_behaviour of the sampled tokens: how each token's loss is weighted where the samples came from other
weights or another engine, by the name `--behaviour_correction` takes."""
POLICY_LOSSES: Registry = Registry("policy loss", "coati.models.loss", ("ppo", "gspo", "cispo", "sapo"))
"""`fn(logps, old_logps, advantages, mask, config: PolicyLossConfig) -> PolicyTerms` (per-token losses, ratio, where
a clip acted), which `PolicyLoss` weights for off-policy samples and aggregates: the policy losses by the name
`--policy_loss` takes; `config.options` holds `--policy_loss_option`."""
DISTILL_LOSSES: Registry = Registry("distillation loss", "coati.models.loss", ("forward_kl_topk", "gkd"))
"""`fn(student_logps (batch, T, k), teacher_logps (batch, T, k), beta) -> per-token losses (batch, T)`: how far the
student's distribution is from the teacher's on the teacher's top-k tokens at each completion position (on-policy
distillation), by the name `--distill_loss` takes."""
OBJECTIVES: Registry = Registry("objective", "coati.trainer.components", ("policy_gradient",))
"""`factory(config: ObjectiveConfig) -> objective`, `objective(actor, experience) -> ObjectiveOutput`: the actor's loss
on one micro-batch of on-policy experience, by the name `--objective` takes (`policy_gradient`: PPO/GRPO's)."""
REWARD_FUNCTIONS: Registry = Registry("reward function", "coati.rewards.registry",
                                      ("math_answer", "answer_format", "code_tests"))
"""TRL's reward-function contract (`coati.rewards.registry`), by the name `--reward_fn` takes; a reward server is
named by its URL instead."""
TOOLS: Registry = Registry("tool", "coati.rollout.tools", ("calculator", "python"))
"""Plain Python functions an agent may call (`--tools`): typed arguments and a Google-style docstring, from which the
tool's JSON schema is read (`transformers.utils.get_json_schema`); the function returns the text the model reads."""
AGENTS: Registry = Registry("agent")
"""Agent programs run as rollouts against the OpenAI-compatible endpoint (`--agent package.module:function`)."""
TOOL_CALL_PARSERS: Registry = Registry("tool-call parser", "coati.rollout.tool_calls", ("hermes",))
"""`fn(text) -> ParsedTurn`: the tool calls (and malformed ones) in one model turn, by the name `--tool_parser` takes."""
REWARD_SHAPERS: Registry = Registry("reward shaper", "coati.experience.shaping", ("overlong",))
"""`fn(lengths (N,) completion tokens, config) -> (N,)` the term added to each completion's reward."""
