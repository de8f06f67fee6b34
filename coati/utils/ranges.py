"""Ranges of numeric options: argparse `type`s (`at_least(1)`, `in_range(0, 1)`) that refuse a value out of range by
name at parse time, before anything is loaded, and tell `--help` the range (`wanted`); and `readable_file`."""
import argparse
import math
import os
from typing import Callable, Optional, Tuple


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


def whole_or_fraction() -> Callable[[str], float]:
    """A number > 0, an int where it is whole (3 epochs stay 3; TRL's 0.5 is half a pass)."""
    parse = positive()

    def number(text: str) -> float:
        value = parse(text)
        return int(value) if value.is_integer() else value

    number.__name__, number.wanted = parse.__name__, parse.wanted
    return number


def non_negative() -> Callable[[str], float]:
    """A number >= 0."""
    return in_range(0)


def readable_file(text: str) -> str:
    """An argparse `type`: the path of a file that exists and can be read."""
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: no readable file there")
    return text


def renaming(text: str) -> Tuple[str, str]:
    """An argparse `type`: OLD=NEW, a name and the name it is read as (`--dataset_columns question=prompt`)."""
    old, sep, new = text.partition("=")
    if not sep or not old.strip() or not new.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected COLUMN=NAME, e.g. question=prompt")
    return old.strip(), new.strip()


def is_number(text: str) -> bool:
    """`-1`, `-1e-3`: a value, not a flag."""
    try:
        float(text)
    except ValueError:
        return False
    return True
