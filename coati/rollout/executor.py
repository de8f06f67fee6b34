"""Runs rollout workflows concurrently against the generators, within a concurrency bound and a
staleness bound, on an asyncio loop in a thread of its own (so rollouts go on while the trainer trains).

Bounds, with B = `batch_size` trajectories per batch, C = `batches_per_version` batches the trainer takes
between two weight updates, v = the trainer's policy version (its weight updates so far) and
K = `max_staleness`:

- at most `max_concurrent_rollouts` workflows run at once;
- a rollout starts only while the rollouts started and not dropped number fewer than (K + v + 1) * C * B,
  so generation runs at most K versions ahead of the trainer;
- a finished trajectory whose weights version is below v - K when a batch is taken is dropped
  (`dropped` counts them), its place is given back and its prompt is rolled out again first. A rollout in flight
  during a weight update finishes on the weights it started with and carries that version; it is trained on if
  still within K.

The prompts handed out and not yet trained on (running, finished, or dropped and waiting to run again) are
`pending_samples()`: a checkpoint records them, and a resumed run rolls them out before any new prompt
(`PromptStream.replay`), so every prompt of an epoch is trained on exactly once however the run was stopped.
"""
import asyncio
import dataclasses
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .pool import RolloutPool
from .workflow import RolloutWorkflow, Trajectory

MAX_EVENTS = 100_000


@dataclass
class RolloutEvent:
    """One thing the executor did: `start`, `finish`, `drop` (too stale) or `take` (into a batch), with the
    counts right after it."""

    kind: str
    rollout: int
    trainer_version: int
    in_flight: int
    accepted: int
    generated_by: Optional[int] = None


PromptId = Tuple[int, int]
"""A prompt handed out by a `PromptStream`: (the pass over the prompt set, the row's index in it)."""


class PromptRow(dict):
    """A prompt-dataset row as a `PromptStream` hands it out: the row's columns (what workflows read), and its
    `prompt_id`, kept out of the columns so that reward functions, which get the columns, never see it."""

    def __init__(self, columns: Dict[str, Any], prompt_id: PromptId) -> None:
        super().__init__(columns)
        self.prompt_id = prompt_id


class PromptStream:
    """Rows of a prompt dataset in a seeded order, reshuffled every epoch, with a position a checkpoint
    restores (`state`, `restore`); rows to hand out again first (`replay`: the prompts a killed run had handed out
    and not trained on). `collate` makes each row what workflows take, as the synchronous prompt loader's does
    (`PromptRows`: the prompt cut to `max_length`, a vision-language prompt's image inputs made)."""

    def __init__(self, dataset: Sequence[Dict[str, Any]], seed: int,
                 collate: Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]] = list) -> None:
        if len(dataset) == 0:
            raise ValueError("the prompt dataset is empty")
        self.dataset, self.seed, self.collate = dataset, seed, collate
        self.epoch, self.index = 0, 0
        self._order: Optional[torch.Tensor] = None
        self._replay: Deque[PromptId] = deque()

    def next(self) -> PromptRow:
        if self._replay:
            return self.row(self._replay.popleft())
        if self.index == len(self.dataset):
            self.epoch, self.index, self._order = self.epoch + 1, 0, None
        if self._order is None:
            self._order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        row = self.row((self.epoch, int(self._order[self.index])))
        self.index += 1
        return row

    def row(self, prompt_id: PromptId) -> PromptRow:
        return PromptRow(self.collate([self.dataset[prompt_id[1]]])[0], prompt_id)

    def replay(self, prompt_ids: Iterable[Sequence[int]]) -> None:
        """Hand out these prompts (in this order) before any further one."""
        self._replay.extend((int(epoch), int(index)) for epoch, index in prompt_ids)

    def state(self) -> Dict[str, int]:
        return {"prompt_epoch": self.epoch, "prompt_index": self.index}

    def restore(self, state: Dict[str, int]) -> None:
        self.epoch, self.index, self._order = state.get("prompt_epoch", 0), state.get("prompt_index", 0), None


