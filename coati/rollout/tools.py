"""Tools an agent calls during a rollout: plain Python functions whose JSON schema (OpenAI function format, as chat
templates render it with `apply_chat_template(tools=...)`) is read from their signature and docstring.

Built in: `calculator`, exact arithmetic on integers and fractions, parsed (never `eval`ed); `python`, a program run
in coati's sandbox with its limits. Users pass their own as `package.module:function` (`--tools`). A tool returns
the text the model reads; a tool that raises, or takes longer than its timeout, gives the model an error message
instead (`ToolRunner`), never a crash of the run. `ToolEnvironment` is the episode's environment that runs the
tool calls of each model turn.
"""
import ast
import json
import operator
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Dict, List, Optional, Sequence

from coati.utils.errors import CoatiUsageError
from coati.utils.registry import TOOLS

from .environment import ERROR_KINDS, EnvStep, Environment
from .tool_calls import ParsedTurn

MAX_DIGITS = 4000
"""The calculator refuses results (and powers) longer than this many digits: an agent cannot stall the run with 9**9**9."""
MAX_OUTPUT_CHARS = 2000
"""Tool output beyond this is cut (with a note), so one call cannot flood the context."""


@dataclass(frozen=True)
class Tool:
    """A callable tool: `fn(**arguments) -> str` and its OpenAI function `schema`."""

    name: str
    fn: Callable[..., Any]
    schema: Dict[str, Any]


