"""The trainer's side of a judge it serves itself (`--judge_model DIR`): `LocalJudge` starts
`coati.inference.judge_server` on loopback with a random token (handed over in its environment, so no process list
shows it), waits until it serves, and stops it with the run. The server also stops on its own when the trainer dies
however it dies (a lifeline pipe), and its folder (the ready file, coati's source link) is removed with it.

Each rank serves its own judge, as each rank has its own vLLM rollout server: no rank waits on another's."""
import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import torch

from coati.utils.errors import CoatiUsageError

from .judge_server import LIFELINE_ENV, TOKEN_ENV
from .vllm import IDLE_THREADS, default_vllm_python, last_log_line, work_dir

READY_POLL_S = 0.2
STOP_WAIT_S = 10.0


@dataclass(frozen=True)
class JudgeServerConfig:
    """`model`: the judge's folder; `engine`: hf (coati's interpreter) or vllm (`python`, default vLLM's environment);
    `log_path`: its output; `device`: the hf engine's (cpu, cuda:N; empty: its own choice); `dtype`: the vllm engine's
    (auto: vLLM's choice for the model); `threads`: its CPU threads (0: this process's torch threads)."""

    model: str
    engine: str = "hf"
    python: str = ""
    log_path: Optional[str] = None
    device: str = ""
    dtype: str = "auto"
    threads: int = 0
    start_timeout_s: float = 600.0


class LocalJudge:
    """A judge server this process started: `url` and `token` once `start()` returns; `close()` stops it (also at
    exit)."""

    def __init__(self, config: JudgeServerConfig) -> None:
        self.config = config
        self.folder = work_dir()
        self.log_path = Path(config.log_path or self.folder / "judge.log")
        self.token = secrets.token_urlsafe(24)
        self.url = ""
        self.process: Optional[subprocess.Popen] = None
        self._lifeline: Optional[int] = None

    def start(self) -> "LocalJudge":
        """Start the server and wait until it serves; one line (`CoatiUsageError`) if it exits first or takes longer
        than `start_timeout_s`."""
        ready = self.folder / "ready"
        command = [self._python(), "-m", "coati.inference.judge_server", "--model", str(Path(self.config.model).resolve()),
                   "--engine", self.config.engine, "--ready_file", str(ready), "--cleanup", str(self.folder),
                   "--dtype", self.config.dtype, *(["--device", self.config.device] if self.config.device else [])]
        read, self._lifeline = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        atexit.register(self.close)
        try:
            with open(self.log_path, "a") as log:
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                self.process = subprocess.Popen(command, env=self._environment(read), cwd=self.folder,
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                pass_fds=(read,), start_new_session=True)
        except OSError as error:
            self.close()
            raise CoatiUsageError(f"cannot start the judge server with {command[0]} ({error.strerror})") from None
        finally:
            os.close(read)
        self.url = self._wait(ready)
        return self

    def _python(self) -> str:
        if self.config.engine == "vllm":
            return self.config.python or default_vllm_python()
        return self.config.python or sys.executable

    def _environment(self, lifeline: int) -> Dict[str, str]:
        """Its environment: the token and the lifeline; for vLLM's interpreter, coati's source on the path and nothing
        else of this environment's; its CPU threads, idle ones asleep."""
        env = dict(os.environ)
        if self.config.engine == "vllm":
            env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
            env.update({"PYTHONPATH": str(self.folder / "src"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        env.update({TOKEN_ENV: self.token, LIFELINE_ENV: str(lifeline), "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": str(self.config.threads or torch.get_num_threads())})
        if self.config.engine == "vllm" and self.config.device.startswith("cuda:"):   # vLLM takes the first it sees
            env["CUDA_VISIBLE_DEVICES"] = visible_device(env.get("CUDA_VISIBLE_DEVICES"), self.config.device)
        for name, value in IDLE_THREADS.items():
            env.setdefault(name, value)
        return env

    def _wait(self, ready: Path) -> str:
        deadline = time.monotonic() + self.config.start_timeout_s
        while not ready.is_file():
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                self.close()
                why = f"exited with code {code}" if code is not None else \
                    f"did not serve within {self.config.start_timeout_s:.0f} s (--judge_start_timeout)"
                raise CoatiUsageError(f"the judge server on {self.config.model} {why}: {last_log_line(self.log_path)} "
                                      f"(its log: {self.log_path})")
            time.sleep(READY_POLL_S)
        return ready.read_text().strip()

    def close(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL to its process group) and remove its folder; safe to call twice."""
        process, self.process = self.process, None
        if process is not None:
            for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, None)):
                try:
                    os.killpg(process.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            os.close(lifeline)
        shutil.rmtree(self.folder, ignore_errors=True)


def visible_device(visible: Optional[str], device: str) -> str:
    """The `CUDA_VISIBLE_DEVICES` that shows a server only `device` (cuda:N, N counted among `visible` where set)."""
    index = int(device.split(":")[1])
    return visible.split(",")[index] if visible else str(index)
