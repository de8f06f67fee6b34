"""Runs untrusted programs (the code in completions) contained, one process tree per run.

Each run starts this file as a small supervisor (`python -I -S sandbox.py`, standard library only) that nobody of
the same user may trace or read through `/proc`. How the program is contained is the sandbox's backend:

- `bwrap` (bubblewrap, the default where it is installed and works; it needs no root, only user namespaces): new
  user, PID, network, IPC, UTS and cgroup namespaces, and a file system of its own that holds only a read-only
  `/usr` (and the interpreter's folders) and empty private `/tmp` and `/dev/shm`: no host file (the dataset
  included), no host socket, no network, and no process outside the run can be seen or signalled.
- `namespaces` (coati's own, as root with `CAP_SYS_ADMIN`, where bubblewrap is missing): new network, PID, mount,
  IPC and UTS namespaces, every host mount read-only, and private empty `/tmp`, `/var/tmp`, `/dev/shm` and `/run`
  (where host sockets live). Files every user may read stay readable. As root without `CAP_SYS_ADMIN` there are no
  namespaces: the run's own user id blocks writes elsewhere, but not reads or the network.
- `unisolated` (only when asked for): rlimits, an empty environment and a process-group kill; the program runs as
  this user and can do what this user can, end this run included.

As root each run also drops to a user id of its own (leased so that no two runs share one), so its process limit
counts only its own processes, and where the cgroup file system is writable the whole process tree gets one memory
cap (`memory_mb`); elsewhere memory is capped per process (address space). The program runs with rlimits on CPU
time, address space, processes and file size, under a wall-clock limit, with an environment that holds nothing of
ours (no tokens, no keys). When it ends, or overruns, everything it started is killed. `RunResult.isolation` says
which parts held, and `Sandbox` warns once, in one line, of what its backend does not isolate.
"""
import functools
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
BWRAP, NAMESPACES, OWN_USER, MEMORY_CGROUP = "bwrap", "namespaces", "own_user", "memory_cgroup"
AUTO, UNISOLATED = "auto", "unisolated"
BACKENDS = (AUTO, BWRAP, NAMESPACES, UNISOLATED)
UID_RANGE = (61000, 64999)
"""User ids leased to runs as root: unassigned on common distributions (below systemd's dynamic users)."""
_SUPERVISOR_GRACE_S = 10.0
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = (
    1, 2, 4, 8, 32, 1 << 12, 1 << 14, 1 << 18)
_PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PR_SET_DUMPABLE = 4
_PYTHON_MOUNT = "/tmp/.python"


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. `cpu_s`: CPU seconds of each process; `wall_s`: seconds from start to end;
    `memory_mb`: address space of each process, and memory of the whole tree where a memory cgroup can be made
    (root); `processes`: processes and threads at once; `file_size_mb`: the
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
    """Runs programs under `limits`, up to `workers` at once, contained by `backend` (module docstring; `auto`:
    bubblewrap where it works, else coati's own namespaces as root, else a `SandboxError` that says what to install).
    `run(source, stdin)` runs one Python program; `run_many([(source, stdin), ...])` runs several in parallel,
    results in order."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), workers: int = 0, backend: str = AUTO) -> None:
        self.limits = limits
        self.backend = resolve_backend(backend)
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
        self._warn_once(result.isolation)
        return result

    def run_many(self, jobs: Sequence[Tuple[str, str]]) -> List[RunResult]:
        return list(self._threads.map(lambda job: self.run(*job), jobs))

    def _supervise(self, source: str, stdin: str, uid: Optional[int]) -> RunResult:
        request = json.dumps({"source": source, "stdin": stdin, "uid": uid, "limits": asdict(self.limits),
                              "python": os.path.realpath(sys.executable), "backend": self.backend,
                              "bwrap": shutil.which("bwrap")})
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

    def _warn_once(self, isolation: Sequence[str]) -> None:
        gaps = isolation_gaps(self.backend, isolation)
        if gaps and not self._warned:
            self._warned = True
            logger.warning("code sandbox (%s): %s", self.backend, gaps)

    def close(self) -> None:
        self._threads.shutdown(wait=False)


_INSTALL_BWRAP = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) to contain them"


def isolation_gaps(backend: str, isolation: Sequence[str]) -> str:
    """What a run with these `isolation` parts does not contain, in one line; empty when nothing is missing."""
    gaps = []
    if backend == UNISOLATED:
        gaps.append("programs run as this user with rlimits only: they can read and write this user's files, use the "
                    "network and kill this run")
    elif backend == NAMESPACES and NAMESPACES in isolation:
        gaps.append("bubblewrap is not in use, so programs can read files every user may read (the dataset "
                    f"included) and reach Unix sockets outside /run and /tmp; {_INSTALL_BWRAP}")
    elif backend == NAMESPACES:
        gaps.append("no bubblewrap and no CAP_SYS_ADMIN: programs run as a user id of their own but can read files "
                    f"every user may read and use the network; {_INSTALL_BWRAP}")
    if MEMORY_CGROUP not in isolation:
        gaps.append("memory is capped per process, not per program (no writable memory cgroup)")
    return "; ".join(gaps)


def resolve_backend(backend: str = AUTO) -> str:
    """The backend a sandbox asked for `backend` uses on this machine; a `SandboxError` saying what to do where it
    cannot contain programs (an ordinary user without bubblewrap gets no isolation unless it asks for none)."""
    if backend not in BACKENDS:
        raise SandboxError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    problem = bwrap_problem() if backend in (AUTO, BWRAP) else None
    if backend in (AUTO, BWRAP) and problem is None:
        return BWRAP
    if backend == BWRAP:
        raise SandboxError(f"--sandbox bwrap: {problem}")
    if backend in (AUTO, NAMESPACES) and os.geteuid() == 0:
        return NAMESPACES
    if backend == NAMESPACES:
        raise SandboxError("--sandbox namespaces needs root (it makes namespaces and runs programs as a user id of "
                           "their own); as another user use --sandbox bwrap")
    if backend == UNISOLATED:
        return UNISOLATED
    raise SandboxError(f"cannot contain untrusted programs here: {problem}, and coati's own namespaces need root. "
                       "Uncontained, a program could read and write this user's files and kill this run: "
                       f"{_INSTALL_BWRAP}, or pass --sandbox unisolated to run them anyway")


@functools.lru_cache(maxsize=None)
def bwrap_problem() -> Optional[str]:
    """Why bubblewrap cannot contain programs here (not installed, or no user namespaces); None when it can. Tried
    once per process, as the user runs will have (root tries as `nobody`)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    drop = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    try:
        done = subprocess.run(bwrap_argv(bwrap, 1 << 20) + [shutil.which("true") or "/bin/true"], capture_output=True,
                              timeout=30, cwd="/", **drop)
    except (OSError, subprocess.SubprocessError) as error:
        return f"bubblewrap could not start ({error})"
    if done.returncode != 0:
        return f"bubblewrap cannot make its namespaces here ({done.stderr.decode(errors='replace').strip()[:200]})"
    return None


