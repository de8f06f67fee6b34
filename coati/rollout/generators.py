"""The pool of Ray actors that each hold a copy of the policy (`GeneratorPool`, a `RolloutPool`): it sends them
requests, publishes new weights to them and replaces one that dies; `BatchingPool`, its request queues and partial
rollouts, is shared with vLLM's pool.

Weights travel through Ray's object store: the trainer puts one CPU state dict, every generator reads
it (zero-copy on the same node). It needs no process group shared by trainer ranks and generators, so
generators can come and go (a restart is a new actor that reads the newest weights) and the trainer's
torchrun/colossalai group stays as it is. A collective broadcast would move weights faster between GPUs;
it would tie the generators' lifetime to the trainer's group.
"""
import asyncio
import os
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from coati.models.generation import HFEngine
from coati.models.vision import auto_model_class
from coati.config import SamplingConfig

from .pool import Completions, ImageInputs, RolloutPool, Sampled, all_of, generate_requests, requests_images
from .probe import ProbeCheck

MAX_SESSIONS = 4096
"""Sessions a pool remembers the generator of (a conversation's turns go to one generator)."""


class GeneratorError(RuntimeError):
    """A generator died more often than the pool may restart it; the run stops."""


class GeneratorWorker:
    """What runs inside one Ray actor: the HF model loaded from `model_path` with its LM head (a causal LM, or a
    vision-language model, which generates from image inputs too), generating with `HFEngine`."""

    def __init__(self, model_path: str, pad_token_id: int, stop_token_ids: Sequence[int], seed: int, threads: int) -> None:
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.model = auto_model_class(model_path).from_pretrained(model_path).eval()
        self.engine = HFEngine(self.model, pad_token_id, stop_token_ids)
        self.version = 0

    def generate(self, prompt_ids: List[int], config: SamplingConfig, n: int) -> Completions:
        return self.generate_many([(prompt_ids, n)], config)[0]

    def generate_many(self, requests: List[Tuple[List[int], int]], config: SamplingConfig,
                      images: Optional[List[ImageInputs]] = None) -> List[Completions]:
        """Completions for several (prompt, n) requests in one batched generation, with their log-probs; `images`,
        each request's image inputs."""
        return generate_requests(self.engine, requests, config, self.version, logprobs=True, images=images)

    def load_weights(self, state_dict: Dict[str, torch.Tensor], version: int) -> int:
        self.model.load_state_dict(state_dict)
        self.version = version
        return version

    def pid(self) -> int:
        return os.getpid()


