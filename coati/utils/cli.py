"""Argument parsing that fails like the rest of coati: one `error:` line naming the flag, exit status 2.

Ranges live where a flag is declared (`type=at_least(1)`, `type=in_range(0, 1)`), so `--batch_size 0`
is refused at parse time, before anything is loaded, and `--help` shows the range.
"""
import argparse
import math
import sys
from typing import Callable, NoReturn, Optional

from coati.utils.errors import USAGE_EXIT_CODE, CoatiUsageError, fail, warn_user


class RangeHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each flag's default and, for flags typed by `in_range`, its range: `(default: 4) [>= 1]`."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        wanted = getattr(action.type, "wanted", None)
        return f"{text} [{wanted}]" if wanted else text


class CoatiArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one line (`error: argument --x: ...`), not usage + error."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", RangeHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(f"error: {message} (see {self.prog} --help)", USAGE_EXIT_CODE)

    def parse_args(self, args=None, namespace=None) -> argparse.Namespace:
        """Parse, then run the parser's `post_parse` steps (e.g. translating ColossalChat's flags); a step's
        `CoatiUsageError` is reported like any other argument error. An argument that is only blanks (a shell line
        ending in `\\ \\`, as one of ColossalChat's own test commands does) is dropped with a warning."""
        argv = sys.argv[1:] if args is None else list(args)
        blank = [a for a in argv if isinstance(a, str) and a and not a.strip()]
        if blank:
            warn_user(f"ignoring {len(blank)} blank argument(s) {blank!r} (an escaped space in the command line?)")
            argv = [a for a in argv if a not in blank]
        parsed = super().parse_args(argv, namespace)
        for step in getattr(self, "post_parse", []):
            try:
                step(parsed)
            except CoatiUsageError as exc:
                self.error(str(exc))
        return parsed


def _number(kind: type, text: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def in_range(low: Optional[float] = None, high: Optional[float] = None, kind: type = float,
             low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """An argparse `type` accepting `kind` values within [low, high] (an open bound excludes its end)."""
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    if low is not None and high is not None:
        wanted = f"in {left}{low}, {high}{right}"
    elif low is not None:
        wanted = f"{'>' if low_open else '>='} {low}"
    else:
        wanted = f"{'<' if high_open else '<='} {high}"

    def parse(text: str) -> float:
        value = _number(kind, text)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    parse.__name__ = f"{kind.__name__} {wanted}"
    parse.wanted = wanted
    return parse


def at_least(low: int) -> Callable[[str], int]:
    """An integer >= `low`."""
    return in_range(low, kind=int)


def positive() -> Callable[[str], float]:
    """A number > 0."""
    return in_range(0, low_open=True)


def non_negative() -> Callable[[str], float]:
    """A number >= 0."""
    return in_range(0)