def bwrap_argv(bwrap: str, scratch_bytes: int, python: Optional[str] = None, source_fd: Optional[int] = None) -> List[str]:
    """bubblewrap's command line up to the program's: every namespace, a read-only `/usr` (and the interpreter's
    own folder elsewhere), private `/tmp` (the program's folder, holding `main.py` copied from `source_fd`) and
    `/dev/shm` of `scratch_bytes` each, and nothing else of the host."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr"]
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            argv += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            argv += ["--ro-bind", folder, folder]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    home = os.path.dirname(os.path.dirname(python)) if python else "/usr"
    if not home.startswith("/usr"):
        argv += ["--ro-bind", home, home]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(scratch_bytes), "--tmpfs", "/tmp",
             "--size", str(scratch_bytes), "--tmpfs", "/dev/shm", "--chdir", "/tmp"]
    if source_fd is not None:
        argv += ["--file", str(source_fd), "/tmp/main.py"]
    return argv + ["--"]


_shared: Dict[Tuple[SandboxLimits, int, str], Sandbox] = {}
_shared_lock = threading.Lock()


def shared_sandbox(limits: SandboxLimits = SandboxLimits(), workers: int = 0, backend: str = AUTO) -> Sandbox:
    """This process's sandbox for these limits, worker count and backend, made on first use."""
    with _shared_lock:
        if (limits, workers, backend) not in _shared:
            _shared[limits, workers, backend] = Sandbox(limits, workers, backend)
        return _shared[limits, workers, backend]


# The supervisor: what runs in the sandbox's process, standard library only.

def _libc_call(name: str, *args: object) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")


