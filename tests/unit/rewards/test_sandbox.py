"""The code sandbox and the `code_tests` reward, run for real: every hostile program is contained, scored 0 with
its limit named, and leaves no process behind."""
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from coati.rewards import CodeTests, RewardFunctionError, WeightedReward, code_tests, extract_code
from coati.rewards.sandbox import (CPU_TIME, FILE_SIZE, LIMIT, MEMORY, OK, OWN_USER, PROCESSES, WALL_TIME, Sandbox,
                                   SandboxLimits)
from support import BACKENDS_HERE, LIMITS, sandbox_processes

@pytest.fixture(scope="module", params=BACKENDS_HERE or [pytest.param(None, marks=pytest.mark.skip(
    reason="nothing contains programs here: no bubblewrap, not root"))])
def sandbox(request):
    box = Sandbox(LIMITS, workers=2, backend=request.param)
    yield box
    box.close()


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    assert sandbox_processes() == []


def test_a_correct_program_runs_with_its_input(sandbox):
    result = sandbox.run("print(input()[::-1])", "hello\n")
    assert (result.status, result.stdout, result.limit) == (OK, "olleh\n", None)
    if os.geteuid() == 0:
        assert OWN_USER in result.isolation


def test_an_infinite_loop_is_stopped_by_its_cpu_time():
    result = Sandbox(SandboxLimits(cpu_s=1, wall_s=30), workers=1).run("while True:\n    pass")
    assert (result.status, result.limit) == (LIMIT, CPU_TIME), result.stderr[-300:]


@pytest.mark.parametrize("source, limit", [
    ("import time\ntime.sleep(60)", WALL_TIME),
    ("import os\nwhile True:\n    os.fork()", PROCESSES),
    ("block = bytearray(2 * 1024 ** 3)", MEMORY),
    ("with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 2 ** 20)", FILE_SIZE),
], ids=["sleeper", "fork_bomb", "memory_hog", "disk_filler"])
def test_hostile_programs_are_stopped_by_the_limit_they_hit(sandbox, source, limit):
    result = sandbox.run(source)
    assert (result.status, result.limit) == (LIMIT, limit), result.stderr[-300:]


def test_a_program_cannot_write_outside_its_folder(sandbox, tmp_path):
    os.chmod(tmp_path, 0o777)
    target, scratch = tmp_path / "escaped", "/tmp/coati-sandbox-escape"
    result = sandbox.run(f"open({str(target)!r}, 'w').write('x')\nopen({scratch!r}, 'w').write('x')\nprint('wrote')")
    assert not target.exists() and not os.path.exists(scratch)
    assert result.status != OK and ("PermissionError" in result.stderr or "No such file" in result.stderr)


def test_a_program_sees_none_of_our_environment(sandbox, monkeypatch):
    monkeypatch.setenv("COATI_TEST_SECRET", "hunter2")
    result = sandbox.run("import os\nprint(sorted(os.environ))\nprint(os.environ['COATI_TEST_SECRET'])")
    assert result.status != OK and "KeyError" in result.stderr and "hunter2" not in result.stdout
    assert "COATI_TEST_SECRET" not in result.stdout


def test_a_program_cannot_reach_a_local_port(sandbox):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    accepted = []
    listener = threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True)
    listener.start()
    port = server.getsockname()[1]
    result = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')")
    listener.join()
    server.close()
    assert result.status != OK and ("unreachable" in result.stderr or "Connection refused" in result.stderr)
    assert accepted == [None]   # a network of its own: the host's port is not there


def _accept(server):
    try:
        return server.accept()
    except socket.timeout:
        return None


def test_what_a_program_starts_is_killed_when_it_ends(sandbox):
    result = sandbox.run("import subprocess\nsubprocess.Popen(['sleep', '600', 'coati-sandbox-test'], "
                         "start_new_session=True)\nprint('started')")
    assert result.stdout == "started\n"


def test_runs_go_in_parallel_and_in_order(sandbox):
    results = sandbox.run_many([(f"import time\ntime.sleep(1)\nprint({i})", "") for i in range(4)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to drop CAP_SYS_ADMIN")
def test_without_namespaces_the_own_user_still_contains_processes(tmp_path):
    """As root without CAP_SYS_ADMIN (Docker's default), no namespaces: rlimits, the own user and its cleanup hold."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        from coati.rewards.sandbox import Sandbox, SandboxLimits
        box = Sandbox(SandboxLimits(cpu_s=2, wall_s=3, processes=16), backend="namespaces")
        bomb = box.run("import os\\nwhile True:\\n    os.fork()")
        daemon = box.run("import subprocess\\nsubprocess.Popen(['sleep', '600', 'coati-sandbox-test'], "
                         "start_new_session=True)")
        print(bomb.isolation, bomb.limit, daemon.status)
    """))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", sys.executable, str(script)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip() in ("['own_user'] processes ok", "['own_user', 'memory_cgroup'] processes ok"), \
        done.stderr[-500:]
    assert "no bubblewrap and no CAP_SYS_ADMIN: programs run as a user id of their own" in done.stderr


def test_extract_code_takes_the_last_python_block():
    text = "first\n```python\nx = 1\n```\nthen\n```py\nx = 2\n```\n```bash\nls\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("```\nprint(1)\n```") == "print(1)\n"
    assert extract_code("no code, or ```python\nunfinished") is None


DOUBLE = "```python\ndef f(x):\n    return 2 * x\n```"
PLUS_TWO = "```python\ndef f(x):\n    return x + 2\n```"
EARLY_EXIT = "```python\nimport sys\ndef f(x):\n    return 0\nsys.exit(0)\n```"
ASSERTS = "assert f(2) == 4\nassert f(3) == 6\nassert f(0) == 0"


def test_code_tests_scores_the_fraction_of_asserts_passed():
    out = code_tests(["p"] * 4, [DOUBLE, PLUS_TWO, EARLY_EXIT, "I would write f."], tests=[ASSERTS] * 4)
    assert out.values == pytest.approx([1.0, 1 / 3, 0.0, 0.0])
    assert out.diagnostics["no_code"] == [0.0, 0.0, 0.0, 1.0]


def test_code_tests_runs_stdin_programs_and_all_or_nothing():
    cases = {"inputs": ["ab\n", "abc\n", "x\n"], "outputs": ["ba", "cba\n", "x"]}
    reverse, echo = "```python\nprint(input()[::-1])\n```", "```python\nprint(input())\n```"
    assert code_tests(["p"] * 2, [reverse, echo], test_cases=[cases] * 2).values == pytest.approx([1.0, 1 / 3])
    strict = CodeTests(all_or_nothing=True)
    assert strict(["p"] * 2, [reverse, echo], test_cases=['{"inputs": ["ab"], "outputs": ["ba"]}'] * 2).values == [1.0, 0.0]


def test_code_tests_names_the_limit_a_completion_hit():
    loop = "```python\ndef f(x):\n    while True:\n        pass\n```"
    out = CodeTests(SandboxLimits(cpu_s=1, wall_s=30))(["p"] * 2, [loop, DOUBLE], tests=[["assert f(1) == 2", "assert True"]] * 2)
    assert out.values == [0.5, 1.0]
    assert out.diagnostics["cpu_time"] == [1.0, 0.0] and out.diagnostics["memory"] == [0.0, 0.0]


def test_a_row_without_tests_is_named():
    reward = WeightedReward.from_specs(["code_tests"])
    with pytest.raises(RewardFunctionError, match="code_tests raised ValueError: a row has neither test_cases nor tests"):
        reward(["p"], [DOUBLE], gt_answer=["4"])
