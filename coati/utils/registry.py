"""Named parts (advantage estimators, policy losses, objectives, loss aggregations, KL estimators, reward shapers,
reward functions, tools, tool-call parsers): a function registered under a name, so a new algorithm is one function,
and the flags' choices, their `--help` and the check of a part's options all come from the registry.

A registry declares its built-ins here, once: each one's function (`module:function`), what it does and the options
it takes. The command line lists, describes and checks them without importing their modules (and torch with them), so
`--help` and flag errors answer at once; the first `get` of a built-in imports it. `@registry.register(name, help=...,
options=...)` adds one of your own."""
import argparse
import ast
import importlib
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Sequence, Tuple, TypeVar

from coati.utils.errors import CoatiUsageError

F = TypeVar("F", bound=Callable)
OWN = "package.module:function"
"""How a part of your own is named on the command line (or `path/to/file.py:function`)."""


@dataclass(frozen=True)
class Entry:
    """One named part: its function (`target`, `module:function`, imported on first use, for a built-in), what it
    does, and the names of the options it takes (None: not declared, not checked)."""

    target: Any
    help: str = ""
    options: Optional[Tuple[str, ...]] = ()


class Registry(Generic[F]):
    """Functions of one kind by name. `@registry.register("name")` adds one; `registry.get(name)` finds it, or
    imports `package.module:function` (whose module may register it on import), or refuses the name listing
    the choices."""

    def __init__(self, kind: str, builtins: Optional[Mapping[str, Entry]] = None, own: str = OWN) -> None:
        self.kind, self.own = kind, own
        self._entries: Dict[str, Entry] = dict(builtins or {})
        self._loaded: Dict[str, F] = {}

    def register(self, name: str, help: str = "", options: Optional[Sequence[str]] = None) -> Callable[[F], F]:
        """A decorator adding `fn` as `name`, described by `help`, taking `options` (None: any, unchecked)."""
        def add(fn: F) -> F:
            known = self._entries.get(name)
            if known is not None and known.target is not fn:
                raise ValueError(f"{self.kind} {name!r} is registered already")
            self._entries[name] = Entry(fn, help, None if options is None else tuple(options))
            return fn

        return add

    def names(self) -> List[str]:
        """The built-ins' names, then those registered since; nothing is imported."""
        return list(self._entries)

    def describe(self, what: str) -> Callable[[], str]:
        """A flag's `--help`, built when the parser is (so a part registered before then is listed): the names, then
        `what` the flag picks, then what each part does."""
        def text() -> str:
            parts = "; ".join(f"{name}: {entry.help}" for name, entry in self._entries.items() if entry.help)
            return f"{' | '.join(self.names())} | {self.own}: {what}" + (f". {parts}" if parts else "")

        return text

    def choice(self) -> Callable[[str], str]:
        """An argparse `type`: a registered name, or a `package.module:function` that imports (checked now)."""
        def check(name: str) -> str:
            if name in self._entries:
                return name
            if not is_import_path(name):   # answered without importing the built-ins' modules (and torch)
                raise argparse.ArgumentTypeError(self._unknown(name))
            try:
                self.get(name)
            except CoatiUsageError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
            return name

        check.__name__ = self.kind
        return check

    def get(self, name: str) -> F:
        entry = self._entries.get(name)
        if entry is None:
            if is_import_path(name):
                return import_function(name, self.kind)
            raise CoatiUsageError(self._unknown(name))
        if not isinstance(entry.target, str):
            return entry.target
        if name not in self._loaded:
            self._loaded[name] = import_function(entry.target, self.kind)
        return self._loaded[name]

    def options_of(self, name: str) -> Optional[Tuple[str, ...]]:
        """The options `name` takes: declared with it, or, for a function imported by path, its `options` attribute;
        None where nothing says (then they are not checked)."""
        entry = self._entries.get(name)
        if entry is not None:
            return entry.options
        options = getattr(self.get(name), "options", None)
        return None if options is None else tuple(options)

    def check_options(self, name: str, given: Mapping[str, Any], flag: str) -> None:
        """Refuse, in one line naming `flag`, an option `name` does not take."""
        known = self.options_of(name)
        unknown = [option for option in given if known is not None and option not in known]
        if unknown:
            raise CoatiUsageError(f"{flag}: {self.kind} {name!r} takes no option {unknown[0]!r}; its options: "
                                  f"{', '.join(known) or 'none'}")

    def _unknown(self, name: str) -> str:
        names = f"one of {', '.join(self.names())} or " if self.names() else ""
        return f"unknown {self.kind} {name!r}; expected {names}{self.own} (or path/to/file.py:function)"


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
    except SyntaxError as error:
        raise CoatiUsageError(f"{kind} {name!r} cannot be imported: {error.filename}:{error.lineno}: {error.msg}") from None
    except Exception as error:   # the module's own code raised while it was imported: name its line that did
        frames = traceback.extract_tb(error.__traceback__)
        machinery = (__file__, os.path.dirname(importlib.__file__), "<frozen")
        frame = next((f for f in frames if not f.filename.startswith(machinery)), frames[-1])
        raise CoatiUsageError(f"{kind} {name!r} cannot be imported: {frame.filename}:{frame.lineno} raised "
                              f"{type(error).__name__}: {error}") from None
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
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path]   # not kept half-imported
        raise
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