def _enter_namespaces(scratch_mb: int) -> bool:
    """Into new network, PID, mount, IPC and UTS namespaces, every host mount read-only and private tmpfs over the
    folders where programs write or host sockets live; False where the machine does not allow it (then nothing was
    changed)."""
    try:
        _libc_call("unshare", _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS)
    except OSError:
        return False
    _libc_call("mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    for mount_point in _mount_points():
        try:
            _libc_call("mount", None, mount_point.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
        except OSError:   # a mount that keeps locked flags: its own flags must be repeated
            try:
                _libc_call("mount", None, mount_point.encode(), None,
                           _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
            except FileNotFoundError:   # hidden under a later mount
                pass
    for folder in _PRIVATE_DIRS:
        if os.path.isdir(folder):
            _libc_call("mount", b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                       f"size={scratch_mb}m,mode=1777".encode())
    return True


def _mount_points() -> List[str]:
    """Every mount point of this mount namespace but the kernel's own (`/proc`, `/sys`: guarded by permissions, and
    the run's memory cgroup lives there), parents first."""
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4].encode().decode("unicode_escape") for line in f}
    return sorted((p for p in points if not p.startswith(("/proc", "/sys"))), key=len)


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


def _memory_cgroup(memory_mb: int) -> Optional[Tuple[str, str]]:
    """A new memory cgroup under this process's, capped at `memory_mb` for a run's whole process tree, as (folder,
    the file that counts its OOM kills); None where the cgroup file system is not writable (not root, a v2 parent
    without the memory controller delegated)."""
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    v1 = [path for _, controllers, path in entries if "memory" in controllers.split(",")]
    v2 = [path for hierarchy, controllers, path in entries if hierarchy == "0" and not controllers]
    if v1:
        base, limit_file, events = "/sys/fs/cgroup/memory" + v1[0], "memory.limit_in_bytes", "memory.oom_control"
    elif v2:
        base, limit_file, events = "/sys/fs/cgroup" + v2[0], "memory.max", "memory.events"
    else:
        return None
    folder = os.path.join(base, f"coati-sandbox-{os.getpid()}")
    try:
        os.mkdir(folder)
    except OSError:
        return None
    try:
        with open(os.path.join(folder, limit_file), "w") as f:
            f.write(str(int(memory_mb) << 20))
    except OSError:
        os.rmdir(folder)
        return None
    return folder, os.path.join(folder, events)


def _oom_killed(cgroup: Optional[Tuple[str, str]]) -> bool:
    """Whether the kernel killed a process of the run for its cgroup's memory cap."""
    if cgroup is None:
        return False
    with open(cgroup[1]) as f:
        counts = dict(line.split() for line in f if len(line.split()) == 2)
    return int(counts.get("oom_kill", "0")) > 0


def _remove_cgroup(cgroup: Optional[Tuple[str, str]]) -> None:
    """Remove the run's cgroup once the kernel has let go of its last process."""
    import time

    if cgroup is None:
        return
    deadline = time.monotonic() + 5.0
    while True:
        try:
            os.rmdir(cgroup[0])
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


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
    """In the program's process: limits, the leased user, then exec the program (under bubblewrap with that
    backend); a failure before the exec is written to `report` (closed by a successful exec)."""
    try:
        uid, bwrap = request["uid"], request["backend"] == BWRAP
        limits = dict(request["limits"], processes=request["limits"]["processes"] + (2 if bwrap else 0))
        _set_limits(limits, own_user=uid is not None)   # bubblewrap's own two processes count too
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(workdir)
        for target, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
            os.dup2(files[name], target)
        home = "/tmp" if bwrap else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", **{f"{lib}_NUM_THREADS": "1" for lib in ("OMP", "OPENBLAS", "MKL")}}
        argv = [request["python"], "-I", "main.py"]
        if bwrap:
            os.set_inheritable(files["source"], True)
            argv = bwrap_argv(request["bwrap"], _scratch_mb(limits) << 20, request["python"], files["source"]) + argv
        os.execve(argv[0], argv, env)
    except BaseException as error:
        os.write(report, f"{type(error).__name__}: {error}".encode())
    finally:
        os._exit(127)


def _reap(request: Dict, workdir: str, namespaces: bool, files: Dict[str, int], report: int, outcome: int,
          cgroup: Optional[Tuple[str, str]]) -> None:
    """The program's parent, leader of its session, in the run's memory cgroup, and, with namespaces, PID 1 of its
    PID namespace (a PID 1 ignores signals it has no handler for, the CPU limit's included, so the program must not
    be it): starts the program, waits for it and writes its wait status and CPU seconds to `outcome`."""
    try:
        os.setsid()
        if cgroup is not None:
            with open(os.path.join(cgroup[0], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if namespaces:
            _libc_call("mount", b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        pid = os.fork()
        if pid == 0:
            _exec_program(request, workdir, files, report)
        os.close(report)
        _, status, usage = os.wait4(pid, 0)
        if request["backend"] == BWRAP and os.WIFEXITED(status) and os.WEXITSTATUS(status) > 128:
            status = os.WEXITSTATUS(status) - 128   # bubblewrap exits 128 + N for a program killed by signal N
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
               processes_at_end: int, oom_killed: bool) -> Optional[str]:
    """The limit that stopped the program, from how it ended and what it wrote."""
    if "BlockingIOError" in stderr or "Resource temporarily unavailable" in stderr or (
            timed_out and processes_at_end >= limits["processes"]):
        return PROCESSES
    if oom_killed or "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return MEMORY
    if timed_out:
        return WALL_TIME
    if os.WIFSIGNALED(status) and (os.WTERMSIG(status) == signal.SIGXCPU or (
            os.WTERMSIG(status) == signal.SIGKILL and cpu_s >= limits["cpu_s"])):
        return CPU_TIME
    if "File too large" in stderr or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXFSZ):
        return FILE_SIZE
    return None


def _read(fd: int, limit: int) -> str:
    """At most `limit` bytes of what the program wrote to `fd`, decoded only then."""
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, limit).decode(errors="replace")


def _scratch_mb(limits: Dict[str, float]) -> int:
    """The size of each private tmpfs a run gets."""
    return max(64, 4 * int(limits["file_size_mb"]))


def supervise(request: Dict) -> Dict:
    """Runs one program as `request` says and returns `RunResult`'s fields. The program's stdin, stdout, stderr
    and source are kept in a folder of the supervisor's own (the program gets them as open descriptors only)."""
    limits, backend = request["limits"], request["backend"]
    namespaces = backend == NAMESPACES and _enter_namespaces(_scratch_mb(limits))
    request["python"] = _program_python(request["python"], namespaces)
    private = tempfile.mkdtemp(prefix="sandbox-io-")
    workdir = "/" if backend == BWRAP else tempfile.mkdtemp(prefix="sandbox-", dir="/tmp" if namespaces else None)
    cgroup = _memory_cgroup(int(limits["memory_mb"])) if request["uid"] is not None else None
    try:
        files = {name: os.open(os.path.join(private, name), os.O_RDWR | os.O_CREAT, 0o600)
                 for name in ("stdin", "stdout", "stderr", "source")}
        for name, text in (("stdin", request["stdin"]), ("source", request["source"])):
            os.write(files[name], text.encode())
            os.lseek(files[name], 0, os.SEEK_SET)
        if workdir != "/":
            with open(os.path.join(workdir, "main.py"), "w") as program:
                program.write(request["source"])
            if request["uid"] is not None:
                os.chown(workdir, request["uid"], request["uid"])
                os.chown(os.path.join(workdir, "main.py"), request["uid"], request["uid"])
        return _run_program(request, workdir, namespaces, files, cgroup)
    finally:
        shutil.rmtree(private, ignore_errors=True)
        if workdir != "/" and not namespaces:   # a namespace's tmpfs goes with it
            shutil.rmtree(workdir, ignore_errors=True)
        _remove_cgroup(cgroup)


def _run_program(request: Dict, workdir: str, namespaces: bool, files: Dict[str, int],
                 cgroup: Optional[Tuple[str, str]]) -> Dict:
    limits = request["limits"]
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    outcome_read, outcome_write = os.pipe2(os.O_CLOEXEC)
    reaper = os.fork()
    if reaper == 0:
        os.close(report_read)
        os.close(outcome_read)
        _reap(request, workdir, namespaces, files, report_write, outcome_write, cgroup)
    os.close(report_write)
    os.close(outcome_write)
    with os.fdopen(report_read, "rb") as report:
        failure = report.read().decode(errors="replace")
    exited = _await_end(reaper, limits["wall_s"], cgroup)
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
    limit = _limit_hit(status, cpu_s, stderr, limits, not exited, processes, _oom_killed(cgroup))
    code = os.waitstatus_to_exitcode(status)
    held = {BWRAP: request["backend"] == BWRAP, NAMESPACES: namespaces, OWN_USER: request["uid"] is not None,
            MEMORY_CGROUP: cgroup is not None}
    return {"status": LIMIT if limit else (OK if code == 0 else FAILED), "returncode": code, "stdout": stdout,
            "stderr": stderr, "limit": limit, "isolation": [part for part, holds in held.items() if holds]}


def _await_end(reaper: int, wall_s: float, cgroup: Optional[Tuple[str, str]]) -> bool:
    """Wait for the reaper to exit, at most `wall_s`; True when it did. A run whose cgroup had a process killed for
    memory ends at once (the kernel kills one process, and the rest would run on to the wall clock)."""
    import time

    pidfd, deadline = os.pidfd_open(reaper), time.monotonic() + wall_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if select.select([pidfd], [], [], min(left, 0.05) if cgroup else left)[0]:
            return True
        if _oom_killed(cgroup):
            return False


def _refuse_tracing() -> None:
    """Nobody of this user may trace this process or read its memory or descriptors through `/proc`."""
    import ctypes

    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def main() -> None:
    _refuse_tracing()
    try:
        result = supervise(json.loads(sys.stdin.read()))
    except Exception as error:
        sys.stderr.write(f"{type(error).__name__}: {error}\n")
        sys.exit(1)
    sys.stdout.buffer.write(json.dumps(result, ensure_ascii=False).encode())   # not 6 bytes per undecodable byte


if __name__ == "__main__":
    main()
