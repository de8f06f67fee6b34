"""Judges one test of an untrusted program inside the sandbox, so that the program cannot forge the verdict.

The sandbox runs this file as its program (standard library only, any Python 3.8+), with the request on stdin:
`{"source": program, "assert": test statements}` or `{"source": program, "stdin": input, "expected": output}`.
The harness keeps the request to itself (it refuses to be traced or read through `/proc`) and runs the program in a
child process of its own (`solution.py`, started fresh, so it holds nothing of the harness's memory):

- a stdin test: the child reads the input; the harness compares the child's stdout with the expected output (the
  child never sees it);
- an assert test: the child loads the program and answers calls over a pipe; the harness runs the test statements,
  each of the program's names standing for a proxy, so `f(2)` asks the child and comes back as plain data (None,
  bool, int, float, complex, str, bytes, and lists, tuples, dicts, sets of those: exact types, never a subclass).
  The comparison runs in the harness on that data, so no `__eq__` of the program's is ever called, and the values
  the test expects never reach the child.

The harness prints one JSON verdict line, `{"passed": bool}`, on its stdout (which the child does not have), copies
the end of the child's stderr to its own, and exits as the child did (same code or signal), so the sandbox names
the limit the program hit.
"""
import builtins
import ctypes
import json
import os
import signal
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

MAX_MESSAGE_BYTES = 8 << 20
"""The most one value may take on the pipe between harness and child."""
MAX_DEPTH = 64
STDERR_TAIL_BYTES = 4096
OUTPUT_SLACK_BYTES = 4096
"""How much more stdout than the expected output is read before a stdin test fails for writing too much."""
_PR_SET_DUMPABLE = 4


class Unserialisable(Exception):
    """A value that is not plain data (or too deep): it stays in the child and is used through a proxy."""