ADV = "coati.experience.advantages"
LOSS = "coati.models.loss"
LOGPROBS = "coati.models.logprobs"
ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", {
    "grpo": Entry(f"{ADV}:group_advantages", "group mean/std"),
    "rloo": Entry(f"{ADV}:leave_one_out_advantages", "leave-one-out group baseline"),
    "reinforce_pp": Entry(f"{ADV}:global_normalised_advantages", "REINFORCE++, global batch mean/std "
                                                                  "(--no_std_normalize drops the std where one is used)"),
    "reinforce_pp_baseline": Entry(f"{ADV}:baseline_normalised_advantages", "REINFORCE++-baseline, the group mean "
                                                                             "off, then the global batch std"),
    "maxent": Entry(f"{ADV}:maxent_advantages", "n * softmax(rewards / tau) - 1 within the group", ("tau",)),
    "process": Entry(f"{ADV}:process_advantages", "a process reward model's step scores (--prm_pretrain; --adv_option "
                                                  "aggregation=min|sum) beside grpo's", ("aggregation",)),
})
"""`fn(rewards (N,), config: AdvantageConfig) -> advantages (N,)`, or (N, T) per token for an estimator that reads a
process reward model's step scores (`config.step_rewards`); `rewards` holds consecutive groups of
`config.group_size` completions of one prompt, `config.options` the estimator's hyperparameters (`--adv_option`).
A new estimator is one decorated function."""
AGGREGATIONS: Registry = Registry("loss aggregation", {
    "token-mean": Entry(f"{LOSS}:token_mean", "DAPO's, over every token of the batch"),
    "seq-mean-token-mean": Entry(f"{LOSS}:seq_mean_token_mean", "GRPO's, each sequence's token mean, then their mean"),
    "seq-mean-token-sum-norm": Entry(f"{LOSS}:seq_mean_token_sum_norm", "Dr. GRPO's, token sums over a fixed length"),
})
"""`fn(token_losses (batch, T), mask (float), norm_length) -> loss`, by the name `--loss_agg` takes."""
KL_ESTIMATORS: Registry = Registry("KL estimator", {
    "k1": Entry(f"{LOGPROBS}:kl_k1", "log ratio"), "k2": Entry(f"{LOGPROBS}:kl_k2", "half the squared log ratio"),
    "k3": Entry(f"{LOGPROBS}:kl_k3", "ratio - 1 - log ratio, unbiased and non-negative")})
