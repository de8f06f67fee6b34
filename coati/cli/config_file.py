"""Config files (`--config FILE`, YAML or JSON) read as the flags they stand for, and the run's resolved config saved.

A file is a mapping whose keys are the command's flags without their dashes (coati's names, ColossalChat's, and the
TRL/HF names of `coati.cli.trl_names`), flat as TRL's recipes are, or grouped under the sections of the command's run
config (`coati.run_config`: `model:`, `optim:`, `rollout:`, ...) as verl's are and as a run saves its own; each value
becomes that flag on a command line placed before the real one, so flags given on the command line win. A key that
names no flag is refused in one line with the nearest names. Launcher
keys (`num_processes`, `nproc_per_node`, ...) are the `coati` command's (`coati.cli.main`) and are skipped here.
Light: no torch, so a wrong key is answered at once.
"""
import argparse
import difflib
import json
import os
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from coati.cli.trl_keys import (IGNORED_KEYS, NO_SETTING_KEYS, ONE_VALUE_KEYS, REFUSED_KEYS, TRUTH_WORDS, refusal,
                                truthy, unused_reason)
from coati.cli.openrlhf_names import OLDER_FLAGS
from coati.cli.verl_names import (SHARED_SECTIONS, VERL_COMMANDS, VERL_SECTIONS, is_verl_key, split_verl,
                                   verl_settings, yaml_value)
from coati.run_config import RUN_CONFIGS, sections
from coati.utils.errors import CoatiUsageError, note_user
from coati.utils.ranges import is_number
from coati.utils.settings import dest, flag_name

CONFIG_FLAG = "--config"
LAUNCH_KEYS = {"num_processes": "--nproc_per_node", "nproc_per_node": "--nproc_per_node", "nnodes": "--nnodes",
               "node_rank": "--node_rank", "master_addr": "--master_addr", "master_port": "--master_port",
               "hostfile": "--hostfile"}
"""Config keys that say how to launch the run (TRL recipes' `num_processes` among them) -> the `coati` command's flag."""
ADAMW_OPTIMS = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused")
"""TRL's `optim` names for the AdamW coati trains with; `optim` is also coati's section of optimizer settings."""
OUTPUT_DIR_MARK = "{output_dir}"
"""In a saved config, paths inside the run's output folder start with this, so a rerun with another --output_dir
writes inside its own."""
SAVED_CONFIG = "run_config.yaml"
RUN_INFO = "run_info.json"
COLOSSALCHAT_SECTION = "colossalchat"
"""The saved config's section of ColossalChat's own flags (those that are not another spelling of a setting)."""


