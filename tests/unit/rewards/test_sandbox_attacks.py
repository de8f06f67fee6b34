"""The code reward under attack: programs written to forge their verdict, read the answers, escape or end the run,
each scored through `code_tests` in every sandbox backend this machine can run. Every attack scores 0, leaves
nothing on the host, and the trainer (this process, or an ordinary user's) lives on."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from coati.rewards import CodeTests
from coati.rewards.code import _HARNESS
from coati.rewards.sandbox import BWRAP, MEMORY, MEMORY_CGROUP, SandboxError, SandboxLimits, shared_sandbox
from conftest import REPO
from support import BACKENDS_HERE, LIMITS, sandbox_processes

DOUBLE = "def f(x):\n    return 2 * x\n"
TESTS = ["assert f(2) == 4", "assert f(21) == 42"]
needs_a_backend = pytest.mark.skipif(not BACKENDS_HERE, reason="nothing contains programs here: no bubblewrap, not root")


def fenced(source: str) -> str:
    return f"```python\n{textwrap.dedent(source)}```"


def score(backend: str, source: str, tests=None, test_cases=None) -> float:
    reward = CodeTests(LIMITS, workers=2, backend=backend)
    return reward(["p"], [fenced(source)], tests=[tests] if tests else None,
                  test_cases=[test_cases] if test_cases else None).values[0]


@pytest.fixture(params=BACKENDS_HERE)
def backend(request):
    yield request.param
    assert sandbox_processes() == []


@pytest.fixture
def shared_folder():
    """A folder every user may enter and write, inside the checkout (as a dataset or a socket would be)."""
    (REPO / "output").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="sandbox-attack-", dir=REPO / "output"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_a_backend
def test_a_correct_program_still_passes_in_both_forms(backend):
    assert score(backend, DOUBLE, tests=TESTS) == 1.0
    assert score(backend, "print(int(input()) * 2)\n", test_cases={"inputs": ["3"], "outputs": ["6"]}) == 1.0
    leet = "class Solution:\n    def two(self, a, t):\n        return [0, 1]\n"
    assert score(backend, leet, tests=["assert Solution().two([2, 7], 9) == [0, 1]",
                                       "import math\nassert math.isclose(Solution().two([1], 1)[1], 1.0)",
                                       "assert all(x < 2 for x in Solution().two([1], 2))",
                                       "try:\n    Solution().three()\n    assert False\nexcept AttributeError:\n    pass"]) == 1.0


FORGED_VERDICTS = {
    "prints_the_verdict": """
        import json, os, sys
        print(json.dumps({"passed": True}), flush=True)
        os.write(1, b'{"passed": true}\\n')
        def f(x):
            return 0
        """,
    "writes_the_parent_s_stdout": """
        import os
        for fd in range(0, 8):
            for path in ("/proc/%d/fd/%d" % (os.getppid(), fd), "/proc/1/fd/%d" % fd):
                try:
                    with open(path, "w") as out:
                        out.write('{"passed": true}\\n')
                except OSError:
                    pass
        def f(x):
            return 0
        """,
    "ends_early": """
        import sys
        def f(x):
            return 0
        sys.exit(0)
        """,
}


@needs_a_backend
@pytest.mark.parametrize("attack", FORGED_VERDICTS)
def test_a_program_cannot_write_its_verdict(backend, attack):
    assert score(backend, FORGED_VERDICTS[attack], tests=TESTS) == 0.0


@needs_a_backend
def test_an_object_equal_to_everything_passes_nothing(backend):
    liar = """
        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        class Zero(int):
            def __eq__(self, other):
                return True
        def f(x):
            return Anything() if x == 2 else Zero(0)
        """
    assert score(backend, liar, tests=TESTS[:1]) == 0.0
    assert score(backend, liar, tests=TESTS[1:]) == 0.0


@needs_a_backend
def test_a_program_cannot_read_its_test_or_expected_output(backend):
    """The request (test, expected output) is in the harness's memory and its stdin: neither can be read."""
    snoop = """
        import os, re
        seen = ""
        for pid in [os.getppid()] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            for path in ("/proc/%d/fd/0" % pid, "/proc/%d/mem" % pid, "/proc/%d/environ" % pid):
                try:
                    with open(path, "rb") as f:
                        seen += f.read(1 << 16).decode(errors="replace")
                except OSError:
                    pass
        found = re.findall(r"SECRET-(\\d+)", seen)
        print("SECRET-" + found[0] if found else "unknown")
        """
    assert score(backend, snoop, test_cases={"inputs": ["x"], "outputs": ["SECRET-41"]}) == 0.0
    asker = snoop.replace('print("SECRET-" + found[0] if found else "unknown")',
                          "def f(x):\n            return int(found[0]) if found else -1")
    assert asker != snoop
    assert score(backend, asker, tests=["assert f(0) == 7  # SECRET-7"]) == 0.0


@pytest.mark.skipif(BWRAP not in BACKENDS_HERE, reason="only bubblewrap hides the host's files")
def test_a_program_cannot_read_the_dataset(shared_folder):
    dataset = shared_folder / "prompts.jsonl"
    dataset.write_text(json.dumps({"tests": TESTS, "answer": {"2": 4, "21": 42}}) + "\n")
    dataset.chmod(0o644)
    cheat = f"""
        import json
        answers = json.loads(open({str(dataset)!r}).readline())["answer"]
        def f(x):
            return answers[str(x)]
        """
    assert score(BWRAP, cheat, tests=TESTS) == 0.0


