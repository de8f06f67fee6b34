"""The parser built from the settings dataclasses of `coati.config`, and those dataclasses built back from it.

`add_settings(parser, cls)` adds one flag per `setting` field of `cls` (nested settings included), with its help, range
and default; `settings_from(args, cls)` builds `cls` from the parsed flags. Errors are one line naming the flag
(`CoatiArgumentParser`), exit status 2, before anything is loaded.
"""
import argparse
import contextlib
import re
import sys
from dataclasses import MISSING, Field, fields
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, NoReturn, Optional, Sequence, Set, Type, TypeVar

from coati.cli.config_file import (CONFIG_FLAG, NOT_SAVED, add_switch_offs, check_flags_known, config_tokens,
                                   drop_ignored_flags, expand_output_dir, given_flags, hf_negations, read_config,
                                   resolved_config, split_config_flag, split_overrides, switch_words)
from coati.cli.openrlhf_names import openrlhf_flags, redacted
from coati.cli.verl_names import overrides_into_file
from coati.utils.errors import USAGE_EXIT_CODE, CoatiUsageError, fail, note_user, warn_user
from coati.utils.settings import dest, flag_name

T = TypeVar("T")
OVERRIDES = "section.key=value overrides"
"""How messages and a run's record name the settings given as verl's (Hydra's) overrides."""


class RangeHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each flag's default and, for flags typed by `in_range`, its range: `(default: 4) [>= 1]`."""

    def _get_help_string(self, action: argparse.Action) -> str:
        own = action.help or ""
        text = own if "(default:" in own or "default:" in own.split("(")[-1] else super()._get_help_string(action)
        wanted = getattr(action.type, "wanted", None)
        return f"{text} [{wanted}]" if wanted else text


class CoatiArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one line (`error: argument --x: ...`), not usage + error, that takes
    `--config FILE` (`coati.cli.config_file`: its keys are flags, which the command line overrides), refuses an
    unknown flag naming the nearest ones, and takes no abbreviation of a flag."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", RangeHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.add_argument(CONFIG_FLAG, metavar="FILE", default=None,
                          help="a YAML or JSON file of settings: keys are these flags without their dashes (coati's, "
                               "ColossalChat's or TRL's names; GRPO and PPO also read verl's sections, and its "
                               "section.key=value overrides after the command); flags given here override it")
        self.given: Dict[str, str] = {}
        self.origins: Dict[str, str] = {}
        """The flags a config key or an override gave under another name (`--lr`: `optim.lr`), for messages."""
        self.typed: Set[str] = set()
        """The flags typed on the command line itself (their errors name them alone)."""

    def error(self, message: str) -> NoReturn:
        fail(f"error: {self._named_as_given(message)} (see {self.prog} --help)", USAGE_EXIT_CODE)

    def _named_as_given(self, message: str) -> str:
        """argparse names a flag with aliases by all its spellings (`argument --lr/--learning_rate: ...`): name it
        as the user wrote it, else by its first spelling, beside the config key or override that gave it."""
        match = re.match(r"argument ((?:--?[\w-]+/)*--?[\w-]+): ", message)
        if not match:
            return message
        names = match.group(1).split("/")
        typed = next((name for name in names if name in self.given.values()), names[0])
        origin = self.origins.get(typed) if typed not in self.typed else None
        return f"argument {f'{origin} ({typed})' if origin else typed}: {message[match.end():]}"

    def parse_args(self, args=None, namespace=None) -> argparse.Namespace:
        """Parse `--config`'s file and the command line, then run the parser's `post_parse` steps (e.g. translating
        ColossalChat's flags); a step's `CoatiUsageError` is reported like any other argument error. An argument that
        is only blanks (a shell line ending in `\\ \\`, as one of ColossalChat's own test commands does) is dropped
        with a warning. The parsed namespace carries the run's record (`RunRecord`) as `_run_record`."""
        argv = sys.argv[1:] if args is None else list(args)
        command = getattr(getattr(self, "run_config", None), "command", "")
        add_switch_offs(self)
        blank = [a for a in argv if isinstance(a, str) and a and not a.strip()]
        if blank:
            warn_user(f"ignoring {len(blank)} blank argument(s) {blank!r} (an escaped space in the command line?)")
            argv = [a for a in argv if a not in blank]
        try:
            path, command_line = split_config_flag(argv, note_user)
            from_openrlhf, command_line, openrlhf_origins, openrlhf_unused = openrlhf_flags(command, command_line)
            if openrlhf_unused:
                note_user("not used: " + "; ".join(f"{flag} ({why})" for flag, why in openrlhf_unused.items()))
            self.origins.update(openrlhf_origins)
            overrides, command_line = split_overrides(self, hf_negations(self, command_line))
            command_line = drop_ignored_flags(self, command_line)
            check_flags_known(self, command_line)
            command_line = switch_words(self, command_line)
            file_values, overrides = overrides_into_file(read_config(path) if path else {}, overrides, command)
            from_file = config_tokens(self, file_values, path) if path else []
            overridden = config_tokens(self, overrides, "", OVERRIDES) if overrides else []
        except CoatiUsageError as exc:
            self.error(str(exc))
        flags_alone = given_flags(self, command_line)
        self.typed = set(flags_alone.values())
        # verl's section.key=value overrides and OpenRLHF's flags: after the file, before coati's flags
        command_line = overridden + from_openrlhf + command_line
        from_flags, in_file = given_flags(self, command_line), given_flags(self, from_file)
        self.given, self.on_command_line = {**in_file, **from_flags}, from_flags
        by_override = {dest: flag for dest, flag in from_flags.items() if dest not in flags_alone}
        parsed = super().parse_args(from_file + command_line, namespace)
        parsed.config = path
        parsed._given_as = {dest: flag if flag in self.typed else self.origins.get(flag, flag)
                            for dest, flag in self.given.items()}   # a config key's or override's own name
        for step in [*getattr(self, "post_parse", []), expand_output_dir]:
            try:
                step(parsed)
            except CoatiUsageError as exc:
                self.error(str(exc))
        for destination, trl_name in getattr(self, "derived", {}).items():   # a setting a TRL name set goes by it
            parsed._given_as.setdefault(destination, f"--{trl_name}")
        parsed._run_record = RunRecord(resolved_config(self, parsed),
                                       self._sources(parsed, in_file, from_flags, by_override), redacted(argv),
                                       command)
        return parsed

    def _sources(self, parsed: argparse.Namespace, in_file: Dict[str, str], from_flags: Dict[str, str],
                 by_override: Dict[str, str]) -> Dict[str, str]:
        """Where each setting's value came from (`in_file`, `from_flags`, and `by_override` among them: destination
        -> the flag that set it): `flag --x`, `override KEY` (a section.key=value override, by its key), `file` (by
        the key it was given as where that is not its name: `file (per_device_train_batch_size)`, `file
        (actor_rollout_ref.actor.optim.lr)`), `derived` (set from other settings) or `default`."""
        def key_of(flag: str) -> str:
            return self.origins.get(flag) or flag.lstrip("-")

        sources = {}
        for action in self._actions:
            if not action.option_strings or action.default is argparse.SUPPRESS or not hasattr(parsed, action.dest) \
                    or action.dest in NOT_SAVED:
                continue
            trl_dest = f"trl_{getattr(self, 'derived', {}).get(action.dest)}"
            if action.dest in by_override or trl_dest in by_override:
                origin = key_of(by_override.get(action.dest) or by_override[trl_dest])
                sources[action.dest] = f"flag {origin}" if origin.startswith("--") else f"override {origin}"
            elif trl_dest in from_flags:
                sources[action.dest] = f"flag {from_flags[trl_dest]}"
            elif trl_dest in in_file:
                sources[action.dest] = f"file ({trl_dest[4:]})"
            elif action.dest in from_flags:
                sources[action.dest] = f"flag {from_flags[action.dest]}"
            elif action.dest in in_file:
                given = key_of(in_file[action.dest])
                sources[action.dest] = "file" if given == action.dest else f"file ({given})"
            else:
                default = action.default if not isinstance(action.default, tuple) else list(action.default)
                sources[action.dest] = "default" if getattr(parsed, action.dest) == default else "derived"
        return sources


def named_as_given(message: str, args: argparse.Namespace) -> str:
    """`message`, when it opens with a flag the user set under another of its names (a config's `model_name_or_path`
    for `--pretrain`), opening with that name instead, coati's flag beside it."""
    match = re.match(r"--\w+", message)
    if not match:
        return message
    flag = match.group(0)
    dest = "dataset" if flag == getattr(args, "dataset_flag", None) else flag[2:]
    given = getattr(args, "_given_as", {}).get(dest)
    if not given or given == flag:
        return message
    return f"{given.lstrip('-')} ({flag}){message[len(flag):]}"


@contextlib.contextmanager
def errors_named_as_given(args: argparse.Namespace) -> Iterator[None]:
    """A `CoatiUsageError` raised inside names its setting as the user did (`named_as_given`)."""
    try:
        yield
    except CoatiUsageError as error:
        error.args = (named_as_given(str(error), args),)
        raise