def read_config(path: str) -> Dict[str, Any]:
    """The mapping in the YAML or JSON file `path`; one line naming the file where it cannot be read."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as error:
        raise CoatiUsageError(f"{CONFIG_FLAG} {path}: {error.strerror or error}") from None
    try:
        values = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise CoatiUsageError(f"{CONFIG_FLAG} {path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                              f"{' '.join(str(error).split())}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise CoatiUsageError(f"{CONFIG_FLAG} {path}: expected a mapping of settings (key: value), got a "
                              f"{type(values).__name__}")
    return values


HYDRA_CONFIG_FLAGS = {"--config-path": "folder", "-cp": "folder", "--config-name": "name", "-cn": "name"}
"""Hydra's flags for the config file (verl's recipes: `--config-path=config --config-name=dapo_trainer`): the
file NAME(.yaml) in the folder, as `--config`."""


VERL_BUILTIN_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer", "_generated_ppo_trainer",
                        "_generated_ppo_megatron_trainer")
"""verl's own configs, which its scripts name with `--config-name` from inside its package: coati's defaults stand in
for them (those that differ are noted)."""


def split_config_flag(argv: Sequence[str], say: Optional[Callable[[str], None]] = None) -> tuple:
    """(`--config`'s file, or the one Hydra's `--config-path` and `--config-name` name, or None; the other
    arguments); a config file given twice, or a flag without its value, is refused. One of verl's own configs
    (`VERL_BUILTIN_CONFIGS`) that is not there is none, said through `say`."""
    paths, hydra, rest, i = [], {}, [], 0
    while i < len(argv):
        arg = argv[i]
        flag = arg.partition("=")[0]
        if flag == CONFIG_FLAG or flag in HYDRA_CONFIG_FLAGS:
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            if not value or value.startswith("-"):
                raise CoatiUsageError(f"{flag} needs a " + ("file (YAML or JSON)" if flag == CONFIG_FLAG else
                                                            HYDRA_CONFIG_FLAGS[flag]))
            if flag == CONFIG_FLAG:
                paths.append(value)
            else:
                hydra[HYDRA_CONFIG_FLAGS[flag]] = value
            i += 1 if "=" in arg else 2
            continue
        rest.append(arg)
        i += 1
    if hydra and not _verl_builtin(hydra, say):
        paths.append(_hydra_config(hydra))
    if len(paths) > 1:
        raise CoatiUsageError(f"{CONFIG_FLAG} given {len(paths)} times (Hydra's --config-name counts as one); give "
                              "one file (flags override its values)")
    return (paths[0] if paths else None), rest


def _verl_builtin(hydra: Dict[str, str], say: Optional[Callable[[str], None]]) -> bool:
    """Whether Hydra's flags name one of verl's own configs that is not here (verl finds it inside its package)."""
    if Path(hydra.get("name", "")).stem not in VERL_BUILTIN_CONFIGS or Path(_hydra_config(hydra)).is_file():
        return False
    if say is not None:
        say(f"--config-name {hydra['name']}: verl's own config, which coati's defaults stand in for (the overrides "
            "still apply)")
    return True


def _hydra_config(hydra: Dict[str, str]) -> str:
    """The file Hydra's `--config-path` (default: here) and `--config-name` (`.yaml` unless it has a suffix) name."""
    if "name" not in hydra:
        raise CoatiUsageError("--config-path needs --config-name, the config file in that folder")
    name = hydra["name"] if Path(hydra["name"]).suffix in (".yaml", ".yml", ".json") else f"{hydra['name']}.yaml"
    return str(Path(hydra.get("folder", ".")) / name)


