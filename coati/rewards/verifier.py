"""Symbolic answer checking with Hugging Face's `math-verify`, in worker processes with a timeout per check.

math-verify's own timeout uses SIGALRM, which only works on the main thread, and a check that hangs in sympy's C
code holds the GIL, so no thread can time it out. Each check therefore runs in a worker process (this file run as
an isolated script, `python -I`, so its own folder, with `math.py`, is not on the path: it imports math-verify and
nothing of coati or torch, and starts in about a second); a worker
that overruns is killed and replaced, and its check reported as a timeout. Any thread may call `check`.
Workers talk JSON lines over their stdin and stdout, and end when their stdin closes (their parent ended).
"""
import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence, Tuple

MATCH, MISMATCH, TIMEOUT, ERROR = "match", "mismatch", "timeout", "error"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_WORKERS = 2
START_TIMEOUT_S = 60.0
"""A worker must have imported math-verify (and said it is ready) within this."""
READY = "ready"


def _latex(text: str) -> str:
    """`text` as math-verify reads an answer: in $...$ unless it already carries its delimiters or a box."""
    stripped = text.strip()
    return stripped if stripped.startswith("$") or "\\boxed" in stripped else f"${stripped}$"


def verify_pair(gold: str, answer: str) -> str:
    """MATCH or MISMATCH of `answer` against `gold` by math-verify, with no timeout of its own (run it in a worker);
    MISMATCH when either side parses to nothing."""
    from math_verify import parse, verify

    parsed_gold = parse(_latex(gold), parsing_timeout=None)
    parsed = parse(_latex(answer), parsing_timeout=None)
    if not parsed_gold or not parsed:
        return MISMATCH
    return MATCH if verify(parsed_gold, parsed, timeout_seconds=None) else MISMATCH


def serve() -> None:
    """A worker: one JSON [gold, answer] per stdin line, one JSON outcome per stdout line, until stdin closes."""
    import importlib
    import logging

    importlib.import_module("math_verify")   # loaded before saying ready, so a check's timeout counts only the check
    logging.disable(logging.WARNING)   # math-verify warns on every call that its own timeout is off
    verify_pair("\\frac{1}{2}", "x=0.5")   # the LaTeX parser and sympy load on a first check: not in its timeout
    sys.stdout.write(json.dumps(READY) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            outcome = verify_pair(*json.loads(line))
        except Exception:   # a parse or comparison math-verify cannot do
            outcome = ERROR
        sys.stdout.write(json.dumps(outcome) + "\n")
        sys.stdout.flush()


class _Worker:
    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.ready = False

    def _read(self, timeout_s: float) -> Optional[str]:
        """The worker's next message, or None when none came within `timeout_s` or the worker died."""
        try:
            readable, _, _ = select.select([self.process.stdout], [], [], timeout_s)
            line = self.process.stdout.readline() if readable else ""
        except (OSError, ValueError):
            line = ""
        return json.loads(line) if line else None

    def ask(self, gold: str, answer: str, timeout_s: float) -> Optional[str]:
        """The outcome, or None when the worker overran `timeout_s` (it is then killed) or died."""
        if not self.ready:
            self.ready = self._read(START_TIMEOUT_S) == READY
        outcome = None
        if self.ready:
            try:
                self.process.stdin.write(json.dumps([gold, answer]) + "\n")
                self.process.stdin.flush()
                outcome = self._read(timeout_s)
            except (BrokenPipeError, OSError, ValueError):
                outcome = None
        if outcome is None:
            self.kill()
        return outcome

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class MathVerifier:
    """`workers` processes checking answers with math-verify, `timeout_s` seconds per check. `check(pairs)` returns
    MATCH, MISMATCH, TIMEOUT or ERROR for each (gold, answer) pair, checking up to `workers` at once."""

    def __init__(self, workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._idle: "queue.Queue[_Worker]" = queue.Queue()
        for _ in range(workers):
            self._idle.put(_Worker())
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="math-verify")

    def check(self, pairs: Sequence[Tuple[str, str]]) -> List[str]:
        return list(self._threads.map(lambda pair: self._check_one(*pair), pairs))

    def _check_one(self, gold: str, answer: str) -> str:
        worker = self._idle.get()
        outcome = worker.ask(gold, answer, self.timeout_s)
        self._idle.put(worker if outcome is not None else _Worker())
        return outcome if outcome is not None else TIMEOUT

    def close(self) -> None:
        self._threads.shutdown(wait=False)
        while not self._idle.empty():
            self._idle.get().kill()


_shared: Optional[MathVerifier] = None
_shared_lock = threading.Lock()


def shared_verifier() -> MathVerifier:
    """This process's verifier, started on first use and stopped at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathVerifier()
            atexit.register(_shared.close)
        return _shared


if __name__ == "__main__":
    serve()
