"""Rollout pools: what workflows generate with, one or more copies of the policy that take unpadded requests as
they come (`RolloutPool`), as distinct from a generation engine (`coati.models.generation.GenerationEngine`, such as
`HFEngine`), which completes one padded batch with one model. Here, the pool over the training model in this process
(`LocalPool`, a synchronous run's) and the batched generation every `HFEngine`-backed pool makes; the pool of Ray
generator actors is `coati.rollout.generators`, vLLM's `coati.inference.vllm`.
"""
import asyncio
import itertools
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import torch

from coati.models.generation import HFEngine
from coati.config import SamplingConfig

from .probe import ProbeCheck, SyncProbe

ImageInputs = Dict[str, torch.Tensor]
"""A vision-language prompt's image inputs, as `ImageProcessing.pixel_inputs` makes them."""


class Sampled(NamedTuple):
    """One completion as a pool returns it, unpadded: its token ids, their log-probs under the generating weights (None
    from an engine that reports none: the training model itself, whose own forward gives them) and the weights
    version that made each token (partial rollouts continue a completion on newer weights)."""

    token_ids: List[int]
    logprobs: Optional[List[float]]
    versions: List[int]


@dataclass(frozen=True)
class Completions:
    """`rows`: completions of one prompt (`Sampled`, unpadded), and `version`, the weights version of their oldest
    tokens."""

    rows: List[Sampled]
    version: int

    @classmethod
    def of(cls, tokens: Sequence[List[int]], logprobs: Optional[Sequence[List[float]]], version: int) -> "Completions":
        """Completions all made by weights `version` (`logprobs` None from an engine that reports none)."""
        return cls([Sampled(list(ids), None if logprobs is None else list(logprobs[i]), [version] * len(ids))
                    for i, ids in enumerate(tokens)], version)


class RolloutPool(ABC):
    """What a workflow generates with: the training model in this process (`LocalPool`), Ray generator actors
    (`coati.rollout.generators.GeneratorPool`) or vLLM servers (`coati.inference.vllm.VLLMPool`). `version` is the weights' version new
    requests are generated with; `seconds` sums the time spent generating."""

    version: int = 0
    seconds: float = 0.0
    probe: Optional[SyncProbe] = None
    """The sync probe its publishes are checked with (a pool with weights of its own that can score sequences)."""
    shares_weights: bool = False
    """True for a pool over the trainer's own model: a publish hands it no weights (only the version)."""
    takes_adapters: bool = False
    """True for a pool that serves LoRA adapters over its own base weights (`publish_adapter`): a LoRA policy is
    published as its adapters alone."""

    @abstractmethod
    async def agenerate(self, prompt_ids: List[int], config: SamplingConfig, n: int,
                        session: Optional[str] = None, seat: Optional[int] = None,
                        image_inputs: Optional[ImageInputs] = None) -> Completions:
        """`n` completions of one unpadded prompt. Requests that name the same `session` (the turns of one
        conversation) go to the same copy of the model where the pool holds several, so its prefix cache holds
        the conversation. `seat` is the asking conversation's seat (`take_seat`), if it holds one. `image_inputs`:
        a vision-language prompt's (`ImageProcessing.pixel_inputs`); a pool whose engine takes no images refuses
        them."""

    def take_seat(self) -> Optional[int]:
        """A seat for a conversation that will ask for further turns after work of its own (tool calls). A pool
        that generates in lockstep (`LocalPool`, a synchronous run's) waits before each batch until every seated
        conversation has asked or left, and orders the batch by seat, so how long tools take changes neither a
        batch nor its sampling. None from a pool that seats no one (it batches what arrives)."""
        return None

    def leave_seat(self, seat: Optional[int]) -> None:
        """The conversation at `seat` asks for no more turns."""

    @abstractmethod
    def publish(self, weights: Dict[str, torch.Tensor], version: int, probe: Optional[ProbeCheck] = None) -> "Future[Any]":
        """New weights, tagged `version`, for every copy of the model the pool holds; the future completes once
        each serves them (at once for a pool that shares the trainer's weights), failing where a copy fails the
        `probe` (`coati.rollout.probe`)."""

    def shutdown(self) -> None:
        """Stop what the pool started."""


def all_of(futures: Sequence["Future[Any]"]) -> "Future[List[Any]]":
    """One future for several: done when all are, with their results in order, or the first exception."""
    combined: "Future[List[Any]]" = Future()
    pending, lock = [len(futures)], threading.Lock()
    if not futures:
        combined.set_result([])

    def finished(_: Future) -> None:
        with lock:
            pending[0] -= 1
            last = pending[0] == 0
        if last:   # a future cancelled (a pool shut down with loads queued) counts as its CancelledError
            errors = [CancelledError() if f.cancelled() else f.exception() for f in futures]
            errors = [error for error in errors if error is not None]
            if errors:
                combined.set_exception(errors[0])
            else:
                combined.set_result([f.result() for f in futures])
    for future in futures:
        future.add_done_callback(finished)
    return combined