def nearest(name: str, known: Iterable[str]) -> str:
    """' (did you mean X or Y?)' for the known names closest to `name`, or '' when none is close."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.7)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def section_owners(parser: argparse.ArgumentParser) -> Dict[str, str]:
    """Each destination of the parser's run config by the section that declares it (the first, where two share it);
    empty for a parser built without a run config."""
    owners: Dict[str, str] = {}
    tree = getattr(parser, "run_config", None)
    for name, cls, shown in sections(tree) if tree is not None else ():
        for destination in _destinations(cls, shown.skip):
            owners.setdefault(destination, name)
    return owners


def _destinations(cls: type, skip: Sequence[str]) -> List[str]:
    """The destinations of the flags of `cls` and its nested settings, but those of the fields named in `skip`."""
    found: List[str] = []
    for f in fields(cls):
        if "nested" in f.metadata:
            found += _destinations(f.metadata["nested"], skip)
        elif flag_name(f) is not None and f.name not in skip:
            found.append(dest(f))
    return found


def flat_settings(parser: argparse.ArgumentParser, values: Mapping[str, Any], source: str,
                  actions: Dict[str, argparse.Action]) -> List[tuple]:
    """(key, value, where) of each setting in a config file's `values`: a section's mapping (`optim: {lr: ...}`) gives
    its keys, each checked to belong to that section (TRL's converted names go at the top level); any other key is a
    setting itself (`config_tokens` refuses a setting given twice, `learning_rate` and `optim.lr`)."""
    owners = section_owners(parser)
    known_sections = {*owners.values(), COLOSSALCHAT_SECTION}
    flat: List[tuple] = []
    for key, value in values.items():
        key = str(key)
        if key == "optim" and isinstance(value, str):   # TRL's optimizer name, not coati's section of that name
            check_adamw(value, f"{source}: optim", "leave the key out")
            flat.append((key, value, key))
            continue
        if key in known_sections and key.lstrip("-") not in actions:
            flat += _section_settings(key, value, owners, actions, source)
            continue
        if isinstance(value, Mapping) and owners and key.lstrip("-") not in {*actions, *NO_SETTING_KEYS}:
            raise CoatiUsageError(f"{source}: unknown section {key!r}"
                                  f"{_elsewhere(key, parser) or nearest(key, known_sections)}")
        flat.append((key, value, key))
    return flat


MOVED_SETTINGS = {("multi_turn", "chat_template")}
"""(section, key) of settings that have moved to another section since run configs were saved with them (GRPO's
chat template is the model's since 2026-12-02): still read from there."""


def _section_settings(section: str, value: Any, owners: Dict[str, str], actions: Dict[str, argparse.Action],
                      source: str) -> List[tuple]:
    """The (key, value, where) of one section's mapping; an empty section is none."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        example = next(flag for flag, action in actions.items() if owners.get(action.dest) == section) \
            if section != COLOSSALCHAT_SECTION else "lora_config"
        raise CoatiUsageError(f"{source}: {section!r} is a section: give its settings under it, e.g. "
                              f"`{section}: {{{example}: ...}}`, not {value!r}")
    settings = []
    for sub, sub_value in value.items():
        sub = str(sub)
        action = actions.get(sub.lstrip("-"))
        owner = owners.get(action.dest) if action is not None else None
        if owner is not None and owner != section and (section, sub) not in MOVED_SETTINGS:
            raise CoatiUsageError(f"{source}: {section}.{sub} is a setting of section {owner!r}, not "
                                  f"{section!r}; move it there (or to the top level)")
        if action is not None and owner is None and section != COLOSSALCHAT_SECTION:
            raise CoatiUsageError(f"{source}: {section}.{sub} is TRL's or ColossalChat's name, converted "
                                  f"to coati's settings: give it at the top level, or coati's own name in its section")
        settings.append((sub, sub_value, f"{section}.{sub}"))
    return settings


def _refuse_twice_given(settings: List[tuple], actions: Dict[str, argparse.Action], source: str) -> None:
    """One line where two keys of a file set the same setting (the later would silently win)."""
    seen: Dict[str, str] = {}
    for key, _, where in settings:
        action = actions.get(key.lstrip("-"))
        if action is None:
            continue
        if action.dest in seen:
            raise CoatiUsageError(f"{source}: {seen[action.dest]} and {where} set the same setting; keep one")
        seen[action.dest] = where


def _elsewhere(name: str, parser: argparse.ArgumentParser) -> str:
    """' (a section of coati X, Y: not of this command)' where other commands' run configs have a section `name`."""
    own = _command(parser)
    others = [command for command, tree in RUN_CONFIGS.items()
              if command != own and any(section == name for section, _, _ in sections(tree))]
    return f" (a section of {', '.join(f'coati {c}' for c in others)}, not of this command)" if others else ""


def tree_argv(parser: argparse.ArgumentParser, run: Any) -> List[str]:
    """The flags that give `parser` the run config `run` (a tree of `coati.run_config` built in Python). A setting two
    sections share is taken from the section that declares it first, as a config file's would be."""
    owners = section_owners(parser)
    actions = {action.dest: action for action in reversed(parser._actions) if action.option_strings}
    values = {name: _section_values(actions, getattr(run, name), name, owners) for name, _, _ in sections(type(run))}
    return config_tokens(parser, values, type(run).__name__)


def _section_values(actions: Dict[str, argparse.Action], settings: Any, section: str,
                    owners: Dict[str, str]) -> Dict[str, Any]:
    """One section's settings as a config file holds them: by primary flag (`actions`: the parser's first action for
    each destination), switches and lists as the parser takes them; settings this command has no flag for, or that
    another section declares, left out."""
    values: Dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if "nested" in f.metadata:
            values.update(_section_values(actions, value, section, owners))
            continue
        if flag_name(f) is None or dest(f) not in actions or owners.get(dest(f)) != section or value is None:
            continue
        action = actions[dest(f)]
        name = next(s for s in action.option_strings if s.startswith("--"))[2:]
        values[name] = not value if f.metadata["setting"]["negated"] else _plain(value)
    return values


def config_tokens(parser: argparse.ArgumentParser, values: Mapping[str, Any], path: str,
                  source: Optional[str] = None) -> List[str]:
    """The command-line arguments the file `path`'s `values` stand for, in the file's order; messages name them by
    `source` (default `--config PATH`)."""
    source = source or f"{CONFIG_FLAG} {path}"
    actions = _actions_by_key(parser)
    tokens: List[str] = []
    command = _command(parser)
    values, verl = split_verl(values, command)
    try:
        from_verl, verl_unused = verl_settings(verl, command) if verl else ([], {})
    except CoatiUsageError as error:
        raise CoatiUsageError(f"{source}: {error}") from None
    settings = from_verl + flat_settings(parser, values, source, actions)
    _refuse_twice_given(settings, actions, source)   # `learning_rate` and `optim.lr`, or a verl key and coati's
    unused = {where: unused_reason(key, value, command) for key, value, where in settings if key not in actions}
    unused = {**verl_unused, **{where: reason for where, reason in unused.items() if reason is not None}}
    if unused:
        note_user(f"{source}: not used: " + "; ".join(f"{where} ({why})" for where, why in unused.items()))
    settings = [(key, value, where) for key, value, where in settings
                if key not in LAUNCH_KEYS and where not in unused]
    problems = [_key_problem(key, value, where, actions, command) for key, value, where in settings
                if key in REFUSED_KEYS or key.lstrip("-") not in actions]
    if problems:
        raise CoatiUsageError(f"{source}: " + "; ".join(problems))
    origins = getattr(parser, "origins", {})
    for key, value, where in settings:
        action = actions[key.lstrip("-")]
        tokens += _tokens(action, _flag_for(action, key), value, f"{source}: {where}")
        if where != key:   # `optim.lr`, verl's `actor_rollout_ref.rollout.n`: errors name the key as written
            origins[_flag_for(action, key)] = where
    return tokens


def _command(parser: argparse.ArgumentParser) -> str:
    """The command `parser` parses (sft, grpo, ...), '' for one without a run config."""
    return getattr(getattr(parser, "run_config", None), "command", "")


def _key_problem(key: str, value: Any, where: str, actions: Dict[str, argparse.Action], command: str) -> str:
    """Why the file's key `key` (at `where`, set to `value`) is not taken by `command`: refused with what to do
    instead, or unknown with the nearest names; every such key of a file is named in one line."""
    refused = refusal(key, value, command)
    if refused is not None:
        return f"key {where!r} {refused}"
    section = where.split(".")[0]
    if command in VERL_COMMANDS and section in SHARED_SECTIONS:   # verl's keys of that section first
        verl_names = nearest(where, [f"{section}.{name}" for name in SHARED_SECTIONS[section]])
        if verl_names:
            return f"unknown key {where!r}{verl_names}"
    hidden = ("trl_", "verl_", "openrlhf_")
    return f"unknown key {where!r}{nearest(key, [k for k in actions if not k.startswith(hidden)])}"


def _actions_by_key(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    """Every flag of `parser` by its name without dashes, and every destination by its name."""
    actions: Dict[str, argparse.Action] = {}
    for flag, action in parser._option_string_actions.items():
        if flag.startswith("--") and (action.help is not argparse.SUPPRESS or _is_refusal(action)):
            actions[flag[2:]] = action
    for action in parser._actions:
        if action.option_strings and action.dest not in actions and action.dest != argparse.SUPPRESS:
            actions[action.dest] = action
    return actions


def _is_refusal(action: argparse.Action) -> bool:
    """A hidden flag that stops the parse naming what to use instead (ColossalChat's flags coati does not take)."""
    return getattr(action, "instead", None) is not None


def _flag_for(action: argparse.Action, key: str) -> str:
    """The flag to give for `key`: the key itself where it is one of the action's flags, else its primary flag."""
    flag = "--" + key.lstrip("-")
    return flag if flag in action.option_strings else next(s for s in action.option_strings if s.startswith("--"))


def _tokens(action: argparse.Action, flag: str, value: Any, where: str) -> List[str]:
    if value is None:
        return []
    if action.nargs == 0:   # a switch
        if not isinstance(value, bool):
            raise CoatiUsageError(f"{where}: expected true or false, got {value!r}")
        if value == bool(action.const if action.const is not None else True):
            return [flag]
        if value == bool(action.default):
            return [_off_flag(action)]
        raise CoatiUsageError(f"{where}: {str(value).lower()} cannot be set from a file (it is the switch {flag}'s "
                              "opposite); leave the key out")
    word = {False: "no", True: "yes"}.get(value) if isinstance(value, bool) else None
    if word and action.choices and word in action.choices:   # YAML reads an unquoted `no` (eval_strategy: no) as false
        value = word
    if isinstance(value, (dict, list, tuple)) and not value:   # nothing: the flag alone where it may take nothing
        return [flag] if action.nargs == "*" else []
    if isinstance(value, dict):
        return [flag, *(f"{k}={_text(v)}" for k, v in value.items())]
    if isinstance(value, (list, tuple)):
        if action.nargs not in ("+", "*") and len(value) != 1:
            raise CoatiUsageError(f"{where}: expected one value, got a list of {len(value)}")
        return [flag, *(_text(v) for v in value)]
    return [flag, _text(value)]


def _text(value: Any) -> str:
    """A YAML scalar as it would be typed on a command line."""
    if isinstance(value, str):
        return value
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Dict[str, str]:
    """The destinations the arguments `argv` set, each with the flag that set it (a switch turned off, by the
    switch's flag)."""
    given = {}
    for arg in argv:
        action = parser._option_string_actions.get(arg.partition("=")[0]) if arg.startswith("--") else None
        if action is not None:
            given[action.dest] = getattr(action, "switch_flag", arg.partition("=")[0])
    return given


SWITCH_OFF = "--off:"
"""The hidden flags that set a switch back to off (`add_switch_offs`), so that `false` on the command line or in an
override undoes a config file's `true`: `--off:grad_checkpoint`."""


def add_switch_offs(parser: argparse.ArgumentParser) -> None:
    """For each switch of `parser` (a flag without a value, that sets a boolean), a hidden flag that sets it back to
    its default; `_tokens` writes it where a file, an override or `--X false` says the default."""
    for action in list(parser._actions):
        flag = _off_flag(action)
        if action.nargs == 0 and isinstance(action.default, bool) and action.option_strings and \
                flag not in parser._option_string_actions:
            off = parser.add_argument(flag, dest=action.dest, action="store_const", const=action.default,
                                      default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            off.switch_flag = next(s for s in action.option_strings if s.startswith("--"))


def _off_flag(action: argparse.Action) -> str:
    return f"{SWITCH_OFF}{action.dest}"


OVERRIDE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)=(.*)", re.DOTALL)
"""verl's (Hydra's) override of a setting in a section: `optim.lr=1e-6`."""


def split_overrides(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Tuple[Dict[str, Any], List[str]]:
    """(the `section.key=value` and `key=value` overrides among `argv`, verl's Hydra style, as the nested mapping a
    config file would hold, each value read as YAML; the other arguments). An override is an argument that no flag
    takes as its value, or one that names a setting of a section of the command's run config; any other argument
    that no flag takes is refused in one line, for a parser that takes no positional arguments."""
    positional = any(not action.option_strings for action in parser._actions)
    owners = section_owners(parser)
    command = _command(parser)
    sections = set(owners.values())
    verl = {name for name in VERL_SECTIONS if is_verl_key(command, name)}
    if command in VERL_COMMANDS:   # verl's sections coati's share, the critic's under GRPO among them
        verl |= set(SHARED_SECTIONS) - sections
    actions = _actions_by_key(parser)

    def names_a_setting(arg: str) -> bool:
        match = OVERRIDE.fullmatch(arg)
        if not match or match.group(1).split(".")[0] not in sections | verl:
            return False
        section, _, key = match.group(1).partition(".")
        if section in verl or command in VERL_COMMANDS and section in SHARED_SECTIONS:
            return True   # verl's, or in a section both share: a key neither has is an override to refuse by name
        action = actions.get(key)
        return action is not None and owners.get(action.dest) == section

    overrides: Dict[str, Any] = {}
    rest: List[str] = []
    takes = 0   # how many more arguments the last flag takes (-1: any number)
    switch = ""   # the last argument, where it is a switch, which may take true or false (HF's `--packing true`)
    for arg in argv:
        if arg.startswith("-") and len(arg) > 1 and not is_number(arg):
            rest.append(arg)
            action = parser._option_string_actions.get(arg)
            takes = 0 if "=" in arg else _arity(action)
            switch = arg if "=" not in arg and action is not None and action.nargs == 0 else ""
            continue
        if switch and arg.lower() in TRUTH_WORDS:
            rest.append(arg)
            switch = ""
            continue
        if switch and "=" not in arg:
            raise CoatiUsageError(f"{switch} {arg}: a switch takes true or false, or nothing")
        switch = ""
        if takes and not names_a_setting(arg):
            rest.append(arg)
            takes -= takes > 0
            continue
        takes = 0
        if positional:
            rest.append(arg)
            continue
        key, equals, value = arg.lstrip("+").partition("=")   # Hydra's +key=value (add) and ++key=value (force)
        if equals and (key in actions or key in NO_SETTING_KEYS or key.split(".")[0] in sections | verl):
            _nest(overrides, key.split("."), yaml_value(value))
            continue
        raise CoatiUsageError(_unexpected(arg, sections, verl))
    return overrides, rest


def _arity(action: Optional[argparse.Action]) -> int:
    """How many of the arguments after `action`'s flag it takes (-1: any number; an unknown flag, one)."""
    if action is None or action.nargs is None or action.nargs == "?":
        return 1
    if action.nargs in ("+", "*", argparse.REMAINDER):
        return -1
    return int(action.nargs)


def _nest(tree: Dict[str, Any], keys: List[str], value: Any) -> None:
    """`tree[k1][k2]...[kn] = value`."""
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def _unexpected(arg: str, sections: Iterable[str], verl: Iterable[str] = ()) -> str:
    """What to give instead of the argument `arg`, which no flag takes and which overrides no setting (`sections`:
    the command's; `verl`: verl's that it reads too)."""
    if arg.endswith((".yaml", ".yml", ".json")):
        return f"unexpected argument {arg!r}: a config file is given as {CONFIG_FLAG} {arg}"
    match = OVERRIDE.fullmatch(arg.lstrip("+"))
    if match:
        also = f" (and verl's {', '.join(sorted(verl))})" if verl else ""
        return (f"unexpected argument {arg!r}: {match.group(1).split('.')[0]!r} is no section of this command's "
                f"settings{nearest(match.group(1).split('.')[0], {*sections, *verl})}; its sections: "
                f"{', '.join(sorted(sections))}{also}")
    overrides = ", or section.key=value" if sections else ""
    return f"unexpected argument {arg!r}: settings are flags (--name value) or keys of a --config file{overrides}"


def check_adamw(name: str, where: str, instead: str) -> None:
    """TRL's `optim` naming an AdamW is taken (coati trains with one); another optimizer is refused in one line."""
    if name not in ADAMW_OPTIMS:
        raise CoatiUsageError(f"{where} {name!r} is not taken: coati trains with AdamW ({', '.join(ADAMW_OPTIMS)}); "
                              f"{instead}")


def hf_negations(parser: argparse.ArgumentParser, argv: Sequence[str]) -> List[str]:
    """`argv` with Hugging Face's negated switches (`--no_remove_unused_columns`, `--no_bf16`: HfArgumentParser's
    `--no_X` for a boolean that defaults to true) written as `--X false`, where `--X` is a switch here (TRL's boolean
    names among them) or a TRL key taken and not used, and `--no_X` is no flag of its own."""
    def negated(arg: str) -> Optional[str]:
        if not arg.startswith("--no_") or "=" in arg or arg in parser._option_string_actions:
            return None
        flag = "--" + arg[len("--no_"):]
        action = parser._option_string_actions.get(flag)
        switch = action is not None and (action.nargs == 0 or getattr(action, "type", None) is truthy)
        boolean_key = isinstance(ONE_VALUE_KEYS.get(flag[2:], (None,))[0], bool)
        return flag if switch or flag[2:] in IGNORED_KEYS or boolean_key else None

    out: List[str] = []
    for arg in argv:
        flag = negated(arg)
        out += [flag, "false"] if flag else [arg]
    return out


def drop_ignored_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> List[str]:
    """`argv` without TRL's flags that change nothing here (`IGNORED_KEYS`: `--push_to_hub`, `--hub_model_id ID`,
    ...; `ONE_VALUE_KEYS` at their one value: `--shuffle_dataset true`), each with the value that follows it, named in
    one note as a config file's are; such a flag at another value is refused saying what coati does."""
    rest: List[str] = []
    unused: List[str] = []
    command = _command(parser)
    i = 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        name = flag[2:] if flag.startswith("--") else ""
        takes_next = not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if not eq:
            value = argv[i + 1] if takes_next else "true"
        why, refused = unused_reason(name, value, command), refusal(name, value, command)
        if flag in parser._option_string_actions or name in REFUSED_KEYS or (why is None and refused is None):
            rest.append(argv[i])
            i += 1
            continue
        if name == "optim":
            check_adamw(value, "--optim", "leave the flag out")
        if why is None:
            raise CoatiUsageError(f"--{name} {value}: --{name} {refused}")
        unused.append(f"--{name} ({why})")
        i += 2 if takes_next else 1
    if unused:
        note_user("not used: " + "; ".join(unused))
    return rest


def switch_words(parser: argparse.ArgumentParser, argv: Sequence[str]) -> List[str]:
    """`argv` with a switch's value written out (`--gradient_checkpointing true`, `--packing=false`, as Hugging
    Face's argument parser takes them) turned into the switch alone or nothing, as a config file's true/false is."""
    out: List[str] = []
    i = 0
    while i < len(argv):
        flag, sep, value = argv[i].partition("=")
        action = parser._option_string_actions.get(flag) if argv[i].startswith("--") else None
        if action is not None and action.nargs == 0:
            if not sep and i + 1 < len(argv) and argv[i + 1].lower() in TRUTH_WORDS:
                sep, value, i = "=", argv[i + 1], i + 1
            if sep:
                if value.lower() not in TRUTH_WORDS:
                    raise CoatiUsageError(f"{flag}={value}: a switch takes true or false, or nothing")
                out += _tokens(action, flag, TRUTH_WORDS[value.lower()], flag)
                i += 1
                continue
        out.append(argv[i])
        i += 1
    return out


def check_flags_known(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Every `--flag` in `argv` is one of `parser`'s (no abbreviations); one line naming the nearest flags otherwise."""
    known = [f for f in parser._option_string_actions if f.startswith("--") and not f.startswith(SWITCH_OFF)
             and not f.startswith(("--openrlhf_", "--verl_"))]
    for arg in argv:
        flag = arg.partition("=")[0]
        if arg.startswith("--") and len(arg) > 2 and flag not in parser._option_string_actions:
            if flag[2:] in REFUSED_KEYS:
                raise CoatiUsageError(f"{flag} {refusal(flag[2:], None)}")
            launch = " (a launcher flag: give it to the `coati` command, or to torchrun)" if flag[2:] in LAUNCH_KEYS \
                else ""
            renamed = f" (OpenRLHF's older flag; its current one is --{OLDER_FLAGS[flag[2:]]})" \
                if flag[2:] in OLDER_FLAGS else ""
            raise CoatiUsageError(f"unknown flag {flag}{launch or renamed or nearest(flag, known)}")


def resolve_reporting(args: argparse.Namespace) -> None:
    """`--report_to` (TRL's): tensorboard puts TensorBoard events and metrics.jsonl in --log_dir, by default
    --output_dir/logs; wandb also logs to W&B (`--use_wandb`); none logs neither."""
    targets = list(args.report_to)
    if "none" in targets and len(targets) > 1:
        raise CoatiUsageError(f"--report_to {' '.join(targets)}: none means no logs; give it alone")
    if "none" in targets and (args.log_dir or args.use_wandb):
        raise CoatiUsageError("--report_to none with --log_dir or --use_wandb: drop one")
    args.use_wandb = args.use_wandb or "wandb" in targets
    if "tensorboard" in targets and not args.log_dir and getattr(args, "output_dir", None):
        args.log_dir = str(Path(args.output_dir) / "logs")


def expand_output_dir(args: argparse.Namespace) -> None:
    """Replace `OUTPUT_DIR_MARK` in string settings (a saved config's paths inside its run's folder) by this run's
    --output_dir."""
    output_dir = (getattr(args, "output_dir", None) or "").rstrip("/")

    def expanded(name: str, value: Any) -> Any:
        if isinstance(value, list):
            return [expanded(name, v) for v in value]
        if not isinstance(value, str) or OUTPUT_DIR_MARK not in value:
            return value
        if not output_dir:
            raise CoatiUsageError(f"--{name} {value}: a path inside the run's folder needs --output_dir")
        return value.replace(OUTPUT_DIR_MARK, output_dir)

    for name, value in list(vars(args).items()):
        setattr(args, name, expanded(name, value))


# ---- the run's own config --------------------------------------------------------------------------
NOT_SAVED = ("config", "config_file", "checkpoint_path", "save_path")
"""Settings a saved config leaves out: the file it was read from, ColossalChat's JSON copy of the flags, the
checkpoint this run resumed from (a rerun starts from scratch), and ColossalChat's --save_path (already in save_dir)."""

DECIDED_BY = {"num_episodes": "num_epochs"}
"""Settings a saved config leaves out while the setting beside them is set, which decides them as the run starts
(GRPO/PPO's episodes, from the passes over the prompts): the rerun decides them the same way."""


def resolved_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Dict[str, Any]:
    """Every setting of the run by its primary flag's name, as `--config` reads it back, grouped by the sections of
    the parser's run config (ColossalChat's own flags in `COLOSSALCHAT_SECTION`; flat without a run config): paths
    inside --output_dir are marked `OUTPUT_DIR_MARK`."""
    owners = section_owners(parser)
    output_dir = (getattr(args, "output_dir", None) or "").rstrip("/")
    config: Dict[str, Any] = {}
    for action in parser._actions:
        if not action.option_strings or action.help is argparse.SUPPRESS or action.dest in NOT_SAVED or \
                action.default is argparse.SUPPRESS or not hasattr(args, action.dest) or \
                getattr(args, DECIDED_BY.get(action.dest, ""), None):
            continue
        name = next(s for s in action.option_strings if s.startswith("--"))[2:]
        value = _plain(getattr(args, action.dest))
        if isinstance(value, dict) and action.nargs not in ("+", "*"):
            value = json.dumps(value)
        value = _marked(value, output_dir) if name != "output_dir" else value
        if owners:
            config.setdefault(owners.get(action.dest, COLOSSALCHAT_SECTION), {})[name] = value
        else:
            config[name] = value
    return _in_tree_order(config, owners)


def _in_tree_order(config: Dict[str, Any], owners: Dict[str, str]) -> Dict[str, Any]:
    """The sections of a saved config in the run config's order, ColossalChat's last."""
    order = list(dict.fromkeys([*owners.values(), COLOSSALCHAT_SECTION]))
    return {name: config[name] for name in order if name in config} if owners else config


def _plain(value: Any) -> Any:
    """A parsed value as YAML holds it: NAME=VALUE pairs as a mapping, tuples as lists, a function (a reward function
    of yours in a tree built in Python) by its `module:name`."""
    if callable(value) and not isinstance(value, type):
        return _importable_name(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str, dict)):
        return value
    return str(value)


def _importable_name(function: Any) -> str:
    """`module:name` of a function at the top level of its module, which the run imports by that name; another
    callable (a lambda, a closure, a partial) is refused in one line."""
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if module is None or getattr(sys.modules.get(module), name, None) is not function:
        raise CoatiUsageError(f"{function!r}: a function given in a run config is named by its module to be imported; "
                              "define it at the top level of a module (not a lambda, closure or partial)")
    return f"{module}:{name}"


def _marked(value: Any, output_dir: str) -> Any:
    if isinstance(value, list):
        return [_marked(v, output_dir) for v in value]
    if output_dir and isinstance(value, str) and (value == output_dir or value.startswith(output_dir + "/")):
        return OUTPUT_DIR_MARK + value[len(output_dir):]
    return value


def save_run_record(args: argparse.Namespace) -> Optional[Path]:
    """On rank 0, the run's settings (`save_run_config`) in --output_dir (else --save_dir; nowhere without either);
    returns the config's path there."""
    from coati.utils.comm import is_rank_0

    record = getattr(args, "_run_record", None)
    folder = getattr(args, "output_dir", None) or getattr(args, "save_dir", None)
    if record is None or not folder or not is_rank_0():
        return None
    return save_run_config(folder, record.config, record.sources, record.argv, record.command)


def save_run_config(folder: str, config: Dict[str, Any], sources: Dict[str, str], argv: Sequence[str],
                    command: str = "") -> Path:
    """`folder/run_config.yaml` (the settings, which `--config` reads back) and `folder/run_info.json` (where each
    came from, the command line, the versions); returns the config's path. The header's rerun line is
    `coati <command>` where the command is known (a run from Python too), else this script's."""
    import yaml

    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    rerun = f"coati {command}" if command else Path(sys.argv[0]).name
    header = ("# The resolved settings of this run; rerun it from scratch with\n"
              f"#   {rerun} --config {target / SAVED_CONFIG} --output_dir NEW_DIR\n")
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))   # on each node: the `coati` command launches as many
    launch = {"nproc_per_node": processes} if processes > 1 else {}
    (target / SAVED_CONFIG).write_text(header + yaml.safe_dump({**launch, **config}, sort_keys=False,
                                                               default_flow_style=False))
    info = {"command": [Path(sys.argv[0]).name, *argv], "sources": sources, "versions": _versions()}
    (target / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return target / SAVED_CONFIG


def _versions() -> Dict[str, Optional[str]]:
    from importlib.metadata import PackageNotFoundError, version

    found: Dict[str, Optional[str]] = {"python": sys.version.split()[0]}
    for package in ("coati", "colossalai", "torch", "transformers", "peft", "vllm"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found