def tool_from_function(fn: Callable[..., Any], name: Optional[str] = None) -> Tool:
    """`fn` as a tool; its schema from the type hints and the Google-style docstring (`Args:` names each argument),
    as `transformers` reads them. A function without them is refused in one line."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as error:   # transformers' DocstringParsingException / TypeHintParsingException
        raise CoatiUsageError(f"tool {getattr(fn, '__name__', fn)!r}: {error}") from None
    if name:
        schema["function"]["name"] = name
    return Tool(schema["function"]["name"], fn, schema)


def resolve_tools(specs: Sequence[str]) -> List[Tool]:
    """`--tools`: built-in names or `package.module:function`s, each a tool (names must differ)."""
    tools = [tool_from_function(TOOLS.get(spec), spec if spec in TOOLS.names() else None) for spec in specs]
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise CoatiUsageError(f"--tools: two tools share a name ({', '.join(names)})")
    return tools


# ---- calculator -------------------------------------------------------------------------------------
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported expression {ast.unparse(node)!r}: use numbers, + - * / // % ** and parentheses")


def _check_power(base: Fraction, exponent: Fraction) -> None:
    if exponent.denominator != 1:
        raise ValueError("powers take whole exponents only")
    digits = abs(int(exponent)) * max(len(str(abs(base.numerator))), len(str(base.denominator)))
    if digits > MAX_DIGITS:
        raise ValueError(f"the result would have more than {MAX_DIGITS} digits")


def _text(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    exact = str(value)
    decimal = f"{float(value):.12g}"
    return f"{exact} (= {decimal})"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (whole numbers of any size, and fractions).

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "1234 * 5678"
    """
    try:
        value = _value(ast.parse(expression.strip(), mode="eval").body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    text = _text(value)
    if len(text) > MAX_DIGITS:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    return text


# ---- python -----------------------------------------------------------------------------------------
_SANDBOX: Dict[str, Any] = {}


def configure_python_tool(limits: Any, backend: str) -> None:
    """The sandbox (limits, backend) the `python` tool runs programs in (`--sandbox*` flags); checked now."""
    from coati.rewards.sandbox import Sandbox

    _SANDBOX["sandbox"] = Sandbox(limits, 1, backend)


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it prints.

    Args:
        code: a complete Python program; print the values you need
    """
    from coati.rewards.sandbox import OK, Sandbox

    sandbox = _SANDBOX.setdefault("sandbox", Sandbox())
    result = sandbox.run(code)
    text = result.stdout
    if result.status != OK:
        reason = f"stopped by the {result.limit} limit" if result.limit else f"exit status {result.returncode}"
        text += f"\n[{reason}]\n{result.stderr[-500:]}"
    return text.strip() or "(no output)"


# ---- running calls ----------------------------------------------------------------------------------
class ToolRunner:
    """Runs each tool call on a thread of its own with a per-call timeout: the result text, or an error message naming
    the kind (`unknown_tool`, `bad_arguments`, `tool_error`, `timeout`) for the model and the metrics. A call that never
    returns keeps only its own (daemon) thread; later calls are not held up by it."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float = 10.0) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.timeout_s = timeout_s

    def run(self, name: str, arguments: Any) -> "ToolResult":
        tool = self.tools.get(name)
        if tool is None:
            return ToolResult(f"error: unknown tool {name!r}; tools: {', '.join(self.tools)}", "unknown_tool")
        if not isinstance(arguments, dict):
            return ToolResult(f"error: {name}: arguments must be a JSON object", "bad_arguments")
        expected = set(tool.schema["function"]["parameters"].get("properties", {}))
        if not set(arguments) <= expected:
            wrong = sorted(set(arguments) - expected)
            return ToolResult(f"error: {name}: unexpected argument {wrong[0]!r}; takes {', '.join(sorted(expected))}",
                              "bad_arguments")
        return self._call(tool, arguments)

    def _call(self, tool: Tool, arguments: Dict[str, Any]) -> "ToolResult":
        future: "Future[Any]" = Future()
        threading.Thread(target=_run_into, args=(future, tool.fn, arguments), name=f"tool-{tool.name}",
                         daemon=True).start()
        try:
            text = str(future.result(timeout=self.timeout_s))
        except FutureTimeout:
            return ToolResult(f"error: {tool.name} took longer than {self.timeout_s:g} s", "timeout")
        except TypeError as error:
            return ToolResult(f"error: {tool.name}: {error}", "bad_arguments")
        except Exception as error:
            return ToolResult(f"error: {tool.name}: {error}", "tool_error")
        if len(text) > MAX_OUTPUT_CHARS:
            text = text[:MAX_OUTPUT_CHARS] + f"\n[output cut at {MAX_OUTPUT_CHARS} characters]"
        return ToolResult(text, None)


def _run_into(future: "Future[Any]", fn: Callable[..., Any], arguments: Dict[str, Any]) -> None:
    """`fn(**arguments)`'s result or exception, into `future`."""
    try:
        future.set_result(fn(**arguments))
    except BaseException as error:   # the caller reports it to the model
        future.set_exception(error)


@dataclass(frozen=True)
class ToolResult:
    """What the model reads back, and the kind of error (None when the call worked)."""

    text: str
    error: Optional[str]


class ToolEnvironment(Environment):
    """Runs the tool calls `parser` finds in each model turn through `runner` and answers with one `tool` message per
    call, in order. A malformed call, an unknown tool, bad arguments, a tool that raises or times out each become that
    call's message (an error the model can read) and are counted; `malformed_penalty` is subtracted per malformed call.
    A turn with no call at all ends the episode. A row's `tools` (OpenAI function schemas, or their JSON) limits the
    tools offered to those it names."""

    def __init__(self, runner: ToolRunner, parser: Callable[[str], ParsedTurn], malformed_penalty: float = 0.0) -> None:
        self.runner, self.parser, self.malformed_penalty = runner, parser, malformed_penalty
        self.offered: Dict[str, Tool] = dict(runner.tools)

    def reset(self, row: Dict[str, Any]) -> None:
        self.offered = {tool.name: tool for tool in row_tools(row, list(self.runner.tools.values()))}

    def tools(self) -> Optional[List[Dict[str, Any]]]:
        return tool_schemas(list(self.offered.values()))

    def step(self, turn: str) -> EnvStep:
        parsed = self.parser(turn)
        if not parsed.calls and not parsed.errors:
            return EnvStep(done=True)
        counts = {"tool_calls": float(len(parsed.calls) + len(parsed.errors)), "tool_seconds": 0.0,
                  **{f"tool_errors/{kind}": 0.0 for kind in ERROR_KINDS}}
        messages = []
        for call in parsed.calls:
            start = time.perf_counter()
            result = (self.runner.run(call.name, call.arguments) if call.name in self.offered else
                      ToolResult(f"error: unknown tool {call.name!r}; tools: {', '.join(self.offered)}", "unknown_tool"))
            counts["tool_seconds"] += time.perf_counter() - start
            if result.error:
                counts[f"tool_errors/{result.error}"] += 1
            messages.append({"role": "tool", "name": call.name, "content": result.text})
        for error in parsed.errors:
            counts["tool_errors/malformed"] += 1
            messages.append({"role": "tool", "name": "error", "content": f"error: {error}"})
        return EnvStep(messages, -self.malformed_penalty * len(parsed.errors), False, counts)


def row_tools(row: Dict[str, Any], tools: Sequence[Tool]) -> List[Tool]:
    """The tools a prompt row offers: those its `tools` column names (OpenAI function schemas, as TRL and verl read
    them, or their JSON text), else all of `tools`. A name no tool implements raises `ValueError`."""
    given = row.get("tools")
    if not given:
        return list(tools)
    try:
        schemas = json.loads(given) if isinstance(given, str) else given
        names = [schema.get("function", schema)["name"] for schema in schemas]
    except (json.JSONDecodeError, TypeError, AttributeError, KeyError):
        raise ValueError("its tools column is not a list of OpenAI function schemas ({\"type\": \"function\", "
                         "\"function\": {\"name\": ...}})") from None
    known = {tool.name: tool for tool in tools}
    missing = [name for name in names if name not in known]
    if missing:
        raise ValueError(f"the row's tools name {missing[0]!r}, which --tools does not implement "
                         f"({', '.join(known)})")
    return [known[name] for name in names]


def tool_schemas(tools: Sequence[Tool]) -> Optional[List[Dict[str, Any]]]:
    """The tools' schemas as `apply_chat_template(tools=...)` takes them (None for no tools)."""
    return [tool.schema for tool in tools] or None