def start_ray() -> None:
    """Connect to the Ray cluster RAY_ADDRESS names, or start a local one on the loopback address for
    this process's generators; nothing when Ray is already up. A local cluster runs its workers at normal
    CPU priority: Ray's default (nice 15) starves a generator sharing cores with the trainer."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")   # Ray forks after tokenizers ran: each fork would warn
    local = {} if os.environ.get("RAY_ADDRESS") else {"_node_ip_address": "127.0.0.1",
                                                      "_system_config": {"worker_niceness": 0}}
    ray.init(include_dashboard=False, logging_level="WARNING", **local)


@dataclass
class _Request:
    prompt_ids: List[int]
    config: SamplingConfig
    n: int
    future: asyncio.Future
    image_inputs: Optional[ImageInputs] = None


@dataclass
class _Partial:
    """One completion of a partial rollout so far: its tokens, their log-probs and versions, and whether its last
    chunk came back shorter than asked (it stopped)."""

    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    stopped: bool = False

    def extend(self, out: Completions, row: int, asked: int) -> None:
        tokens, logprobs, versions = out.rows[row]
        self.tokens += tokens
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)
        self.versions += versions
        self.stopped = len(tokens) < asked

    def finished(self, stops: Set[int], max_new_tokens: int) -> bool:
        return self.stopped or len(self.tokens) >= max_new_tokens or bool(self.tokens and self.tokens[-1] in stops)


def _joined(parts: List[_Partial]) -> Completions:
    """The partial rollouts' completions as one `Completions`; its version is their oldest tokens'."""
    first = min((part.versions[0] for part in parts if part.versions), default=0)
    return Completions([Sampled(p.tokens, p.logprobs, p.versions) for p in parts], first)


class BatchingPool(RolloutPool):
    """Requests queued per generator of a pool: `agenerate` queues one for the least-busy generator, and that
    generator's dispatcher sends it all the requests waiting for it with the same sampling settings as one batch
    (`_generate_batch`), which is what keeps a CPU or GPU generator efficient. A request whose rollout was cancelled
    (an executor shut down) is dropped before it is sent; a batch that fails fails each of its requests. The pool
    serves one event loop (one executor) at a time.

    Partial rollouts (`chunk_tokens` > 0, AReaL's interruptible generation): a completion is generated
    `chunk_tokens` at a time, each chunk going on from the tokens so far on whatever weights the generator holds by
    then. A weight update, which a generator loads after the requests it already holds, so waits for one chunk
    instead of whole completions; each token keeps the version and log-prob of the weights that made it
    (`Sampled.versions`)."""

    chunk_tokens: int = 0
    stop_token_ids: Tuple[int, ...] = ()

    def _start_queues(self, count: int) -> None:
        self._queues: List[List[_Request]] = [[] for _ in range(count)]
        self._dispatchers: List[Optional[asyncio.Task]] = [None] * count
        self._sessions: "OrderedDict[str, int]" = OrderedDict()

    async def agenerate(self, prompt_ids: List[int], config: SamplingConfig, n: int,
                        session: Optional[str] = None, seat: Optional[int] = None,
                        image_inputs: Optional[ImageInputs] = None) -> Completions:
        if 0 < self.chunk_tokens < config.max_new_tokens:
            return await self._in_chunks(list(prompt_ids), config, n, session, image_inputs)
        return await self._queued(list(prompt_ids), config, n, session, image_inputs)

    async def _in_chunks(self, prompt: List[int], config: SamplingConfig, n: int, session: Optional[str],
                         image_inputs: Optional[ImageInputs]) -> Completions:
        """`n` completions of `prompt`, `chunk_tokens` at a time: the first chunk as one request of n, then each
        unfinished completion's next chunk from its own tokens so far (one request each, batched together)."""
        stops = set(config.stop_token_ids or self.stop_token_ids)
        parts = [_Partial() for _ in range(n)]
        first = await self._queued(prompt, replace(config, max_new_tokens=self.chunk_tokens), n, session, image_inputs)
        for row, part in enumerate(parts):
            part.extend(first, row, self.chunk_tokens)
        while True:
            open_parts = [part for part in parts if not part.finished(stops, config.max_new_tokens)]
            if not open_parts:
                return _joined(parts)
            asks = [min(self.chunk_tokens, config.max_new_tokens - len(part.tokens)) for part in open_parts]
            outs = await asyncio.gather(*(self._queued(prompt + part.tokens, replace(config, max_new_tokens=ask), 1,
                                                       session, image_inputs) for part, ask in zip(open_parts, asks)))
            for part, out, ask in zip(open_parts, outs, asks):
                part.extend(out, 0, ask)

    async def _queued(self, prompt_ids: List[int], config: SamplingConfig, n: int, session: Optional[str],
                      image_inputs: Optional[ImageInputs] = None) -> Completions:
        """One request, queued for its generator's dispatcher."""
        index = self._generator_for(session)
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), config, n, loop.create_future(), image_inputs)
        self._queues[index].append(request)
        dispatcher = self._dispatchers[index]
        if dispatcher is None or dispatcher.done():   # a dispatcher cancelled before its first step is done too
            self._dispatchers[index] = loop.create_task(self._dispatch(index))
        return await request.future

    def _generator_for(self, session: Optional[str]) -> int:
        """The generator `session` went to before, else the least busy (remembered for the session's next turns;
        the `MAX_SESSIONS` most recent sessions are kept)."""
        if session in self._sessions:
            self._sessions.move_to_end(session)
            return self._sessions[session]
        index = min(range(len(self._queues)), key=lambda i: sum(not r.future.done() for r in self._queues[i]))
        if session is not None:
            self._sessions[session] = index
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return index

    async def _dispatch(self, index: int) -> None:
        """Send generator `index` its waiting requests, a batch at a time, until none is left."""
        queue = self._queues[index]
        while True:
            queue[:] = [r for r in queue if not r.future.done()]   # answered, failed, or cancelled meanwhile
            if not queue:
                return
            config = queue[0].config
            batch = [r for r in queue if r.config == config]
            try:
                results = await self._generate_batch(index, [(r.prompt_ids, r.n) for r in batch], config,
                                                     requests_images([r.image_inputs for r in batch]))
            except Exception as error:   # every waiting episode of the batch raises it
                results = [error] * len(batch)
            for request, result in zip(batch, results):
                if request.future.done():   # cancelled by an executor shutting down
                    continue
                if isinstance(result, Exception):
                    request.future.set_exception(result)
                else:
                    request.future.set_result(result)

    async def _generate_batch(self, index: int, requests: List[Tuple[List[int], int]], config: SamplingConfig,
                              images: Optional[List[ImageInputs]] = None) -> List[Completions]:
        """Generator `index`'s completions of (prompt, n) `requests`, in order; `images`, each request's image
        inputs (None: none has any)."""
        raise NotImplementedError


