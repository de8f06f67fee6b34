"""Environments of multi-turn rollouts: what answers a model's turn.

An `Environment` is reset with a prompt row and then stepped with each model turn (its text, parsed only, never
re-tokenized): it returns the messages it adds (tool responses, a user's reply), a reward term for the turn and
whether the episode is over. `ToolEnvironment` runs the tool calls in the turn; a turn without calls ends it.
"""
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from .tool_calls import ParsedTurn
from .tools import Tool, ToolResult, ToolRunner

Message = Dict[str, Any]
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "timeout")
"""The kinds of tool errors counted (`rollout/tool_errors/<kind>`)."""


@dataclass
class EnvStep:
    """What the environment says after a model turn: `observation` messages to append, a `reward` term for the turn,
    whether the episode is `done`, and `counts` for the metrics (tool calls, errors by kind, tool seconds)."""

    observation: List[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    counts: Dict[str, float] = field(default_factory=dict)


class Environment(ABC):
    """One episode's counterpart: `reset(row)` with the prompt row, then `step(turn)` per model turn."""

    def reset(self, row: Dict[str, Any]) -> None:
        """Start an episode on `row` (the prompt-dataset row: its ground truth, its own tools)."""

    def tools(self) -> Optional[List[Dict[str, Any]]]:
        """The schemas of the tools this episode offers, for the prompt (None: no tools)."""
        return None

    @abstractmethod
    def step(self, turn: str) -> EnvStep:
        """The environment's answer to the model's turn `turn` (its text)."""


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