class WorkflowExecutor:
    """`prepare_batch(next_sample)`: asynchronous mode; keeps as many rollouts running as the bounds
    allow and returns the next B finished trajectories (generation goes on while the caller trains).
    `rollout_batch(samples)`: synchronous mode; runs exactly these samples and waits for them all.
    `set_version(v)` after every weight update, which comes every `batches_per_version` batches (GRPO's
    collect steps per episode). A workflow's exception (a generator that could not be restarted) is raised
    in the caller."""

    def __init__(self, pool: RolloutPool, workflow: RolloutWorkflow, batch_size: int, max_concurrent_rollouts: int,
                 max_staleness: int, batches_per_version: int = 1) -> None:
        if batch_size < 1 or max_concurrent_rollouts < 1 or max_staleness < 0 or batches_per_version < 1:
            raise ValueError("batch_size, max_concurrent_rollouts and batches_per_version must be >= 1 and "
                             "max_staleness >= 0")
        self.pool, self.workflow = pool, workflow
        self.batch_size, self.max_concurrent, self.max_staleness = batch_size, max_concurrent_rollouts, max_staleness
        self.batches_per_version = batches_per_version
        self.version = 0
        self.dropped = 0
        self.events: Deque[RolloutEvent] = deque(maxlen=MAX_EVENTS)
        self._cond = threading.Condition()
        self._in_flight = self._accepted = self._started = 0
        self._done: Deque[Trajectory] = deque()
        self._samples: Dict[int, Dict[str, Any]] = {}   # by rollout number: running or finished, not yet taken
        self._retry: Deque[Dict[str, Any]] = deque()      # samples whose trajectories were dropped as too stale
        self._error: Optional[BaseException] = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-executor", daemon=True)
        self._thread.start()

    # ---- asynchronous mode ------------------------------------------------------------------------
    def capacity(self) -> int:
        """How many more rollouts may start now."""
        per_version = self.batches_per_version * self.batch_size
        by_staleness = (self.max_staleness + self.version + 1) * per_version - self._accepted
        return min(self.max_concurrent - self._in_flight, by_staleness)

    def prepare_batch(self, next_sample: Callable[[], Dict[str, Any]]) -> List[Trajectory]:
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                self._drop_stale()
                while self.capacity() > 0:
                    self._start(self._retry.popleft() if self._retry else next_sample())
                if len(self._done) >= self.batch_size:
                    return self._take(self.batch_size)
                self._cond.wait(timeout=1.0)

    def set_version(self, version: int) -> None:
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def _log(self, kind: str, rollout: int, generated_by: Optional[int] = None) -> None:
        self.events.append(RolloutEvent(kind, rollout, self.version, self._in_flight, self._accepted, generated_by))

    def pending_samples(self) -> List[Dict[str, Any]]:
        """The samples handed to this executor whose trajectories are not yet taken into a batch, in the order they
        started (those to run again after a drop last)."""
        with self._cond:
            return [self._samples[rollout] for rollout in sorted(self._samples)] + list(self._retry)

    def _start(self, sample: Dict[str, Any]) -> None:
        rollout, self._started = self._started, self._started + 1
        self._samples[rollout] = sample
        self._in_flight += 1
        self._accepted += 1
        self._log("start", rollout)
        asyncio.run_coroutine_threadsafe(self._run(rollout, sample), self._loop)

    async def _run(self, rollout: int, sample: Dict[str, Any]) -> None:
        try:
            trajectory = await self.workflow.arun_episode(self.pool, sample)
        except Exception as error:   # handed to the trainer's thread, which raises it
            with self._cond:
                self._in_flight -= 1
                self._error = error
                self._cond.notify_all()
            return
        with self._cond:
            self._in_flight -= 1
            if trajectory is None:
                self._accepted -= 1
                del self._samples[rollout]
            else:
                self._done.append(dataclasses.replace(trajectory, rollout=rollout,
                                                      prompt_id=getattr(sample, "prompt_id", None)))
            self._log("finish", rollout, None if trajectory is None else trajectory.version)
            self._cond.notify_all()

    def _drop_stale(self) -> None:
        fresh = deque()
        for trajectory in self._done:
            if trajectory.version < self.version - self.max_staleness:
                self._accepted -= 1
                self.dropped += 1
                self._retry.append(self._samples.pop(trajectory.rollout))
                self._log("drop", trajectory.rollout, trajectory.version)
            else:
                fresh.append(trajectory)
        self._done = fresh

    def _take(self, n: int) -> List[Trajectory]:
        batch = [self._done.popleft() for _ in range(n)]
        for trajectory in batch:
            del self._samples[trajectory.rollout]
            self._log("take", trajectory.rollout, trajectory.version)
        return batch

    # ---- synchronous mode -------------------------------------------------------------------------
    def rollout_batch(self, samples: Sequence[Dict[str, Any]]) -> List[Trajectory]:
        """Every sample's trajectory (those a workflow dropped left out), at most `max_concurrent_rollouts` at once."""
        return asyncio.run_coroutine_threadsafe(self._gather(samples), self._loop).result()

    async def _gather(self, samples: Sequence[Dict[str, Any]]) -> List[Trajectory]:
        limit = asyncio.Semaphore(self.max_concurrent)

        async def one(sample: Dict[str, Any]) -> Optional[Trajectory]:
            async with limit:
                return await self.workflow.arun_episode(self.pool, sample)

        results = await asyncio.gather(*(one(sample) for sample in samples))
        return [trajectory for trajectory in results if trajectory is not None]

    def shutdown(self) -> None:
        """Cancel the rollouts still running and stop the loop."""
        asyncio.run_coroutine_threadsafe(_cancel_others(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


async def _cancel_others() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