class GeneratorPool(BatchingPool):
    """`num_generators` Ray actors with the policy, batching requests per actor (`BatchingPool`). `publish` gives
    every actor new weights, which each loads after the requests it already holds (so a rollout in flight finishes
    on the weights it started with, and says so in its version). An actor that dies is replaced by a new one with
    the newest weights and its request is retried, up to `max_restarts` times in all; after that `agenerate`
    raises `GeneratorError`."""

    def __init__(self, model_path: str, pad_token_id: int, stop_token_ids: Sequence[int], num_generators: int = 1,
                 max_restarts: int = 3, seed: int = 0, threads: int = 1) -> None:
        import ray

        start_ray()
        self._worker_cls = ray.remote(num_cpus=0)(GeneratorWorker)
        self._init_args = (model_path, pad_token_id, tuple(stop_token_ids))
        self.stop_token_ids = tuple(stop_token_ids)
        self._seed, self._threads = seed, threads
        self.max_restarts, self.restarts = max_restarts, 0
        self.version = 0
        self._weights: Optional[Any] = None
        self.actors = [self._spawn(i) for i in range(num_generators)]
        self._start_queues(num_generators)
        self.pids()   # wait until every actor has loaded its model

    def _spawn(self, index: int) -> Any:
        seed = self._seed + 1000 * index + 7919 * self.restarts
        actor = self._worker_cls.remote(*self._init_args, seed, self._threads)
        if self._weights is not None:
            actor.load_weights.remote(self._weights, self.version)
        return actor

    async def _generate_batch(self, index: int, requests: List[Tuple[List[int], int]], config: SamplingConfig,
                              images: Optional[List[ImageInputs]] = None) -> List[Completions]:
        """One batched generation on actor `index`; an actor that died is replaced and the batch sent again."""
        from ray.exceptions import RayActorError

        while True:
            try:
                return await self.actors[index].generate_many.remote(requests, config, images)
            except RayActorError as error:
                self._replace(index, error)

    def _replace(self, index: int, error: Exception) -> None:
        """A new actor in place of dead actor `index` (its dispatcher is the only one that sends to it)."""
        if self.restarts >= self.max_restarts:
            raise GeneratorError(f"generator {index} died and the pool has used its {self.max_restarts} restarts "
                                 f"(--generator_max_restarts); stopping the run. Cause: {str(error).splitlines()[0]}")
        self.restarts += 1
        self.actors[index] = self._spawn(index)

    def publish(self, weights: Dict[str, torch.Tensor], version: int,
                probe: Optional[ProbeCheck] = None) -> "Future[List[Any]]":
        """New weights for every generator, tagged `version`; each loads them after the requests it holds (a strict
        `load_state_dict`, which cannot silently load nothing: no probe is run)."""
        import ray

        self._weights, self.version = ray.put({k: v.detach().cpu() for k, v in weights.items()}), version
        return all_of([actor.load_weights.remote(self._weights, version).future() for actor in self.actors])

    def pids(self) -> List[int]:
        import ray

        return ray.get([actor.pid.remote() for actor in self.actors])

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
