"""A tool and a tool-call parser written outside coati (`--tools tool_timing:clock --tool_parser
tool_timing:every_turn_a_call`): every model turn calls the clock, which takes a random few milliseconds, so episodes
run several turns whose later requests reach the engine in an order that changes from run to run."""
import random
import time

from coati.rollout.tool_calls import ParsedTurn, ToolCall


def clock() -> str:
    """Waits a random few milliseconds.

    Returns:
        A tick.
    """
    time.sleep(random.SystemRandom().uniform(0.0, 0.05))
    return "tick"


def every_turn_a_call(text: str) -> ParsedTurn:
    """Reads every turn, whatever its text, as one call of the clock."""
    return ParsedTurn(calls=[ToolCall("clock", {})])
