"""Tool calls in a model's turn, by format (`TOOL_CALL_PARSERS`, chosen with `--tool_parser`).

Built in: `hermes`, the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of Hermes, Qwen 2.5/3 and
most ChatML-style tool templates. A parser returns the well-formed calls and a message for each malformed one; the
environment tells the model about the latter instead of failing the run.
"""
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional



@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Dict[str, Any]


@dataclass
class ParsedTurn:
    """The calls of one model turn, in order, an error message for each block that is not a valid call, and the turn's
    `prose`, its text outside the calls, where the parser tells them apart (None: it does not)."""

    calls: List[ToolCall] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    prose: Optional[str] = None


HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def hermes(text: str) -> ParsedTurn:
    """`<tool_call>{json}</tool_call>` blocks; an unclosed last block (the turn hit its token limit) counts too."""
    parsed = ParsedTurn(prose=HERMES_BLOCK.sub("", text).strip())
    for match in HERMES_BLOCK.finditer(text):
        body = match.group(1).strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError as error:
            parsed.errors.append(f"malformed tool call (invalid JSON: {error.msg} at column {error.colno})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            parsed.errors.append('malformed tool call: expected {"name": ..., "arguments": {...}}')
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):   # some models send the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                parsed.errors.append(f"malformed tool call to {call['name']}: arguments are not JSON")
                continue
        parsed.calls.append(ToolCall(call["name"], arguments))
    return parsed
