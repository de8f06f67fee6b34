"""Runs untrusted programs (the code in completions) contained, one process tree per run.

Each run starts this file as a small supervisor (`python -I -S sandbox.py`, standard library only). Where the
machine allows it (root, or the capabilities to make namespaces), the supervisor moves into new network, PID,
mount, IPC and UTS namespaces: the program sees only a loopback device that is down (no connection leaves it, not
even to a local port), only its own processes, and private empty `/tmp`, `/var/tmp` and `/dev/shm` (its working
directory is one of them, discarded at the end). As root it also drops to a user id of its own for the run (leased
so that no two runs share one), so it can write nowhere else and its process limit counts only its own processes.
The program runs with rlimits on CPU time, address space, processes and file size, under a wall-clock limit, with
an environment that holds nothing of ours (no tokens, no keys). When it ends, or overruns, everything it started
is killed: its parent, a reaper that is PID 1 of the namespace, exits and takes the rest with it; without
namespaces its process group is killed, and as root every process of its user id. A machine without namespaces gets the rlimits, the emptied environment and the process-group kill only;
`RunResult.isolation` says which parts held, and `Sandbox` warns once when some did not.
"""
import json
import logging
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

OK, FAILED, LIMIT = "ok", "failed", "limit"
"""A run's status: exited 0; exited otherwise (an exception, a wrong exit code); stopped by a limit."""
WALL_TIME, CPU_TIME, MEMORY, PROCESSES, FILE_SIZE = "wall_time", "cpu_time", "memory", "processes", "file_size"
LIMITS = (WALL_TIME, CPU_TIME, MEMORY, PROCESSES, FILE_SIZE)
NAMESPACES, OWN_USER = "namespaces", "own_user"
UID_RANGE = (61000, 64999)
"""User ids leased to runs as root: unassigned on common distributions (below systemd's dynamic users)."""
_SUPERVISOR_GRACE_S = 10.0
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1, 2, 4, 8, 32, 1 << 12, 1 << 14, 1 << 18)
_PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
_PYTHON_MOUNT = "/tmp/.python"


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. `cpu_s`: CPU seconds of each process; `wall_s`: seconds from start to end;
    `memory_mb`: address space of each process; `processes`: processes and threads at once; `file_size_mb`: the
    largest file it may write (its stdout and stderr included); `output_bytes`: how much of stdout/stderr is read."""

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 512
    processes: int = 32
    file_size_mb: int = 16
    output_bytes: int = 1 << 20


@dataclass
class RunResult:
    """How a run ended: `status` OK, FAILED or LIMIT; `limit` the one that stopped it (LIMITS) when LIMIT;
    `isolation` the parts of the sandbox that held (NAMESPACES, OWN_USER)."""

    status: str
    returncode: int
    stdout: str
    stderr: str
    limit: Optional[str] = None
    isolation: List[str] = field(default_factory=list)


class SandboxError(RuntimeError):
    """The sandbox itself could not run a program (not the program's fault); the message says why."""


class _UidLease:
    """A user id no other run holds: an abstract Unix socket named after it is bound for as long as the lease
    lasts, so leases hold across processes on the machine and end with their holder, leaving no file behind."""

    def __init__(self) -> None:
        low, high = UID_RANGE
        start = random.randrange(high - low + 1)
        for offset in range(high - low + 1):
            uid = low + (start + offset) % (high - low + 1)
            lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                lock.bind(f"\0coati-sandbox-uid-{uid}")
            except OSError:
                lock.close()
                continue
            self.uid, self._lock = uid, lock
            return
        raise SandboxError(f"all sandbox user ids {low}-{high} are in use")

    def release(self) -> None:
        self._lock.close()


class Sandbox:
    """Runs programs under `limits`, up to `workers` at once. `run(source, stdin)` runs one Python program;
    `run_many([(source, stdin), ...])` runs several in parallel, results in order."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), workers: int = 0) -> None:
        self.limits = limits
        self.workers = workers or max(1, min(8, os.cpu_count() or 1))
        self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        self._warned = False

    def run(self, source: str, stdin: str = "") -> RunResult:
        lease = _UidLease() if os.geteuid() == 0 else None
        try:
            result = self._supervise(source, stdin, lease.uid if lease else None)
        finally:
            if lease:
                lease.release()
        self._warn_unisolated(result.isolation)
        return result

    def run_many(self, jobs: Sequence[Tuple[str, str]]) -> List[RunResult]:
        return list(self._threads.map(lambda job: self.run(*job), jobs))

    def _supervise(self, source: str, stdin: str, uid: Optional[int]) -> RunResult:
        request = json.dumps({"source": source, "stdin": stdin, "uid": uid, "limits": asdict(self.limits),
                              "python": os.path.realpath(sys.executable)})
        supervisor = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, start_new_session=True)
        try:
            out, err = supervisor.communicate(request.encode(), timeout=self.limits.wall_s + _SUPERVISOR_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.communicate()
            raise SandboxError(f"the sandbox supervisor did not finish within {self.limits.wall_s:g} s + "
                               f"{_SUPERVISOR_GRACE_S:g} s") from None
        if supervisor.returncode != 0:
            raise SandboxError(f"the sandbox could not run a program: {err.decode(errors='replace').strip()[-500:]}")
        return RunResult(**json.loads(out))

    def _warn_unisolated(self, isolation: Sequence[str]) -> None:
        missing = [part for part in (NAMESPACES, OWN_USER) if part not in isolation]
        if missing and not self._warned:
            self._warned = True
            logger.warning("code sandbox: running without %s (they need root or CAP_SYS_ADMIN); programs still get "
                           "rlimits, an empty environment and a process-group kill, but %s", " and ".join(missing),
                           "network and file writes are not isolated" if NAMESPACES in missing
                           else "may write wherever this user can")

    def close(self) -> None:
        self._threads.shutdown(wait=False)


_shared: Dict[Tuple[SandboxLimits, int], Sandbox] = {}
_shared_lock = threading.Lock()


def shared_sandbox(limits: SandboxLimits = SandboxLimits(), workers: int = 0) -> Sandbox:
    """This process's sandbox for these limits and worker count, made on first use."""
    with _shared_lock:
        if (limits, workers) not in _shared:
            _shared[limits, workers] = Sandbox(limits, workers)
        return _shared[limits, workers]


# The supervisor: what runs in the sandbox's process, standard library only.

def _libc_call(name: str, *args: object) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")


def _enter_namespaces(scratch_mb: int) -> bool:
    """Into new network, PID, mount, IPC and UTS namespaces, with private tmpfs over the world-writable folders;
    False where the machine does not allow it (then nothing was changed)."""
    try:
        _libc_call("unshare", _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS)
    except OSError:
        return False
    _libc_call("mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    for folder in _PRIVATE_DIRS:
        if os.path.isdir(folder):
            _libc_call("mount", b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                       f"size={scratch_mb}m,mode=1777".encode())
    return True


def _readable_by_all(path: str) -> bool:
    """Whether any user may run `path`: every folder above it may be entered by all."""
    import stat

    folder = os.path.dirname(path)
    while folder != os.path.dirname(folder):
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return False
        folder = os.path.dirname(folder)
    return True


def _program_python(python: str, namespaces: bool) -> str:
    """The interpreter the program runs on: ours where every user can reach it; else ours mounted read-only at
    `_PYTHON_MOUNT` (a Python under `/root`; needs the mount namespace); else the system's `python3`."""
    prefix = sys.base_prefix
    if _readable_by_all(python):
        return python
    if namespaces and python.startswith(prefix + os.sep):
        os.makedirs(_PYTHON_MOUNT)
        _libc_call("mount", prefix.encode(), _PYTHON_MOUNT.encode(), None, _MS_BIND | _MS_REC, None)
        _libc_call("mount", None, _PYTHON_MOUNT.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
        return _PYTHON_MOUNT + python[len(prefix):]
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    return os.path.realpath(system) if system and _readable_by_all(os.path.realpath(system)) else python


def _set_limits(limits: Dict[str, float], own_user: bool) -> None:
    import resource

    cpu = max(1, int(limits["cpu_s"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = int(limits["file_size_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    processes = int(limits["processes"])
    if not own_user:   # the limit counts all of this user's processes: allow ours on top of those running now
        processes += _count_processes()
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _exec_program(request: Dict, workdir: str, files: Dict[str, int], report: int) -> None:
    """In the program's process: limits, the leased user, then exec the program; a failure before the exec is
    written to `report` (closed by a successful exec)."""
    try:
        uid = request["uid"]
        _set_limits(request["limits"], own_user=uid is not None)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(workdir)
        for target, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            os.dup2(files[name], target)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", **{f"{lib}_NUM_THREADS": "1" for lib in ("OMP", "OPENBLAS", "MKL")}}
        os.execve(request["python"], [request["python"], "-I", "main.py"], env)
    except BaseException as error:
        os.write(report, f"{type(error).__name__}: {error}".encode())
    finally:
        os._exit(127)


def _reap(request: Dict, workdir: str, namespaces: bool, files: Dict[str, int], report: int, outcome: int) -> None:
    """The program's parent, leader of its session and, with namespaces, PID 1 of its PID namespace (a PID 1
    ignores signals it has no handler for, the CPU limit's included, so the program must not be it): starts the
    program, waits for it and writes its wait status and CPU seconds to `outcome`."""
    try:
        os.setsid()
        if namespaces:
            _libc_call("mount", b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        pid = os.fork()
        if pid == 0:
            _exec_program(request, workdir, files, report)
        os.close(report)
        _, status, usage = os.wait4(pid, 0)
        os.write(outcome, json.dumps([status, usage.ru_utime + usage.ru_stime]).encode())
    finally:
        os._exit(0)


def _kill_user(uid: int) -> None:
    """Kills every process of the leased `uid`: those that left the program's session too."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _await_empty_namespace(timeout_s: float = 5.0) -> None:
    """Wait until the kernel has killed what was left in the PID namespace (its `/proc` is ours)."""
    import time

    deadline = time.monotonic() + timeout_s
    while _count_processes() and time.monotonic() < deadline:
        time.sleep(0.005)


def _count_processes() -> int:
    return sum(1 for entry in os.listdir("/proc") if entry.isdigit())


def _limit_hit(status: int, cpu_s: float, stderr: str, limits: Dict[str, float], timed_out: bool,
               processes_at_end: int) -> Optional[str]:
    """The limit that stopped the program, from how it ended and what it wrote."""
    if "BlockingIOError" in stderr or "Resource temporarily unavailable" in stderr or (
            timed_out and processes_at_end >= limits["processes"]):
        return PROCESSES
    if timed_out:
        return WALL_TIME
    if os.WIFSIGNALED(status) and (os.WTERMSIG(status) == signal.SIGXCPU or (
            os.WTERMSIG(status) == signal.SIGKILL and cpu_s >= limits["cpu_s"])):
        return CPU_TIME
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return MEMORY
    if "File too large" in stderr or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXFSZ):
        return FILE_SIZE
    return None


def _read(fd: int, limit: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, limit).decode(errors="replace")


def supervise(request: Dict) -> Dict:
    """Runs one program as `request` says and returns `RunResult`'s fields."""
    limits = request["limits"]
    namespaces = _enter_namespaces(scratch_mb=max(64, 4 * int(limits["file_size_mb"])))
    request["python"] = _program_python(request["python"], namespaces)
    workdir = tempfile.mkdtemp(prefix="sandbox-", dir="/tmp" if namespaces else None)
    try:
        with open(os.path.join(workdir, "main.py"), "w") as program:
            program.write(request["source"])
        files = {name: os.open(os.path.join(workdir, f".{name}"), os.O_RDWR | os.O_CREAT, 0o600)
                 for name in ("stdin", "stdout", "stderr")}
        os.write(files["stdin"], request["stdin"].encode())
        os.lseek(files["stdin"], 0, os.SEEK_SET)
        if request["uid"] is not None:
            os.chown(workdir, request["uid"], request["uid"])
            os.chown(os.path.join(workdir, "main.py"), request["uid"], request["uid"])
        return _run_program(request, workdir, namespaces, files)
    finally:
        if not namespaces:   # a namespace's tmpfs goes with it
            shutil.rmtree(workdir, ignore_errors=True)


def _run_program(request: Dict, workdir: str, namespaces: bool, files: Dict[str, int]) -> Dict:
    limits = request["limits"]
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    outcome_read, outcome_write = os.pipe2(os.O_CLOEXEC)
    reaper = os.fork()
    if reaper == 0:
        os.close(report_read)
        os.close(outcome_read)
        _reap(request, workdir, namespaces, files, report_write, outcome_write)
    os.close(report_write)
    os.close(outcome_write)
    with os.fdopen(report_read, "rb") as report:
        failure = report.read().decode(errors="replace")
    exited, _, _ = select.select([os.pidfd_open(reaper)], [], [], limits["wall_s"])
    processes = _count_processes() if namespaces and not exited else 0
    os.killpg(reaper, signal.SIGKILL)   # what the program left running (with namespaces, all of it goes anyway)
    os.waitpid(reaper, 0)
    if namespaces:
        _await_empty_namespace()
    if request["uid"] is not None and not namespaces:   # a namespace's processes died with its PID 1
        _kill_user(request["uid"])
    if failure:
        raise SandboxError(f"could not start {request['python']} in the sandbox: {failure} (where the sandbox's user "
                           "cannot read it, use a Python installed where all users can)")
    with os.fdopen(outcome_read, "rb") as outcome:
        status, cpu_s = json.loads(outcome.read() or "[9, 0.0]")   # no outcome: the reaper was killed (SIGKILL)
    stdout, stderr = (_read(files[name], int(limits["output_bytes"])) for name in ("stdout", "stderr"))
    limit = _limit_hit(status, cpu_s, stderr, limits, not exited, processes)
    code = os.waitstatus_to_exitcode(status)
    return {"status": LIMIT if limit else (OK if code == 0 else FAILED), "returncode": code, "stdout": stdout,
            "stderr": stderr, "limit": limit,
            "isolation": ([NAMESPACES] if namespaces else []) + ([OWN_USER] if request["uid"] is not None else [])}


def main() -> None:
    try:
        result = supervise(json.loads(sys.stdin.read()))
    except Exception as error:
        sys.stderr.write(f"{type(error).__name__}: {error}\n")
        sys.exit(1)
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