"""`fn(log_ratio) -> per-token estimate of KL(pi || ref)`, log_ratio = log pi - log ref of the sampled
tokens (Schulman 2020), by the name `--kl_estimator` takes."""
BEHAVIOUR_CORRECTIONS: Registry = Registry("behaviour correction", {
    "truncated": Entry(f"{LOSS}:truncated_is", "min(r, --behaviour_cap)"),
    "masked": Entry(f"{LOSS}:masked_is", "r, or 0 above high (2)", ("high",)),
    "icepop": Entry(f"{LOSS}:icepop", "r inside [low, high] ([0.5, 5]), else 0", ("low", "high")),
    "sequence": Entry(f"{LOSS}:sequence_is", "min(prod r, --behaviour_cap) on every token of a sample"),
    "sequence_masked": Entry(f"{LOSS}:sequence_masked_is", "prod r, or 0 for the whole sample outside [low, high] "
                                                           "([0.5, 2])", ("low", "high")),
})
"""`fn(log_ratio (batch, T), mask (float), config: BehaviourConfig) -> weights (batch, T)`, log_ratio = log pi_old -
log pi_behaviour of the sampled tokens: how each token's loss is weighted where the samples came from other
weights or another engine, by the name `--behaviour_correction` takes."""
POLICY_LOSSES: Registry = Registry("policy loss", {
    "ppo": Entry(f"{LOSS}:ppo_clip", "token-level clipped ratio (option dual_clip=C bounds a negative advantage's "
                                     "loss at C |A|)", ("dual_clip",)),
    "gspo": Entry(f"{LOSS}:gspo_clip", "sequence-level ratio (GSPO; use --clip_eps_low/high ~3e-4/4e-4 and --loss_agg "
                                       "seq-mean-token-mean)"),
    "cispo": Entry(f"{LOSS}:cispo", "truncated, stop-gradient importance weight on every token (cap 1 + "
                                    "--clip_eps_high; ScaleRL uses 4; option floor=F raises weights below F)",
                   ("floor",)),
    "sapo": Entry(f"{LOSS}:sapo", "soft sigmoid gate instead of the clip", ("temperature_pos", "temperature_neg")),
    "gmpo": Entry(f"{LOSS}:gmpo", "geometric mean of the token ratios, each clipped in log space (GMPO; use "
                                  "--clip_eps_low/high ~0.4 and --loss_agg seq-mean-token-mean)"),
})
"""`fn(logps, old_logps, advantages, mask, config: PolicyLossConfig) -> PolicyTerms` (per-token losses, ratio, where
a clip acted), which `PolicyLoss` weights for off-policy samples and aggregates: the policy losses by the name
`--policy_loss` takes; `config.options` holds `--policy_loss_option`."""
DISTILL_LOSSES: Registry = Registry("distillation loss", {
    "forward_kl_topk": Entry(f"{LOSS}:forward_kl_topk", "KL(teacher || student) on the teacher's top-k tokens"),
    "gkd": Entry(f"{LOSS}:generalized_jsd", "GKD's generalised JSD, --gkd_beta between forward and reverse KL"),
})
"""`fn(student_logps (batch, T, k), teacher_logps (batch, T, k), beta) -> per-token losses (batch, T)`: how far the
student's distribution is from the teacher's on the teacher's top-k tokens at each completion position (on-policy
distillation), by the name `--distill_loss` takes."""
OBJECTIVES: Registry = Registry("objective", {
    "policy_gradient": Entry("coati.trainer.components:PolicyGradient",
                             "--policy_loss with the entropy bonus and the KL/ptx terms"),
}, own="package.module:factory")
"""`factory(config: ObjectiveConfig) -> objective`, `objective(actor, experience) -> ObjectiveOutput`: the actor's loss
on one micro-batch of on-policy experience, by the name `--objective` takes (`policy_gradient`: PPO/GRPO's)."""
REWARD_FUNCTIONS: Registry = Registry("reward function", {
    "math_answer": Entry("coati.rewards.math:math_answer", "1 where the final answer equals gt_answer"),
    "answer_format": Entry("coati.rewards.math:answer_format", "1 where the completion states a final answer"),
    "code_tests": Entry("coati.rewards.code:code_tests", "the share of the row's tests the code passes, in a sandbox"),
})
"""TRL's reward-function contract (`coati.rewards.registry`), by the name `--reward_fn` takes; a reward server is
named by its URL instead."""
TOOLS: Registry = Registry("tool", {
    "calculator": Entry("coati.rollout.tools:calculator", "arithmetic on numbers"),
    "python": Entry("coati.rollout.tools:python", "runs a Python snippet in the sandbox, answers its output"),
})
"""Plain Python functions an agent may call (`--tools`): typed arguments and a Google-style docstring, from which the
tool's JSON schema is read (`transformers.utils.get_json_schema`); the function returns the text the model reads."""
AGENTS: Registry = Registry("agent")
"""Agent programs run as rollouts against the OpenAI-compatible endpoint (`--agent package.module:function`)."""
TOOL_CALL_PARSERS: Registry = Registry("tool-call parser", {
    "hermes": Entry("coati.rollout.tool_calls:hermes", "<tool_call>{json}</tool_call>")})
"""`fn(text) -> ParsedTurn`: the tool calls (and malformed ones) in one model turn, by the name `--tool_parser` takes."""
REWARD_SHAPERS: Registry = Registry("reward shaper", {
    "overlong": Entry("coati.experience.shaping:overlong_penalty",
                      "DAPO's soft penalty over the last --overlong_buffer_len tokens before --max_new_tokens, from 0 "
                      "down to -1")})
"""`fn(lengths (N,) completion tokens, config) -> (N,)` the term added to each completion's reward."""
