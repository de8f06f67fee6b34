"""Environments of multi-turn rollouts: what answers a model's turn.

An `Environment` is reset with a prompt row and then stepped with each model turn (its text, parsed only, never
re-tokenized): it returns the messages it adds (tool responses, a user's reply), a reward term for the turn and
whether the episode is over. `coati.rollout.tools.ToolEnvironment` runs the tool calls in the turn; a turn without
calls ends it.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

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
