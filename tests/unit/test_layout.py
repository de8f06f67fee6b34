"""The package layout the code map (docs/concepts/algorithms.md) describes: coati's subpackages import one another in one direction only
(no cycle), the scripts' set-up (`coati.cli`) is imported by nothing else in coati, and ColossalChat's own names
(`coati.compat`) sit over the core they adapt: the core reaches them only by name, on first use (`coati.models.DpoLoss`),
but for the callbacks' base, which fires ColossalChat's hook names."""
import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, Set

from conftest import REPO

PACKAGE = REPO / "coati"


def _imported_modules(path: Path, module: str) -> Set[str]:
    """The coati modules `path` imports, at any level of the file, relative imports resolved."""
    found = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            found.add(".".join(base + ([node.module] if node.module else [])))
    return {name for name in found if name.split(".")[0] == "coati"}


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_graph() -> Dict[str, Set[str]]:
    """coati subpackage -> the other subpackages its files import."""
    edges: Dict[str, Set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        source = _subpackage(module)
        for name in _imported_modules(path, module):
            if _subpackage(name) not in ("", source):
                edges[source].add(_subpackage(name))
    return edges


def test_subpackages_import_each_other_in_one_direction_only():
    graph = package_graph()
    done: Set[str] = set()

    def visit(node: str, path: tuple) -> None:
        assert node not in path, f"import cycle: {' -> '.join(path + (node,))}"
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + (node,))
        done.add(node)

    for node in sorted(graph):
        visit(node, ())
    assert graph["compat"] <= {"models", "utils"}                  # ColossalChat's names, over the core they adapt
    assert [source for source, targets in graph.items() if "compat" in targets] == ["trainer"]   # its hook names
    assert graph["utils"] == set()                                  # the bottom layer
    assert not [source for source, targets in graph.items() if "cli" in targets]


MAX_ARGUMENTS = 10
PUBLISHED_SIGNATURES = {"save_checkpoint", "load_checkpoint", "RewardModelTrainer", "__init__", "HybridParallelPlugin"}
"""Calls that may pass more: the checkpoint functions and trainers ColossalChat's users call with theirs (a
`RewardModelTrainer` subclass's `super().__init__` among them), and colossalai's plugin."""


def _long_calls() -> Set[tuple]:
    """(file, callee) of every call in coati/ passing more than MAX_ARGUMENTS positional and named arguments."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and len(node.args) + sum(k.arg is not None for k in node.keywords) > MAX_ARGUMENTS:
                callee = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "?")
                found.add((path.relative_to(REPO).as_posix(), callee))
    return found


def test_no_call_of_ours_passes_a_dozen_loose_arguments():
    """A part takes its settings section (`LLMJudge.from_settings`, `VLLMConfig.from_settings`, PPO's `CriticParts`,
    `SupervisedConfig`) or its parts (a maker takes one `Scorer`), not a dozen scalars read off the flags."""
    long_calls = {(path, callee) for path, callee in _long_calls() if callee not in PUBLISHED_SIGNATURES}
    assert not long_calls, sorted(long_calls)


def test_no_test_file_imports_another():
    """Helpers several test files use live in `tests/support.py` (or `conftest.py`), never in a test file."""
    offenders = []
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(REPO)} imports {name}" for name in names if name.startswith("test_")]
    assert not offenders, offenders
