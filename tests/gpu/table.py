"""The GPU check's results as one table: a row per check (trainer, or trainer and feature), a column per plugin, each
cell `pass`, `FAIL` or `skip` with its seconds. Reads the JUnit XML that `check.sh` has pytest write; standard library
only, since it runs under the GPU machine's own Python.

    python3 tests/gpu/table.py output/gpu_check/junit.xml
"""
import re
import sys
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Tuple

PLUGINS = ("ddp", "zero2", "zero2_cpu", "gemini", "gemini_auto", "3d")
CHECKS = {"test_trainer_on_plugin_trains_checkpoints_exports_and_resumes": "",
          "test_packed_grpo_on_plugin_trains": "grpo, packed",
          "test_lora_on_plugin_trains_and_exports_the_adapter": "LoRA",
          "test_vision_trainer_on_plugin_trains_and_resumes": "images",
          "test_vision_grpo_on_plugin_trains": "grpo, images"}
"""Test function -> what its row says beside its parameters ("" for the plain trainer runs)."""


def outcome(case: ElementTree.Element) -> str:
    """`pass`, `FAIL` or `skip`, with the case's seconds."""
    if case.find("failure") is not None or case.find("error") is not None:
        status = "FAIL"
    elif case.find("skipped") is not None:
        status = "skip"
    else:
        status = "pass"
    return f"{status} {float(case.get('time', 0)):.0f}s"


def cells(junit: str) -> Dict[str, Dict[str, str]]:
    """Row -> plugin -> outcome, for every test case of `junit` that runs on a plugin."""
    table: Dict[str, Dict[str, str]] = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        match = re.fullmatch(r"(\w+)\[(.+)\]", case.get("name", ""))
        if not match:
            continue
        function, params = match.group(1), match.group(2).split("-")
        plugin = next((p for p in params if p in PLUGINS), None)
        if plugin is None:
            continue
        what = [p for p in params if p != plugin] + [CHECKS.get(function, function)]
        table.setdefault(", ".join(w for w in what if w), {})[plugin] = outcome(case)
    return table


def markdown(table: Dict[str, Dict[str, str]]) -> List[str]:
    rows: List[Tuple[str, Dict[str, str]]] = sorted(table.items())
    lines = ["| check | " + " | ".join(PLUGINS) + " |", "|---" * (len(PLUGINS) + 1) + "|"]
    lines += [f"| {row} | " + " | ".join(found.get(p, "") for p in PLUGINS) + " |" for row, found in rows]
    counts = [cell.split()[0] for found in table.values() for cell in found.values()]
    return lines + [f"{counts.count('pass')} pass, {counts.count('FAIL')} FAIL, {counts.count('skip')} skip"]


if __name__ == "__main__":
    print("\n".join(markdown(cells(sys.argv[1]))))
