"""Options declared once: a frozen dataclass field whose metadata holds the option's flag, help and range.

`setting(...)` makes such a field; `coati.cli.options` builds the parser (and so the validation and `--help`) from
the fields and the dataclass from the parsed flags, as TRL's `HfArgumentParser` does, but with coati's range checks.
Light: no torch, so `--help` stays fast.
"""
from dataclasses import MISSING, Field, field
from typing import Any, Callable, Optional, Sequence, Union

NOT_A_FLAG = None
"""`setting(flag=NOT_A_FLAG)`: a field the run sets itself (derived from other options), never from the command line."""


def setting(default: Any = MISSING, *, help: Union[str, Callable[[], str]], parse: Optional[Callable[[str], Any]] = None, flag: Any = "",
            aliases: Sequence[str] = (), choices: Optional[Sequence[Any]] = None, nargs: Optional[str] = None,
            metavar: Optional[str] = None, factory: Any = MISSING, negated: bool = False,
            convert: Optional[Callable[[Any], Any]] = None) -> Any:
    """A dataclass field that is also a command-line option.

    `flag` is its primary flag (default `--<field name>`; the parsed value's name is the flag without dashes) and
    `aliases` more flags; `parse` an argparse `type` (`coati.utils.ranges.in_range`, a registry's `choice()`), whose range
    `--help` shows. A bool field is a switch: `--flag` sets it, or clears it where `negated` (`--no_x`). `convert`
    turns the parsed value into the field's (a NAME=VALUE list into a dict). `help` may be a function giving the text
    when a parser is built (a registry's `describe`, which lists what is registered by then)."""
    meta = dict(help=help, parse=parse, flag=flag, aliases=tuple(aliases), choices=choices, nargs=nargs,
                metavar=metavar, negated=negated, convert=convert)
    return field(default=default, default_factory=factory, metadata={"setting": meta})


def nested(cls: type) -> Any:
    """A field holding another settings dataclass (a config's `sampling`), whose options join its parent's."""
    return field(default_factory=cls, metadata={"nested": cls})


def flag_name(f: Field) -> Optional[str]:
    """The field's primary flag (`--name`), or None for a field with no flag."""
    meta = f.metadata.get("setting")
    if meta is None or meta["flag"] is NOT_A_FLAG:
        return None
    return meta["flag"] or f"--{f.name}"


def dest(f: Field) -> str:
    """Where the parsed flags keep the field's value: its primary flag without the dashes."""
    return flag_name(f).lstrip("-")


def take_hidden(args: Any, name: str) -> Any:
    """A hidden flag's value (None where it was not given), taken off `args` so that no saved config holds it."""
    value = getattr(args, name, None)
    if hasattr(args, name):
        delattr(args, name)
    return value