def add_post_parse(parser: argparse.ArgumentParser, step: Callable[[argparse.Namespace], None]) -> None:
    """Run `step(args)` on the parsed flags (`CoatiArgumentParser` runs these after parsing, in the order added)."""
    parser.post_parse = [*getattr(parser, "post_parse", []), step]


class RunRecord(NamedTuple):
    """What a run saves about its own settings (`coati.cli.config_file.save_run_config`)."""

    config: Dict[str, Any]
    sources: Dict[str, str]
    argv: List[str]
    command: str = ""
    """The `coati` command that reruns it (e.g. `grpo`), where the parser has a run config."""


def _default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _parser_default(value: Any) -> Any:
    """A field's default as the parser holds it: lists for tuples, NAME=VALUE pairs for dicts."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return list(value.items())
    return value


def add_settings(parser: argparse.ArgumentParser, cls: type, title: Optional[str] = None, *,
                 defaults: Optional[Dict[str, Any]] = None, helps: Optional[Dict[str, str]] = None,
                 flags: Optional[Dict[str, str]] = None, skip: Sequence[str] = ()) -> None:
    """One flag per setting of `cls` and of its nested settings, in the group `title` (default: the first line of
    the class's docstring). A flag the parser has already is left as it is, so a setting two classes share is one flag.
    `defaults`, `helps` and `flags` change a field's default, help or flag for this script, and `skip` leaves fields
    out, by field name."""
    group = _group(parser, title or cls.__doc__.strip().splitlines()[0].rstrip("."))
    _add_fields(parser, group, cls, _Changes(defaults or {}, helps or {}, flags or {}, set(skip)))


class _Changes(NamedTuple):
    defaults: Dict[str, Any]
    helps: Dict[str, str]
    flags: Dict[str, str]
    skip: Set[str]


def _group(parser: argparse.ArgumentParser, title: str) -> Any:
    """The parser's argument group `title`, made on first use, so two classes can share one `--help` section."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _add_fields(parser: argparse.ArgumentParser, group: Any, cls: type, changes: _Changes) -> None:
    for f in fields(cls):
        if "nested" in f.metadata:
            _add_fields(parser, group, f.metadata["nested"], changes)
            continue
        flag = flag_name(f)
        if flag is None or f.name in changes.skip or flag in parser._option_string_actions:
            continue
        meta = f.metadata["setting"]
        default = changes.defaults.get(f.name, _default(f))
        help = changes.helps.get(f.name, meta["help"])
        kwargs: Dict[str, Any] = dict(dest=dest(f), help=help() if callable(help) else help)   # a registry's: built now
        if meta["negated"]:
            kwargs.update(action="store_true", default=not default)
        elif isinstance(default, bool) and meta["parse"] is None:
            kwargs.update(action="store_true", default=default)
        else:
            kwargs.update(type=meta["parse"], choices=meta["choices"], nargs=meta["nargs"], metavar=meta["metavar"])
            if default is MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = _parser_default(default)
        given = {k: v for k, v in kwargs.items() if v is not None}
        group.add_argument(changes.flags.get(f.name, flag), *meta["aliases"], **given)


def add_alias(group: Any, flag: str, cls: type, name: str, note: str = "") -> None:
    """`flag` as another spelling of the setting `name` of `cls` (a ColossalChat flag): the same destination, parse
    and range, and no default of its own, so the setting's stands."""
    f = next(f for f in fields(cls) if f.name == name)
    meta = f.metadata["setting"]
    kwargs = dict(dest=dest(f), type=meta["parse"], nargs=meta["nargs"], default=argparse.SUPPRESS,
                  help=f"alias of {flag_name(f)}{note}")
    group.add_argument(flag, **{k: v for k, v in kwargs.items() if v is not None})


def settings_from(args: argparse.Namespace, cls: Type[T], **given: Any) -> T:
    """`cls` from the parsed flags; `given` sets fields the run derives (and overrides flags). Settings this script has
    no flag for keep their defaults."""
    values: Dict[str, Any] = {}
    for f in fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
        elif "nested" in f.metadata:
            values[f.name] = settings_from(args, f.metadata["nested"])
        elif flag_name(f) is not None and hasattr(args, dest(f)):
            values[f.name] = _field_value(f, getattr(args, dest(f)))
    return cls(**values)


def _field_value(f: Field, value: Any) -> Any:
    meta = f.metadata["setting"]
    if meta["negated"]:
        return not value
    if meta["convert"] is not None:
        return meta["convert"](value)
    return tuple(value) if isinstance(value, list) else value