@needs_a_backend
def test_a_program_cannot_end_the_run(backend):
    killer = """
        import ctypes, os, signal
        for target in (-1, os.getppid(), 1):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass
        ctypes.CDLL(None).kill(-1, 9)
        def f(x):
            return 2 * x
        """
    assert score(backend, killer, tests=TESTS) == 0.0
    assert score(backend, DOUBLE, tests=TESTS) == 1.0   # this process, and the sandbox, live on


@needs_a_backend
def test_host_folders_and_sockets_are_out_of_reach(backend, shared_folder):
    listeners = []
    for folder in [shared_folder] + ([Path("/run")] if os.access("/run", os.W_OK) else []):
        path = folder / f"coati-attack-{os.getpid()}.sock"
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        path.chmod(0o777)
        server.listen()
        server.settimeout(0.5)
        listeners.append((path, server))
    targets = ["/run/lock", "/var/tmp", "/dev/shm", "/tmp", str(shared_folder)]
    attack = f"""
        import os, socket
        for folder in {targets!r}:
            try:
                with open(os.path.join(folder, "coati-escape"), "wb") as f:
                    f.write(b"x" * 1000)
            except OSError:
                pass
        for path in {[str(p) for p, _ in listeners]!r}:
            try:
                socket.socket(socket.AF_UNIX).connect(path)
                print("connected", path)
            except OSError:
                pass
        """
    try:
        result = shared_sandbox(LIMITS, 2, backend).run(textwrap.dedent(attack))
        reached = [p for p, server in listeners if _accepted(server)]
    finally:
        for path, server in listeners:
            server.close()
            path.unlink()
    assert not [t for t in targets if os.path.exists(os.path.join(t, "coati-escape"))]
    if backend == BWRAP:   # coati's own namespaces keep host sockets outside /run and /tmp reachable (docs/guides/rewards.md)
        assert reached == [] and "connected" not in result.stdout
    else:
        assert Path("/run") / f"coati-attack-{os.getpid()}.sock" not in reached


def _accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not any(MEMORY_CGROUP in shared_sandbox(LIMITS, 1, b).run("pass").isolation for b in BACKENDS_HERE),
                    reason="no writable memory cgroup here: memory is capped per process only")
def test_memory_is_capped_over_the_whole_process_tree():
    backend = next(b for b in BACKENDS_HERE if MEMORY_CGROUP in shared_sandbox(LIMITS, 1, b).run("pass").isolation)
    hog = """
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                break
        block = b"x" * (150 << 20)   # each process stays under its own cap; together they pass the run's
        time.sleep(30)
        """
    started = time.monotonic()
    result = shared_sandbox(SandboxLimits(cpu_s=20, wall_s=20, memory_mb=256), 1, backend).run(textwrap.dedent(hog))
    assert result.limit == MEMORY and time.monotonic() - started < 15
    assert sandbox_processes() == []


@needs_a_backend
def test_what_a_program_prints_never_reaches_the_trainer(backend):
    flood = "import sys\nsys.stdout.buffer.write(b'\\xff' * (4 << 20))\nsys.stderr.buffer.write(b'\\xfe' * (4 << 20))\n"
    request = json.dumps({"source": flood + DOUBLE, "assert": TESTS[0]})
    result = shared_sandbox(LIMITS, 2, backend).run(_HARNESS, request)
    assert json.loads(result.stdout) == {"passed": True}
    assert len(result.stderr) <= 4096


NOBODY_RUN = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
box = sandbox.Sandbox(sandbox.SandboxLimits(cpu_s=2, wall_s=3))
kill = "import ctypes, os\\nfor t in (-1, os.getppid()):\\n    try:\\n        os.kill(t, 9)\\n    except OSError:\\n        pass\\nctypes.CDLL(None).kill(-1, 9)"
box.run(kill)
print(box.backend, box.run("print(6 * 7)").stdout.strip(), "alive")
"""


def _ordinary_user_can_run_repo() -> bool:
    python3 = shutil.which("python3", path="/usr/bin:/bin")
    folder = REPO / "coati" / "rewards"
    return bool(python3) and all(os.stat(p).st_mode & 0o005 == 0o005 for p in [folder, *folder.parents])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not _ordinary_user_can_run_repo(),
                    reason="needs root, setpriv, /usr/bin/python3 and a checkout every user may read")
def test_an_ordinary_user_s_run_survives_its_programs():
    """As `nobody` (no root, no CAP_SYS_ADMIN): with bubblewrap the programs are contained and cannot end the run;
    without it the sandbox refuses, in one line that says what to install."""
    as_nobody = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", NOBODY_RUN,
                 str(REPO / "coati" / "rewards" / "sandbox.py")]
    if BWRAP in BACKENDS_HERE:
        done = subprocess.run(as_nobody, capture_output=True, text=True, timeout=120, cwd="/")
        assert done.stdout.strip() == "bwrap 42 alive", (done.returncode, done.stderr[-500:])
    refused = subprocess.run(as_nobody, capture_output=True, text=True, timeout=120, cwd="/",
                             env={"PATH": "/nonexistent"})
    assert refused.returncode != 0 and "alive" not in refused.stdout
    last = refused.stderr.strip().splitlines()[-1]
    assert "cannot contain untrusted programs here: bubblewrap (bwrap) is not installed" in last
    assert "apt-get install bubblewrap" in last and "--sandbox unisolated" in last


def test_the_sandbox_flag_refuses_what_cannot_run_in_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    from coati.rewards import sandbox as module
    module.bwrap_problem.cache_clear()
    try:
        with pytest.raises(SandboxError, match=r"^--sandbox bwrap: bubblewrap \(bwrap\) is not installed$"):
            module.resolve_backend("bwrap")
    finally:
        module.bwrap_problem.cache_clear()
