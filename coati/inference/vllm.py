"""The vLLM rollout backend, trainer side: `VLLMPool` starts vLLM generation servers (`vllm_server`) in
vLLM's own environment, generates rollouts on them and hands them the trainer's new weights.

- **Environment.** colossalai pins torch 2.5.1; vLLM brings its own torch. The servers run under `python`
  (`--vllm_python`, default `.venv-vllm/bin/python`, which `make vllm-env` builds), so the trainer's environment
  stays the one colossalai supports. On a GPU machine with a vLLM that matches the trainer's torch, point
  `--vllm_python` at the trainer's own interpreter.
- **Transport.** Our own small RPC (`multiprocessing.connection` on an abstract Unix socket, with a random key):
  token ids in, token ids and per-token log-probs out, never re-tokenised text. vLLM's OpenAI-compatible server
  would add an HTTP stack, detokenisation and a weight-update endpoint of our own anyway.
- **Weights.** After an update the trainer copies the policy's state dict into memory every server has mapped
  (`coati.inference.shared_weights`: an anonymous memory file of two slots, handed to each server once as a file
  descriptor), and each server loads it in place (`load_weights`) and from then on reports its version. Raw tensors
  at fixed offsets cross the process and torch-version boundary without pickling or a file per update; a server that
  is restarted maps the memory again and loads the newest version; nothing is left in `/dev/shm`, however the run
  ends. A LoRA run may send the adapters alone instead (`publish_adapter`, servers started with `max_lora_rank`):
  peft's files in the pool's work folder, which vLLM serves over the base weights it started with.
- **Lifecycle.** A server starts once per run; its readiness is awaited up to `start_timeout_s`; its log is
  `<log_dir>/<log_name>_<i>.log`. It stops when the pool is shut down, and when the trainer dies however it
  dies (the lifeline pipe, see `vllm_server`). A server that dies is restarted with the newest weights, at most
  `max_restarts` times in all; then, as on a timeout, the run ends with one line (`EngineError`).
"""
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.connection import Client, Connection
from multiprocessing.reduction import send_handle
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from coati.rollout.generators import BatchingPool
from coati.rollout.pool import Completions, all_of
from coati.rollout.probe import EngineSyncError, ProbeCheck
from coati.utils.errors import CoatiUsageError

from .shared_weights import SharedWeights
from .vllm_server import AUTHKEY_ENV, LIFELINE_ENV

READY_POLL_S = 0.25
IDLE_THREADS = {"KMP_BLOCKTIME": "1"}
"""Intel OpenMP threads that sleep 1 ms after their work (default 200 ms of spinning, which took the cores from the
trainer's learning step: +14 % on a 2-core CPU). Sleeping at once (`OMP_WAIT_POLICY=PASSIVE`) slowed decoding."""
STOP_WAIT_S = 10.0


class EngineError(CoatiUsageError):
    """A vLLM server could not start, did not answer in time, failed a request, or died more often than it may be
    restarted; the message says which, with the last line of its log."""


class _EngineDied(Exception):
    """The server process is gone (or its connection broke); the pool may restart it."""


def default_vllm_python() -> str:
    """`$COATI_VLLM_PYTHON`, else the `.venv-vllm` that `make vllm-env` builds beside coati's source."""
    return os.environ.get("COATI_VLLM_PYTHON") or str(Path(__file__).resolve().parents[2] / ".venv-vllm/bin/python")


@dataclass(frozen=True)
class VLLMConfig:
    """How to run the servers. Server i logs to `<log_dir>/<log_name>_<i>.log` (default folder: the pool's own,
    removed with it). `threads`: CPU threads of each server (0: this process's torch threads); `kv_cache_gib`: its
    KV cache on CPU; `gpu_memory_utilization`: its share of a GPU's memory; `enforce_eager`: no torch.compile (nor CUDA
    graphs), which starts a server in a third of the time and suits small models; `max_lora_rank`: serve LoRA adapters of
    up to this rank (`publish_adapter`; 0: none)."""

    model: str
    python: str = ""
    log_dir: Optional[str] = None
    log_name: str = "vllm"
    dtype: str = "float32"
    seed: int = 0
    threads: int = 0
    kv_cache_gib: int = 1
    gpu_memory_utilization: float = 0.4
    start_timeout_s: float = 600.0
    timeout_s: float = 600.0
    max_restarts: int = 1
    enforce_eager: bool = False
    max_lora_rank: int = 0

    @classmethod
    def from_settings(cls, settings: Any, model: str, python: str, log_dir: Optional[str], log_name: str, dtype: str,
                      seed: int, max_lora_rank: int) -> "VLLMConfig":
        """The servers its settings section (`coati.config.BackendSettings`) describes, for this run's model, log
        folder, precision, seed and adapters."""
        return cls(model=model, python=python, log_dir=log_dir, log_name=log_name, dtype=dtype, seed=seed,
                   max_lora_rank=max_lora_rank, **{name: getattr(settings, setting)
                                                   for name, setting in FROM_SETTINGS.items()})