def encode(value: Any, depth: int = 0) -> list:
    """`value` as JSON-able tagged data, exact types only (a subclass of int or str is not plain data)."""
    if depth > MAX_DEPTH:
        raise Unserialisable("nested too deep")
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", format(value, "x")]   # hex: no digit limit, exact
    if kind is float:
        return ["f", value.hex()]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        return [{list: "l", tuple: "t", set: "S", frozenset: "F"}[kind], [encode(v, depth + 1) for v in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise Unserialisable(kind.__name__)


def decode(data: Any, depth: int = 0) -> Any:
    """The value `encode` gave `data` for; ValueError on anything else."""
    if depth > MAX_DEPTH or not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise ValueError("malformed value")
    tag, rest = data[0], data[1:]
    scalars = {"N": lambda: None, "b": lambda: bool(rest[0]), "i": lambda: int(rest[0], 16),
               "f": lambda: float.fromhex(rest[0]), "c": lambda: complex(float.fromhex(rest[0]), float.fromhex(rest[1])),
               "s": lambda: str(rest[0]), "y": lambda: bytes.fromhex(rest[0])}
    if tag in scalars:
        return scalars[tag]()
    if tag in ("l", "t", "S", "F"):
        items = [decode(v, depth + 1) for v in rest[0]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in rest[0]}
    raise ValueError(f"unknown tag {tag!r}")


def same_output(got: str, want: str) -> bool:
    """Equal output, trailing whitespace on each line and trailing blank lines ignored."""
    def lines(text: str) -> List[str]:
        return [line.rstrip() for line in str(text).rstrip().splitlines()]
    return lines(got) == lines(want)


# The child: the program, answering the harness's calls.

def serve(program: str, requests: int, replies: int) -> None:
    """Run `program` as `__main__`, then answer requests on fd `requests` with replies on fd `replies` until the
    harness closes its end. Values that are not plain data stay here, named by a handle."""
    with open(program) as f:
        source = f.read()
    namespace: Dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(source, "solution.py", "exec"), namespace)
    handles: List[Any] = []
    inbox, outbox = os.fdopen(requests, "rb"), os.fdopen(replies, "wb")

    def reply(value: Any) -> list:
        try:
            return ["value", encode(value)]
        except Unserialisable:
            handles.append(value)
            return ["handle", len(handles) - 1]

    def argument(data: list) -> Any:
        return handles[data[1]] if data[0] == "h" else decode(data)

    for line in inbox:
        op, *args = json.loads(line)
        try:
            if op == "global":
                answer = reply(namespace[args[0]]) if args[0] in namespace else ["error", "NameError", args[0]]
            elif op == "getattr":
                answer = reply(getattr(handles[args[0]], args[1]))
            elif op == "getitem":
                answer = reply(handles[args[0]][argument(args[1])])
            elif op == "list":
                answer = reply(list(handles[args[0]]))
            else:
                answer = reply(handles[args[0]](*[argument(a) for a in args[1]],
                                                **{k: argument(v) for k, v in args[2].items()}))
        except Exception as error:
            answer = ["error", type(error).__name__, str(error)[:200]]
        outbox.write(json.dumps(answer).encode() + b"\n")
        outbox.flush()


# The harness: asks the child, compares, reports.

class RemoteError(Exception):
    """The program raised an exception that is not a built-in one, or broke the protocol."""


class Remote:
    """A value of the program's that is not plain data (a function, a class, an object): every use asks the child."""

    def __init__(self, channel: "Channel", handle: int) -> None:
        self._channel, self._handle = channel, handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.ask("call", self._handle, [self._channel.argument(a) for a in args],
                                 {k: self._channel.argument(v) for k, v in kwargs.items()})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._channel.ask("getattr", self._handle, name)

    def __getitem__(self, key: Any) -> Any:
        return self._channel.ask("getitem", self._handle, self._channel.argument(key))

    def __iter__(self):
        return iter(self._channel.ask("list", self._handle))


class Channel:
    """The harness's end of the pipe to the child."""

    def __init__(self, requests, replies) -> None:
        self._requests, self._replies = requests, replies

    def argument(self, value: Any) -> list:
        return ["h", value._handle] if isinstance(value, Remote) else encode(value)

    def ask(self, *request: Any) -> Any:
        try:
            self._requests.write(json.dumps(request).encode() + b"\n")
            self._requests.flush()
        except OSError:
            raise RemoteError("the program ended") from None
        line = self._replies.readline(MAX_MESSAGE_BYTES)
        if not line.endswith(b"\n"):
            raise RemoteError("the program ended or answered too much")
        kind, *rest = json.loads(line)
        if kind == "value":
            return decode(rest[0])
        if kind == "handle":
            return Remote(self, int(rest[0]))
        error = getattr(builtins, str(rest[0]), None)
        if isinstance(error, type) and issubclass(error, Exception):
            raise error(str(rest[1]))
        raise RemoteError(f"{rest[0]}: {rest[1]}")


class ProgramNames(dict):
    """The test's globals: a built-in or a standard module where the name is one, else the program's value."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(__builtins__=builtins)
        self._channel = channel

    def __missing__(self, name: str) -> Any:
        if hasattr(builtins, name):
            return getattr(builtins, name)
        if name in getattr(sys, "stdlib_module_names", ()):
            value = __import__(name)
        else:
            value = self._channel.ask("global", name)
        self[name] = value
        return value


def _child_stderr(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - STDERR_TAIL_BYTES))
        return f.read().decode(errors="replace")


def _start(argv: List[str], stdin: Any, stdout: Any, pass_fds: Tuple[int, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-I", *argv], stdin=stdin, stdout=stdout, stderr=open(".child-stderr", "wb"),
                            pass_fds=pass_fds, close_fds=True)


def judge_asserts(statements: str) -> Tuple[bool, subprocess.Popen]:
    """Run the test statements against the program in a child; True when they all hold."""
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    child = _start([__file__, "--serve", "solution.py", str(requests_read), str(replies_write)], subprocess.DEVNULL,
                   subprocess.DEVNULL, pass_fds=(requests_read, replies_write))
    os.close(requests_read)
    os.close(replies_write)
    channel = Channel(os.fdopen(requests_write, "wb"), os.fdopen(replies_read, "rb"))
    try:
        exec(compile(statements, "<test>", "exec"), ProgramNames(channel))
        passed = True
    except Exception:
        passed = False
    for stream in (channel._requests, channel._replies):
        try:
            stream.close()
        except OSError:
            pass
    child.wait()
    return passed, child


def judge_stdin(given: str, expected: str) -> Tuple[bool, subprocess.Popen]:
    """Run the program on `given`; True when its stdout is the expected output."""
    with open(".child-stdin", "wb") as f:
        f.write(given.encode())
    with open(".child-stdin", "rb") as stdin, open(".child-stdout", "wb") as stdout:
        child = _start(["solution.py"], stdin, stdout)
        child.wait()
    bound = len(expected.encode()) + OUTPUT_SLACK_BYTES
    with open(".child-stdout", "rb") as f:
        output = f.read(bound + 1)
    return len(output) <= bound and same_output(output.decode(errors="replace"), expected), child


def _refuse_tracing() -> None:
    """Nobody of the same user may read this process's memory or descriptors (ptrace, /proc/PID/mem, /fd)."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _end_as(child: subprocess.Popen) -> None:
    """Exit as the child did: its code, or its signal."""
    if child.returncode >= 0:
        os._exit(child.returncode)
    signal.signal(-child.returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -child.returncode)
    os._exit(128 - child.returncode)


def main(argv: List[str]) -> None:
    if argv[:1] == ["--serve"]:
        serve(argv[1], int(argv[2]), int(argv[3]))
        return
    _refuse_tracing()
    request: Dict[str, Optional[str]] = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    with open("solution.py", "w") as f:
        f.write(request["source"])
    if "assert" in request:
        passed, child = judge_asserts(request["assert"])
    else:
        passed, child = judge_stdin(request["stdin"], request["expected"])
    sys.stdout.write(json.dumps({"passed": passed}) + "\n")
    sys.stdout.flush()
    sys.stderr.write(_child_stderr(".child-stderr"))
    sys.stderr.flush()
    _end_as(child)


if __name__ == "__main__":
    main(sys.argv[1:])
