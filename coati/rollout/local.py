"""Synchronous rollouts through the same workflows as asynchronous ones: a `RolloutPool` over the training
model, and a function that runs a workflow on a batch of prompts to completion."""
import asyncio
import itertools
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set

import torch

from coati.models.generation import HFEngine
from coati.config import SamplingConfig

from .pool import Completions, ImageInputs, RolloutPool, generate_requests, requests_images
from .probe import ProbeCheck
from .workflow import RolloutWorkflow, Trajectory


@dataclass
class _Request:
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
        self._pending: List[_Request] = []
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
        self._pending.append(_Request(list(prompt_ids), config, n, seat, future, image_inputs))
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


def run_episodes(workflow: RolloutWorkflow, pool: RolloutPool, samples: Sequence[Dict[str, Any]],
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> List[Optional[Trajectory]]:
    """`workflow`'s episode for every sample, run concurrently against `pool` until all are done (None where
    the workflow dropped one), in the samples' order; on `loop` when given (a loop kept across calls keeps its
    worker threads), else on a new one."""
    async def every() -> List[Optional[Trajectory]]:
        return list(await asyncio.gather(*(workflow.arun_episode(pool, sample) for sample in samples)))

    return loop.run_until_complete(every()) if loop is not None else asyncio.run(every())