FROM_SETTINGS = {"threads": "vllm_threads", "kv_cache_gib": "vllm_kv_cache_gib",
                 "gpu_memory_utilization": "vllm_gpu_memory_utilization", "start_timeout_s": "vllm_start_timeout",
                 "timeout_s": "vllm_timeout", "max_restarts": "vllm_max_restarts", "enforce_eager": "vllm_enforce_eager"}
"""`VLLMConfig`'s fields -> the `BackendSettings` setting each comes from."""


def last_log_line(path: Path) -> str:
    """The last non-empty line of a log, to quote in an error."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


class VLLMServer:
    """One server process: `launch()` starts it, `wait_ready()` connects once its model is loaded, `call()` sends a
    request and returns the answer, `close()` stops it (politely, then by killing its process group)."""

    def __init__(self, config: VLLMConfig, index: int, work_dir: Path) -> None:
        self.config, self.index, self.work_dir = config, index, work_dir
        self.log_path = Path(config.log_dir or work_dir) / f"{config.log_name}_{index}.log"
        self.process: Optional[subprocess.Popen] = None
        self.conn: Optional[Connection] = None
        self.attached: Optional[SharedWeights] = None   # the weight memory it has mapped
        self.start_seconds = 0.0
        self._lifeline: Optional[int] = None

    def launch(self) -> None:
        """Start the process; `wait_ready` connects to it."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._name = f"coati-vllm-{os.getpid()}-{self.index}-{secrets.token_hex(6)}"
        self._authkey = secrets.token_hex(16)
        read, self._lifeline = os.pipe()
        command = [self.config.python or default_vllm_python(), "-m", "coati.inference.vllm_server",
                   "--model", _absolute(self.config.model), "--address", "@" + self._name, "--dtype", self.config.dtype,
                   "--seed", str(self.config.seed + self.index),
                   "--gpu_memory_utilization", str(self.config.gpu_memory_utilization), "--cleanup", str(self.work_dir),
                   *(["--enforce_eager"] if self.config.enforce_eager else []),
                   *(["--max_lora_rank", str(self.config.max_lora_rank)] if self.config.max_lora_rank else [])]
        with open(self.log_path, "a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            self._started = time.perf_counter()
            try:   # in the work folder: `-m` puts the current folder first on the path, and a coati there would win
                self.process = subprocess.Popen(command, env=self._environment(read), cwd=self.work_dir,
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                pass_fds=(read,), start_new_session=True)
            except OSError as error:
                raise EngineError(f"cannot start the vLLM server with {command[0]} ({error.strerror}); build its "
                                  "environment with `make vllm-env`, or name one with --vllm_python") from None
            finally:
                os.close(read)

    def _environment(self, lifeline: int) -> Dict[str, str]:
        """The server's environment: coati's source importable (and nothing else of this environment's), the key,
        the lifeline, the engine in-process, and its CPU threads (idle ones asleep) and KV cache."""
        threads = self.config.threads or torch.get_num_threads()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update({"PYTHONPATH": str(self.work_dir / "src"), AUTHKEY_ENV: self._authkey, LIFELINE_ENV: str(lifeline),
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": str(self.config.kv_cache_gib),
                    "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        for name, value in IDLE_THREADS.items():
            env.setdefault(name, value)
        return env

    def wait_ready(self) -> None:
        """Connect once the server listens (its model loaded); one line if it exits first or takes too long."""
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise _EngineDied(f"it exited with code {code} while starting ({last_log_line(self.log_path)})")
            try:
                self.conn = Client("\0" + self._name, family="AF_UNIX", authkey=self._authkey.encode())
                break
            except (FileNotFoundError, ConnectionRefusedError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise EngineError(f"vLLM server {self.index} did not become ready within "
                                  f"{self.config.start_timeout_s:.0f} s (--vllm_start_timeout); its log: {self.log_path}")
            time.sleep(READY_POLL_S)
        self.start_seconds = time.perf_counter() - self._started

    def attach(self, shared: SharedWeights) -> None:
        """Hand the server the weight memory (its file descriptor, over the connection) to map."""
        self.call({"op": "attach_weights", "size": shared.size}, fd=shared.fd)
        self.attached = shared

    def call(self, request: Dict[str, Any], fd: Optional[int] = None) -> Dict[str, Any]:
        """Send `request` (and the file descriptor `fd` after it), return the answer; `_EngineDied` when the process is
        gone, `EngineError` on a timeout or a request the server failed."""
        op = request["op"]
        try:
            self.conn.send(request)
            if fd is not None:
                send_handle(self.conn, fd, self.process.pid)
            if not self.conn.poll(self.config.timeout_s):
                raise EngineError(f"vLLM server {self.index} (pid {self.process.pid}) did not answer '{op}' within "
                                  f"{self.config.timeout_s:.0f} s (--vllm_timeout); its log: {self.log_path}")
            answer = self.conn.recv()
        except (EOFError, OSError) as error:
            code = self.process.poll()
            cause = f"exit code {code}" if code is not None else type(error).__name__
            raise _EngineDied(f"{cause}; {last_log_line(self.log_path)}") from None
        if "error" in answer:
            raise EngineError(f"vLLM server {self.index} failed '{op}': {answer['error']}; its log: {self.log_path}")
        return answer

    def close(self) -> None:
        """Ask the server to stop, then kill what is left of its process group. Safe to call from two threads at once
        (the trainer's shutdown and a worker that saw the server die): each handle is taken by one caller only."""
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.send({"op": "shutdown"})
                conn.poll(STOP_WAIT_S)
            except (EOFError, OSError):
                pass
            conn.close()
        if self.process is not None:
            try:
                self.process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            os.close(lifeline)


def write_adapter(folder: Path, tensors: Dict[str, torch.Tensor], config: Dict[str, Any]) -> Path:
    """A LoRA adapter as peft saves it (`adapter_model.safetensors`, `adapter_config.json`) in `folder`, which vLLM
    loads."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(config, default=sorted, indent=1))
    return folder


def _absolute(model: str) -> str:
    """`model` as an absolute path where it is a local folder (the server runs in a folder of its own)."""
    return str(Path(model).resolve()) if Path(model).exists() else model


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


WORK_PREFIX = "coati-vllm-"


def work_dir() -> Path:
    """A private folder (in the temporary directory) holding a `src/coati` link, so the servers import coati's source
    and nothing else of this environment's site-packages, and their logs by default. Its name carries this process's
    id; folders left by processes that are gone (killed with their servers at once) are removed first."""
    parent = Path(tempfile.gettempdir())
    for stale in parent.glob(f"{WORK_PREFIX}*-*"):
        owner = stale.name[len(WORK_PREFIX):].split("-")[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=parent))
    (work / "src").mkdir()
    (work / "src" / "coati").symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
    return work


class VLLMPool(BatchingPool):
    """`num_engines` vLLM servers with the policy, as a `RolloutPool` (`agenerate`) and a weights publisher
    (`publish`), like `GeneratorPool`. A request goes to the least-busy server, and each server takes all its waiting
    requests with the same sampling settings as one engine call (`BatchingPool`). `publish` writes the weights once
    and queues a load on every server behind the generations already sent to it, so a rollout in flight finishes on
    the weights it started with, and every completion carries the version its server reports. `seconds` sums
    generation time; `last_sync_seconds` is the last publish's, from writing the weights to the last server's load."""

    def __init__(self, config: VLLMConfig, stop_token_ids: Sequence[int], num_engines: int = 1) -> None:
        self.config, self.stop_token_ids = config, tuple(stop_token_ids)
        self.work_dir = work_dir()
        self.servers = [VLLMServer(config, i, self.work_dir) for i in range(num_engines)]
        self.restarts, self.seconds, self.last_sync_seconds = 0, 0.0, 0.0
        self._workers = [ThreadPoolExecutor(1, thread_name_prefix=f"vllm-{i}") for i in range(num_engines)]
        self._start_queues(num_engines)
        self._shared: Optional[SharedWeights] = None
        self._adapter: Optional[Dict[str, Any]] = None   # the load request of the newest adapter published
        self._probed: Dict[int, List[List[float]]] = {}   # each server's last probe scores
        self._broken: Optional[EngineSyncError] = None
        self._lock = threading.Lock()
        self._closing = False   # set by `shutdown`: a server that stops answering then is not restarted
        try:
            for server in self.servers:   # every server loads its model at the same time
                server.launch()
            for server in self.servers:
                self._ready(server)
        except BaseException:
            self.shutdown()
            raise

    def _ready(self, server: VLLMServer) -> None:
        try:
            server.wait_ready()
        except _EngineDied as died:
            raise EngineError(f"the vLLM server could not start: {died}; its log: {server.log_path}") from None

    @property
    def start_seconds(self) -> float:
        """How long the slowest server took from launch to ready."""
        return max(server.start_seconds for server in self.servers)

    # ---- requests, with restarts -------------------------------------------------------------------
    def _request(self, index: int, request: Dict[str, Any]) -> Dict[str, Any]:
        """`request` on server `index` (in its worker thread, which maps the weight memory there first); a server that
        died is restarted with the newest weights and the request sent again, while restarts are left."""
        while True:
            if self._broken is not None:
                raise self._broken
            server = self.servers[index]
            try:
                if self._shared is not None and server.attached is not self._shared:
                    server.attach(self._shared)
                return server.call(request)
            except _EngineDied as died:
                self._restart(index, died)

    def _restart(self, index: int, died: _EngineDied) -> None:
        server = self.servers[index]
        with self._lock:
            if self._closing:
                raise EngineError(f"vLLM server {index} was stopped while a request was running (the run is ending)")
            if self.restarts >= self.config.max_restarts:
                raise EngineError(f"vLLM server {index} died ({died}) and the servers have used their "
                                  f"{self.config.max_restarts} restarts (--vllm_max_restarts); stopping the run. Its "
                                  f"log: {server.log_path}") from None
            self.restarts += 1
        server.close()
        self._probed.pop(index, None)
        fresh = VLLMServer(self.config, index, self.work_dir)
        fresh.launch()
        self._ready(fresh)
        if self._shared is not None:
            with self._shared.newest() as newest:
                if newest is not None:
                    fresh.attach(self._shared)
                    fresh.call(self._load_request(*newest))
        with self._lock:
            adapter = self._adapter
        if adapter is not None:
            fresh.call(adapter)
        self.servers[index] = fresh

    # ---- generation --------------------------------------------------------------------------------
    async def _generate_batch(self, index: int, requests: List[Tuple[List[int], int]], config: Any,
                              images: Optional[List[Any]] = None) -> List[Any]:
        """One engine call on server `index` (in its worker thread, behind the loads queued before it); image inputs
        are refused (vision-language policies generate on the `hf` engine)."""
        if images is not None:
            raise ValueError("the vLLM pool takes no image inputs: a vision-language policy generates on the hf engine")
        message = {"op": "generate", "prompts": [prompt for prompt, _ in requests], "n": [n for _, n in requests],
                   "sampling": {**asdict(config), "stop_token_ids": list(config.stop_token_ids or self.stop_token_ids)}}
        start = time.perf_counter()
        answer = await asyncio.get_running_loop().run_in_executor(self._workers[index], self._request, index, message)
        self.seconds += time.perf_counter() - start
        return [Completions.of([tokens for tokens, _ in group], [logps for _, logps in group], answer["version"])
                for group in answer["completions"]]

    # ---- weights -----------------------------------------------------------------------------------
    def publish(self, weights: Dict[str, Any], version: int,
                probe: Optional[ProbeCheck] = None) -> "Future[List[Dict[str, Any]]]":
        """Copy `weights` into the shared memory as version `version` and queue its load on every server (behind what
        each is already generating), each followed by the `probe`; the future completes with every server's answer
        (with `probe_diff` and `probe_seconds`) once all have loaded it. A server that fails the probe fails the future
        and every later request (`EngineSyncError`), so nothing is generated on weights that were not synced."""
        start = time.perf_counter()
        if self._shared is None:
            self._shared = SharedWeights(weights)
        elif not self._shared.fits(weights):
            raise ValueError("the published weights' names, dtypes or shapes differ from the first publish's")
        slot = self._shared.write(weights, version)
        with self._lock:
            self._adapter = None   # the whole policy: a restarted server loads no adapter over it
        loads = self._load_everywhere(self._load_request(slot, version), start, probe)
        self._shared.reuse_after(slot, loads)
        return loads

    @property
    def takes_adapters(self) -> bool:
        """Whether the servers serve LoRA adapters, so a LoRA policy may be published as its adapters alone."""
        return self.config.max_lora_rank > 0

    def publish_adapter(self, tensors: Dict[str, torch.Tensor], config: Dict[str, Any], version: int,
                        probe: Optional[ProbeCheck] = None) -> "Future[List[Dict[str, Any]]]":
        """Send a LoRA adapter (its tensors and config under peft's names) as version `version`: every server serves
        it over the base weights it holds, in place of the adapter before; otherwise as `publish`. Its files are
        written to the pool's work folder and removed once every server serves a newer version."""
        start = time.perf_counter()
        path = write_adapter(self.work_dir / "adapters" / f"v{version}", tensors, config)
        request = {"op": "load_adapter", "path": str(path), "version": version}
        with self._lock:
            self._adapter = request   # what a restarted server loads
        loads = self._load_everywhere(request, start, probe)
        loads.add_done_callback(lambda _: self._remove_adapters_before(version))
        return loads

    def _remove_adapters_before(self, version: int) -> None:
        for folder in (self.work_dir / "adapters").glob("v*"):
            if int(folder.name[1:]) < version:
                shutil.rmtree(folder, ignore_errors=True)

    def _load_everywhere(self, request: Dict[str, Any], published: float,
                         probe: Optional[ProbeCheck]) -> "Future[List[Dict[str, Any]]]":
        """Queue `request` (a load) on every server behind what each is generating, each followed by the `probe`."""
        with self._lock:
            self.last_sync_seconds = 0.0
        return all_of([worker.submit(self._load, index, request, published, probe)
                       for index, worker in enumerate(self._workers)])

    def _load_request(self, slot: int, version: int) -> Dict[str, Any]:
        return {"op": "load_weights", "layout": self._shared.layout, "base": slot * self._shared.slot_bytes,
                "version": version}

    def _load(self, index: int, request: Dict[str, Any], published: float,
              probe: Optional[ProbeCheck]) -> Dict[str, Any]:
        """Server `index` runs the load `request`, then scores the `probe`; the seconds since `published` (the copy
        began) until the load are the publish's sync time."""
        answer = self._request(index, request)
        with self._lock:
            self.last_sync_seconds = max(self.last_sync_seconds, time.perf_counter() - published)
        if probe is not None:
            answer = {**answer, **self._probe(index, probe)}
        return answer

    def _probe(self, index: int, probe: ProbeCheck) -> Dict[str, float]:
        """Server `index` scores the probe, checked against the trainer's log-probs (and its own previous scores)."""
        start = time.perf_counter()
        served = self._request(index, {"op": "score", "prompts": probe.sequences})["logprobs"]
        try:
            difference = probe.verify(served, self._probed.get(index))
        except EngineSyncError as error:
            self._broken = error
            raise
        self._probed[index] = served
        return {"probe_diff": difference, "probe_seconds": time.perf_counter() - start + probe.seconds}

    def pids(self) -> List[int]:
        return [server.process.pid for server in self.servers]

    def shutdown(self) -> None:
        """Stop every server, free the weight memory and remove the work folder."""
        with self._lock:
            self._closing = True
        for worker in self._workers:
            worker.shutdown(wait=False, cancel_futures=True)
        for server in self.servers:
            server.close()
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        shutil.rmtree(self.work_dir, ignore_errors=True)