def requests_images(image_inputs: Sequence[Optional[ImageInputs]]) -> Optional[List[ImageInputs]]:
    """Each of a batch's requests' image inputs ({} for a request without), or None where no request has any."""
    return [inputs or {} for inputs in image_inputs] if any(image_inputs) else None


@torch.no_grad()
def generate_requests(engine: HFEngine, requests: Sequence[Tuple[List[int], int]], config: SamplingConfig,
                      version: int, logprobs: bool = False,
                      images: Optional[Sequence[ImageInputs]] = None) -> List[Completions]:
    """Completions for several (prompt, n) requests in one batched generation (prompts left-padded for the engine, each
    completion handed back unpadded), marked as made by weights `version`; with `logprobs`, their tokens' log-probs
    under the generating weights (else None); `images`, each request's image inputs (a vision-language model's)."""
    prompts = [list(prompt) for prompt, n in requests for _ in range(n)]
    rows_images = None if images is None else [images[i] for i, (_, n) in enumerate(requests) for _ in range(n)]
    width = max(len(p) for p in prompts)
    pad = engine.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    device = next(engine.model.parameters()).device
    out = engine.generate(ids.to(device), mask.to(device), config, logprobs=logprobs, images=rows_images)
    generated, action_mask = out.sequences[:, out.prompt_length:], out.action_mask.bool()
    tokens = [row[m].tolist() for row, m in zip(generated, action_mask)]
    logps = None if out.logprobs is None else [row[m].tolist() for row, m in zip(out.logprobs, action_mask)]
    results, row = [], 0
    for _, n in requests:
        results.append(Completions.of(tokens[row:row + n], None if logps is None else logps[row:row + n], version))
        row += n
    return results


@dataclass
class _LocalRequest:
    prompt_ids: List[int]
    config: SamplingConfig
    n: int
    seat: Optional[int]
    future: asyncio.Future
    image_inputs: Optional[ImageInputs] = None


class LocalPool(RolloutPool):
    """`RolloutPool` over an in-process `HFEngine` (the training model), generating in lockstep: the requests made
    while the event loop runs are generated together, one batched generation per sampling config, once every seated
    conversation (`take_seat`) has asked for its turn or left; unseated requests come first, in the order they came,
    then seated ones by seat. So a synchronous run's batches, and the random numbers each row samples with, do not
    depend on how long tools take between turns: the run is reproducible, and resumes exactly. It reports no
    log-probs: on-policy, the trainer's own forward gives them. It shares the trainer's weights, so `publish` only
    moves `version`."""

    shares_weights = True

    def __init__(self, engine: HFEngine, version: int = 0) -> None:
        self.engine, self.version, self.seconds = engine, version, 0.0
        self._pending: List[_LocalRequest] = []
        self._seated: Set[int] = set()
        self._seats = itertools.count()
        self._flush_due = False

    def publish(self, weights: Dict[str, torch.Tensor], version: int,
                probe: Optional[ProbeCheck] = None) -> "Future[None]":
        self.version = version
        done: "Future[None]" = Future()
        done.set_result(None)
        return done

    def take_seat(self) -> int:
        seat = next(self._seats)
        self._seated.add(seat)
        return seat

    def leave_seat(self, seat: Optional[int]) -> None:
        self._seated.discard(seat)
        self._flush_when_all_asked()

    async def agenerate(self, prompt_ids: List[int], config: SamplingConfig, n: int,
                        session: Optional[str] = None, seat: Optional[int] = None,
                        image_inputs: Optional[ImageInputs] = None) -> Completions:
        """As `RolloutPool.agenerate`."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_LocalRequest(list(prompt_ids), config, n, seat, future, image_inputs))
        self._flush_when_all_asked()
        return await future

    def _all_asked(self) -> bool:
        return bool(self._pending) and self._seated <= {r.seat for r in self._pending}

    def _flush_when_all_asked(self) -> None:
        """Generate on the loop's next turn (after the requests made in this one) if every seated conversation waits."""
        if not self._flush_due and self._all_asked():
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if not self._all_asked():   # a conversation took a seat meanwhile: its request completes the batch
            return
        pending = sorted(self._pending, key=lambda r: -1 if r.seat is None else r.seat)
        self._pending = []
        start = time.perf_counter()
        while pending:
            config = pending[0].config
            batch = [r for r in pending if r.config == config]
            pending = [r for r in pending if r.config != config]
            try:
                results = generate_requests(self.engine, [(r.prompt_ids, r.n) for r in batch], config, self.version,
                                            images=requests_images([r.image_inputs for r in batch]))
            except Exception as error:   # the awaiting episodes raise it
                for request in batch:
                    request.future.set_exception(error)
                continue
            for request, result in zip(batch, results):
                request.future.set_result(result)
        self.seconds += time.perf_counter() - start
