"""A verifiable reward for code: the completion's program is run against the prompt row's tests in the sandbox.

A row carries its tests in one of two forms (ColossalChat's PRIME-style data, and function-style tasks):
- `test_cases`: `{"inputs": [...], "outputs": [...]}` (or that as a JSON string): the program reads each input on
  stdin and passes when its stdout equals the output (trailing whitespace on each line and trailing blank lines
  ignored);
- `tests`: assert statements (a list of strings, or one string of statements): the program is run once per test
  with the test after it, and passes when the run reaches its end (an early `sys.exit(0)` does not count).
"""
import ast
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .output import RewardOutput
from .sandbox import LIMITS, OK, RunResult, SandboxLimits, shared_sandbox

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.S)
_PYTHON_LABELS = ("python", "py", "python3", "")


def extract_code(completion: str) -> Optional[str]:
    """The last complete fenced code block labelled Python (or not labelled); None when there is none."""
    blocks = [body for label, body in _FENCE.findall(completion) if label.lower() in _PYTHON_LABELS]
    return blocks[-1] if blocks else None


def _same_output(got: str, want: str) -> bool:
    def lines(text: str) -> List[str]:
        return [line.rstrip() for line in str(text).rstrip().splitlines()]
    return lines(got) == lines(want)


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


@dataclass(frozen=True)
class _Job:
    """One sandbox run and how to judge it."""

    source: str
    stdin: str
    expected: Optional[str] = None
    token: Optional[str] = None

    def passed(self, result: RunResult) -> bool:
        if result.status != OK:
            return False
        if self.token is not None:
            return result.stdout.rstrip().endswith(self.token)
        return _same_output(result.stdout, self.expected)


def _jobs(code: str, test_cases: Any, tests: Any) -> List[_Job]:
    """The runs that check `code` against one row's tests."""
    if test_cases:
        return [_Job(code, stdin, expected=out) for stdin, out in _stdio_cases(test_cases)]
    if tests:
        jobs = []
        for test in _assert_tests(tests):
            token = secrets.token_hex(8)
            jobs.append(_Job(f"{code}\n\n{test}\nprint({token!r})\n", "", token=token))
        return jobs
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

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], test_cases: Optional[Sequence[Any]] = None,
                 tests: Optional[Sequence[Any]] = None, **_: object) -> RewardOutput:
        rows = len(completions)
        test_cases, tests = test_cases or [None] * rows, tests or [None] * rows
        codes = [extract_code(c) for c in completions]
        per_row = [_jobs(code, cases, row_tests) if code is not None else []
                   for code, cases, row_tests in zip(codes, test_cases, tests)]
        flat = [job for jobs in per_row for job in jobs]
        results = shared_sandbox(self.limits, self.workers).run_many([(job.source, job.stdin) for job in flat])
        rates, hits, start = [], {limit: [] for limit in LIMITS}, 0
        for jobs in per_row:
            ran = results[start:start + len(jobs)]
            start += len(jobs)
            rates.append(sum(job.passed(r) for job, r in zip(jobs, ran)) / len(jobs) if jobs else 0.0)
            for limit in LIMITS:
                hits[limit].append(float(any(r.limit == limit for r in ran)))
        values = [float(rate == 1.0) for rate in rates] if self.all_or_nothing else rates
        diagnostics: Dict[str, List[float]] = {"pass_rate": rates, "no_code": [float(c is None) for c in codes], **hits}
        return RewardOutput(values, diagnostics)


code_tests = CodeTests()
