"""A verifiable reward for code: the completion's program is run against the prompt row's tests in the sandbox.

A row carries its tests in one of two forms (ColossalChat's PRIME-style data, and function-style tasks):
- `test_cases`: `{"inputs": [...], "outputs": [...]}` (or that as a JSON string): the program reads each input on
  stdin and passes when its stdout equals the output (trailing whitespace on each line and trailing blank lines
  ignored);
- `tests`: assert statements (a list of strings, or one string of statements): each test is run against a fresh
  run of the program, and passes when its statements hold.

Each test is judged inside the sandbox by `harness.py`, in a process apart from the program's: the program never
sees the expected output or the test, cannot write the verdict, and its values reach the comparison as plain data
(so an object whose `__eq__` always says True passes nothing).
"""
import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import harness
from .output import RewardOutput
from .sandbox import AUTO, LIMITS, OK, RunResult, SandboxLimits, shared_sandbox

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.S)
_PYTHON_LABELS = ("python", "py", "python3", "")


def extract_code(completion: str) -> Optional[str]:
    """The last complete fenced code block labelled Python (or not labelled); None when there is none."""
    blocks = [body for label, body in _FENCE.findall(completion) if label.lower() in _PYTHON_LABELS]
    return blocks[-1] if blocks else None


def _assert_tests(tests: Any) -> List[str]:
    """Each test statement: list items as they are, a string split into its top-level statements."""
    if isinstance(tests, str):
        return [ast.get_source_segment(tests, node) for node in ast.parse(tests).body]
    return [str(test) for test in tests]


def _stdio_cases(cases: Any) -> List[Tuple[str, str]]:
    if isinstance(cases, str):
        cases = json.loads(cases)
    inputs, outputs = cases["inputs"], cases["outputs"]
    if len(inputs) != len(outputs):
        raise ValueError(f"test_cases has {len(inputs)} inputs but {len(outputs)} outputs")
    return [(str(i), str(o)) for i, o in zip(inputs, outputs)]


_HARNESS = Path(harness.__file__).read_text()


def _passed(result: RunResult) -> bool:
    """The harness's verdict on one test: its last stdout line, which the program cannot write."""
    if result.status != OK:
        return False
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])["passed"] is True
    except (IndexError, ValueError, KeyError, TypeError):
        return False


def _requests(code: str, test_cases: Any, tests: Any) -> List[str]:
    """The harness's request (its stdin) for each of one row's tests."""
    if test_cases:
        return [json.dumps({"source": code, "stdin": given, "expected": out}) for given, out in _stdio_cases(test_cases)]
    if tests:
        return [json.dumps({"source": code, "assert": test}) for test in _assert_tests(tests)]
    raise ValueError("a row has neither test_cases nor tests")


@dataclass(frozen=True)
class CodeTests:
    """The reward `code_tests`: the fraction of a row's tests the completion's code passes (`all_or_nothing`: 1.0
    only when it passes them all), run in a `Sandbox` with `limits`, `workers` runs at once. Diagnostics, logged
    as `rewards/code_tests/<name>`: `pass_rate`, `no_code` (no code block), and for each limit (`wall_time`,
    `cpu_time`, `memory`, `processes`, `file_size`) whether one of the completion's runs was stopped by it."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    workers: int = 0
    all_or_nothing: bool = False
    backend: str = AUTO

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], test_cases: Optional[Sequence[Any]] = None,
                 tests: Optional[Sequence[Any]] = None, **_: object) -> RewardOutput:
        rows = len(completions)
        test_cases, tests = test_cases or [None] * rows, tests or [None] * rows
        codes = [extract_code(c) for c in completions]
        per_row = [_requests(code, cases, row_tests) if code is not None else []
                   for code, cases, row_tests in zip(codes, test_cases, tests)]
        sandbox = shared_sandbox(self.limits, self.workers, self.backend)
        results = sandbox.run_many([(_HARNESS, request) for requests in per_row for request in requests])
        rates, hits, start = [], {limit: [] for limit in LIMITS}, 0
        for requests in per_row:
            ran = results[start:start + len(requests)]
            start += len(requests)
            rates.append(sum(map(_passed, ran)) / len(requests) if requests else 0.0)
            for limit in LIMITS:
                hits[limit].append(float(any(r.limit == limit for r in ran)))
        values = [float(rate == 1.0) for rate in rates] if self.all_or_nothing else rates
        diagnostics: Dict[str, List[float]] = {"pass_rate": rates, "no_code": [float(c is None) for c in codes], **hits}
        return RewardOutput(values, diagnostics)


code_tests = CodeTests()
