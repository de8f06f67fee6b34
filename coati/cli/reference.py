"""The settings reference, generated from the code: every flag of every `coati` command (its aliases, default, range
or choices, help and section), every registry's parts (what each does, its options) and every logged metric, as the
Markdown pages of
`docs/reference/`. `python -m coati.cli.reference docs/reference` writes them; a test fails when they are stale.
"""
import argparse
import sys
from pathlib import Path
from typing import Dict, List

from coati.cli.commands import COMMANDS, command_parser
from coati.run_config import sections

INTRO = ("Generated from the code by `python -m coati.cli.reference docs/reference`; a test fails when this page "
         "and the code disagree. A config file's keys are these flags without their dashes, at the top level (as TRL's "
         "recipes write them) or under the section named beside each heading (as a run saves its run_config.yaml).")


def _cell(text: str) -> str:
    """`text` as one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(action: argparse.Action) -> str:
    """The flag's default as the command line writes it ('' for none, `switch` for a flag that takes no value)."""
    if action.nargs == 0:
        return "switch"
    if action.default in (None, argparse.SUPPRESS) or action.default == []:
        return "required" if action.required else ""
    value = action.default
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _accepts(action: argparse.Action) -> str:
    """Its range (`>= 1`) or choices, where the parser checks one."""
    if action.choices:
        return ", ".join(map(str, action.choices))
    return getattr(action.type, "wanted", "") or ""


def _rows(parser: argparse.ArgumentParser) -> Dict[str, List[str]]:
    """The table rows of each `--help` section, by section title."""
    sections: Dict[str, List[str]] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            if not action.option_strings or action.help is argparse.SUPPRESS or "--help" in action.option_strings:
                continue
            flags = [flag for flag in action.option_strings if flag.startswith("--")]
            name = f"`{flags[0]}`" + (f" ({', '.join(f'`{f}`' for f in flags[1:])})" if flags[1:] else "")
            sections.setdefault(group.title or "options", []).append(
                f"| {name} | {_cell(_value(action))} | {_cell(_accepts(action))} | {_cell(action.help or '')} |")
    return sections


def command_page(name: str) -> str:
    """The reference page of `coati <name>`: one table per section of its run config (headed by the section's key in
    a config file), then ColossalChat's and TRL's names."""
    parser = command_parser(name)
    tree = getattr(parser, "run_config", None)
    keys = {shown.title: key for key, _, shown in sections(tree)} if tree is not None else {}
    lines = [f"# coati {name}", "", _cell(parser.description or ""), "", INTRO, ""]
    for title, rows in _rows(parser).items():
        key = f" (`{keys[title]}:`)" if title in keys else ""
        lines += [f"## {title[0].upper()}{title[1:]}{key}", "", "| flag | default | accepts | meaning |",
                  "|---|---|---|---|", *rows, ""]
    return "\n".join(lines)


def registries_page() -> str:
    """Every registry's parts: name, what it does, the options it takes."""
    from coati.utils import registry

    lines = ["# Registries", "", "The parts a flag picks by name; each flag also takes your own as "
             "`package.module:function` (see [Adding an algorithm](../concepts/algorithms.md)).", "", INTRO, ""]
    for table in (value for value in vars(registry).values() if isinstance(value, registry.Registry)):
        lines += [f"## {table.kind[0].upper()}{table.kind[1:]}", "", "| name | what it does | options |", "|---|---|---|"]
        for name in table.names():
            entry = table._entries[name]
            options = ", ".join(entry.options) if entry.options else "none" if entry.options is not None else "any"
            lines.append(f"| `{name}` | {_cell(entry.help)} | {options} |")
        lines += [f"| *yours* | `{table.own}` | its `options` attribute |", ""]
    return "\n".join(lines)


def metrics_page() -> str:
    """Every logged metric of the catalogue (`coati.trainer.metric_names`)."""
    from coati.trainer.metric_names import CATALOGUE

    lines = ["# Logged metrics", "", "What the trainers log to TensorBoard, W&B and `metrics.jsonl` (`<...>` stands for one "
             "part of the name). The tests check the names real runs log against this catalogue.", "", INTRO, "",
             "| name | meaning | logged by |", "|---|---|---|"]
    lines += [f"| `{metric.pattern}` | {_cell(metric.meaning)} | {_cell(metric.logged_by)} |" for metric in CATALOGUE]
    return "\n".join(lines) + "\n"


def pages() -> Dict[str, str]:
    """File name -> content of every reference page."""
    return {**{f"{name}.md": command_page(name) for name in COMMANDS}, "registries.md": registries_page(),
            "metrics.md": metrics_page()}


def write(folder: str) -> None:
    """Write `pages()` into `folder`, replacing what is there."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.md"):
        stale.unlink()
    written = pages()
    for name, text in written.items():
        (out / name).write_text(text)
    print(f"wrote {len(written)} reference pages to {out}")


if __name__ == "__main__":
    write(sys.argv[1] if len(sys.argv) > 1 else "docs/reference")
