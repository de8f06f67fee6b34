"""Synchronous rollouts through the same workflows as asynchronous ones: a `RolloutEngine` over the training
model, and a function that runs a workflow on a batch of prompts to completion."""
import asyncio
import time
from concurrent.futures import Future
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from coati.models.generation import HFEngine
from coati.config import SamplingConfig

from .engine import Completions, RolloutEngine, generate_requests
from .workflow import RolloutWorkflow, Trajectory

_Request = Tuple[List[int], SamplingConfig, int, asyncio.Future]


class LocalEngine(RolloutEngine):
    """`RolloutEngine` over an in-process `HFEngine` (the training model). The requests made while the event loop
    runs one turn (a workflow's episodes over a prompt batch) are generated together, one batched generation per
    sampling config, as the batch would be. It reports no log-probs: on-policy, the trainer's own forward gives
    them. It shares the trainer's weights, so `publish` only moves `version`."""

    def __init__(self, engine: HFEngine, version: int = 0) -> None:
        self.engine, self.version, self.seconds = engine, version, 0.0
        self._pending: List[_Request] = []

    def publish(self, weights: Dict[str, torch.Tensor], version: int) -> "Future[None]":
        self.version = version
        done: "Future[None]" = Future()
        done.set_result(None)
        return done

    async def agenerate(self, prompt_ids: List[int], config: SamplingConfig, n: int,
                        session: Optional[str] = None) -> Completions:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((list(prompt_ids), config, n, future))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        start = time.perf_counter()
        while pending:
            config = pending[0][1]
            batch = [r for r in pending if r[1] == config]
            pending = [r for r in pending if r[1] != config]
            try:
                results = generate_requests(self.engine, [(prompt, n) for prompt, _, n, _ in batch], config, self.version)
            except Exception as error:   # the awaiting episodes raise it
                for *_, future in batch:
                    future.set_exception(error)
                continue
            for (*_, future), result in zip(batch, results):
                future.set_result(result)
        self.seconds += time.perf_counter() - start


def run_episodes(workflow: RolloutWorkflow, engine: Any, samples: Sequence[Dict[str, Any]],
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> List[Optional[Trajectory]]:
    """`workflow`'s episode for every sample, run concurrently against `engine` until all are done (None where
    the workflow dropped one), in the samples' order; on `loop` when given (a loop kept across calls keeps its
    worker threads), else on a new one."""
    async def every() -> List[Optional[Trajectory]]:
        return list(await asyncio.gather(*(workflow.arun_episode(engine, sample) for sample in samples)))

    return loop.run_until_complete(every()) if loop is not None else asyncio.run(every())
