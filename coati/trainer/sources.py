"""Where an on-policy trainer's experience comes from: a component the loop holds, not a subclass of it.

`LocalRollouts` runs a rollout workflow on the training model when the loop asks; `AsyncRollouts` takes batches
from generator processes that run ahead of training (AReaL-style asynchronous RL) and hands them the new
weights after every update. A new way of producing experience (another rollout pool, a remote service) is a new
`RolloutSource`, and every trainer can use it.
"""
import asyncio
import time
from concurrent.futures import Future
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from coati.dataset.collators import prompt_rows
from coati.utils.comm import is_distributed, rank, world_size
from coati.experience.experience import Experience, ExperienceMaker
from coati.models.lora import active_adapter, merged_weights
from coati.utils.ckpt_io import holds_whole_parameters, inner_model, whole_state_dict
from coati.rollout import (LocalPool, PromptStream, RLVRWorkflow, RolloutPool, RolloutWorkflow, Trajectory,
                           WorkflowExecutor, run_episodes)
from coati.utils.stats_tracker import StatsTracker

from .base import move_to_device


class CyclingLoader:
    """Batches from a dataloader with a `StatefulDistributedSampler` (prompt rows, or ptx batches), epoch after
    epoch (reshuffled), with a position (epoch, samples seen in it) that a checkpoint can restore exactly."""

    def __init__(self, dataloader: Any, device: torch.device) -> None:
        self.dataloader, self.device = dataloader, device
        self.epoch, self.seen = 0, 0
        self._iter = None

    def next(self) -> Any:
        while True:
            if self._iter is None:
                self.dataloader.sampler.set_epoch(self.epoch)
                self._iter = iter(self.dataloader)
            try:
                batch = next(self._iter)
            except StopIteration:
                self.epoch, self.seen, self._iter = self.epoch + 1, 0, None
                self.dataloader.sampler.set_start_index(0)
                continue
            if isinstance(batch, list):   # prompt rows (`PromptRows`): read on the host, the engine moves images
                self.seen += len(batch)
                return batch
            self.seen += batch["input_ids"].size(0)
            return move_to_device(batch, self.device)

    def restore(self, epoch: int, seen: int) -> None:
        self.epoch, self.seen, self._iter = epoch, seen, None
        self.dataloader.sampler.set_start_index(seen)


class RolloutSource:
    """What the on-policy loop asks of its experience: `start(episode)` once before the first episode, `next` per
    collect step, `learned(version)` after every episode's updates (the weights are now `version`), `close()`
    when training ends however it ends; `state()`/`restore()` for checkpoints, and how many prompts one pass over
    the data holds (`prompts_per_epoch`, which the logged epoch counts against)."""

    def start(self, episode: int) -> None:
        """Training begins (or resumes) at `episode`."""

    def next(self, episode: int, stats: StatsTracker) -> Experience:
        """One collect step's experience; phase timings and source metrics go to `stats`."""
        raise NotImplementedError

    def learned(self, version: int) -> None:
        """The policy was updated; rollouts from now on may use weights `version` (episodes trained)."""

    def evaluation_pool(self) -> RolloutPool:
        """The rollout pool held-out evaluation generates with, on every rank."""
        raise NotImplementedError

    def prompts_per_epoch(self) -> int:
        raise NotImplementedError

    def state(self) -> Dict[str, Any]:
        return {}

    def restore(self, state: Dict[str, Any]) -> None:
        """Continue from a checkpoint's `state()`."""

    def close(self) -> None:
        """Stop whatever the source started."""


def _ties(trajectory: Trajectory) -> bool:
    """Whether every completion of the group got the same reward (no learning signal)."""
    return bool((trajectory.rewards == trajectory.rewards[0]).all())


def publish_policy(pool: RolloutPool, actor: torch.nn.Module, version: int) -> "Future[Any]":
    """The actor to `pool` as `version`, checked by the pool's sync probe where it has one: its LoRA adapters
    alone where the pool serves adapters, else its HF-named weights (adapters merged in, shards gathered).
    Collective under Gemini and tensor parallelism: every rank calls it."""
    model = inner_model(actor)
    probe = None
    if pool.probe is not None:
        probe = pool.probe.check(model if holds_whole_parameters(actor) else actor, version)
    if pool.takes_adapters:
        return pool.publish_adapter(*active_adapter(actor), version, probe)
    return pool.publish({} if pool.shares_weights else merged_weights(model, whole_state_dict(actor)), version,
                          probe)


def probe_results(answers: Any) -> Dict[str, float]:
    """A publish's probe over the pool's servers: the largest log-prob difference and seconds ({} without one)."""
    probed = [a for a in answers or [] if isinstance(a, dict) and "probe_diff" in a]
    if not probed:
        return {}
    return {"probe_logprob_diff": max(a["probe_diff"] for a in probed),
            "probe_seconds": max(a["probe_seconds"] for a in probed)}


def record_probe(results: Dict[str, float], stats: StatsTracker) -> None:
    """`engine/probe_logprob_diff` and `time/engine_probe` of a publish's probe (`probe_results`, where one ran)."""
    with stats.scope("engine"):
        stats.scalar(probe_logprob_diff=results["probe_logprob_diff"])
    stats.add("time/engine_probe", results["probe_seconds"])


class LocalRollouts(RolloutSource):
    """Synchronous rollouts through the same workflows asynchronous ones run: `workflow` (default: `RLVRWorkflow`
    with the maker's scorer) completes each prompt of the next batch of `prompts` against `pool`, a `RolloutPool`:
    by default a `LocalPool` over the maker's generation engine (the training model, one batched generation per
    batch), or one with weights of its own (`coati.inference.vllm.VLLMPool`). After every update (and at the start of a resumed run) the
    pool is published the actor's weights and waited for, so each batch is generated by the current policy; the
    seconds that takes are logged as `time/weight_sync`. With the maker's `dynamic_sampling` (DAPO), groups whose
    rewards all tie are replaced by groups of further prompts, at most `max_sampling_rounds` more batches; tied
    groups fill what is still missing. The prompts' position is the checkpoint's own."""

    def __init__(self, maker: ExperienceMaker, prompts: CyclingLoader, workflow: Optional[RolloutWorkflow] = None,
                 pool: Optional[RolloutPool] = None) -> None:
        self.maker, self.prompts = maker, prompts
        self.workflow = workflow or RLVRWorkflow(maker.scorer, maker.config.sampling, maker.num_generations)
        self.pool = pool or LocalPool(maker.engine)
        self._sync_seconds: Optional[float] = None
        self._probe: Dict[str, float] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None   # kept across batches, with its worker threads

    def start(self, episode: int) -> None:
        if episode:   # a resumed run's pool starts from the restored weights
            self.learned(episode)

    def learned(self, version: int) -> None:
        start = time.perf_counter()
        self._probe = probe_results(publish_policy(self.pool, self.maker.actor, version).result())
        self._sync_seconds = time.perf_counter() - start - self._probe.get("probe_seconds", 0.0)

    def evaluation_pool(self) -> RolloutPool:
        return self.pool

    def next(self, episode: int, stats: StatsTracker) -> Experience:
        self.pool.seconds = 0.0
        start = time.perf_counter()
        trajectories, extra = self._rollouts(), 0
        if self.maker.config.dynamic_sampling:
            trajectories, extra = self._informative(trajectories)
        seconds = time.perf_counter() - start
        timing = {"generation": self.pool.seconds, "reward": seconds - self.pool.seconds}
        if self._sync_seconds is not None:
            timing["weight_sync"], self._sync_seconds = self._sync_seconds, None
        if self._probe:
            record_probe(self._probe, stats)
            self._probe = {}
        return self.maker.from_trajectories(trajectories, self.prompts.device, timing, extra_rollouts=extra)

    def _rollouts(self) -> List[Trajectory]:
        """The workflow's trajectories of the next prompt batch (those it dropped left out)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        done = run_episodes(self.workflow, self.pool, prompt_rows(self.prompts.next()), self._loop)
        return [trajectory for trajectory in done if trajectory is not None]

    def _informative(self, trajectories: List[Trajectory]) -> Tuple[List[Trajectory], int]:
        """DAPO's dynamic sampling: the groups whose rewards do not all tie, topped up from further prompt batches to
        the batch's size; tied groups fill what is still missing. Also returns the extra completions generated."""
        needed, extra = len(trajectories), 0
        informative: List[Trajectory] = []
        tied: List[Trajectory] = []
        for round_ in range(self.maker.config.max_sampling_rounds + 1):
            if round_:
                trajectories = self._rollouts()
                extra += sum(len(t) for t in trajectories)
            for trajectory in trajectories:
                (tied if _ties(trajectory) else informative).append(trajectory)
            if len(informative) >= needed:
                break
        return (informative + tied)[:needed], extra

    def prompts_per_epoch(self) -> int:
        """Every rank's equal share (the sampler pads the last one)."""
        return self.prompts.dataloader.sampler.total_size

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()
            self._loop = None
        self.pool.shutdown()


class AsyncRollouts(RolloutSource):
    """Rollouts made ahead of training by generator processes. Rank 0 holds the rollout side: a `WorkflowExecutor`
    over a pool of generators and the `PromptStream` (None on the other ranks). Each collect step rank 0
    takes one batch of trajectories (every rank's share) and scatters it; every rank then makes experience from its
    share with the maker (the proximal policy's and the reference's log-probs, advantages, the generators' log-probs
    as behaviour log-probs). `pool` is a `GeneratorPool` or a `coati.inference.vllm.VLLMPool`. After each update
    rank 0 publishes the actor's weights to the generators and raises the executor's version, so generation stays at
    most `max_staleness` versions ahead. `prompts_per_epoch` is the prompt set's size (the stream draws each prompt
    once per pass)."""

    def __init__(self, maker: ExperienceMaker, actor: torch.nn.Module, prompts_per_epoch: int,
                 executor: Optional[WorkflowExecutor] = None, pool: Optional[Any] = None,
                 stream: Optional[PromptStream] = None) -> None:
        if rank() == 0 and (executor is None or pool is None or stream is None):
            raise ValueError("rank 0 needs the executor, the generator pool and the prompt stream")
        self.maker, self.actor, self._prompts_per_epoch = maker, actor, prompts_per_epoch
        self.executor, self.pool, self.stream = executor, pool, stream
        self.device = next(actor.parameters()).device
        self._evaluation_pool = LocalPool(maker.engine)
        self._publishing: Optional["Future[Any]"] = None

    def evaluation_pool(self) -> RolloutPool:
        """The training model itself: the generators run on rank 0 only, and evaluation runs on every rank."""
        return self._evaluation_pool

    def start(self, episode: int) -> None:
        self.learned(episode)   # a resumed run's generators start from the restored weights

    def next(self, episode: int, stats: StatsTracker) -> Experience:
        with stats.record_timing("rollout_wait"):
            trajectories = self._scatter(self.executor.prepare_batch(self.stream.next) if self.executor else None)
        experience = self.maker.from_trajectories(trajectories, self.device)
        self._record_staleness(experience, episode, stats)
        self._record_publish(stats)
        return experience

    def _scatter(self, batch: Optional[List[Trajectory]]) -> List[Trajectory]:
        """Rank r's contiguous share of rank 0's batch."""
        if not is_distributed() or world_size() == 1:
            return batch
        share = None
        if rank() == 0:
            per_rank = len(batch) // world_size()
            share = [batch[r * per_rank:(r + 1) * per_rank] for r in range(world_size())]
        received: List[Any] = [None]
        dist.scatter_object_list(received, share, src=0)
        return received[0]

    def _record_staleness(self, experience: Experience, episode: int, stats: StatsTracker) -> None:
        """How many versions behind the trainer each trained sample's weights were (its oldest tokens'), each trained
        token's (`staleness@token`: partial rollouts continue completions on newer weights), and the executor's
        drops."""
        lag = (episode - experience.versions).float().cpu()
        token_lag = (episode - experience.token_versions).float().cpu()
        with stats.scope("rollout"):
            stats.denominator(trained=torch.ones_like(lag, dtype=torch.bool),
                              token=experience.action_mask.bool().cpu())
            stats.stat(denominator="trained", staleness=lag)
            stats.stat(denominator="token", staleness=token_lag)
            if self.executor is not None:
                stats.scalar(dropped_stale=float(self.executor.dropped))

    def learned(self, version: int) -> None:
        """Rank 0 sends the actor's weights to the generators as `version` and moves the executor on."""
        if self.pool is None:
            return
        self._publishing = publish_policy(self.pool, self.actor, version)
        self.executor.set_version(version)

    def _record_publish(self, stats: StatsTracker) -> None:
        """The last publish's probe, once it is done; its failure (a probe that failed) ends the run here."""
        if self._publishing is not None and self._publishing.done():
            results, self._publishing = probe_results(self._publishing.result()), None
            if results:
                record_probe(results, stats)

    def prompts_per_epoch(self) -> int:
        return self._prompts_per_epoch

    def state(self) -> Dict[str, Any]:
        """The stream's position and the prompts handed out but not trained on (running, or finished and waiting)."""
        if self.stream is None:
            return {}
        return {**self.stream.state(), "pending_prompts": [list(s.prompt_id) for s in self.executor.pending_samples()]}

    def restore(self, state: Dict[str, Any]) -> None:
        """The stream goes on from the checkpoint's position, after the prompts pending then, so that none of an
        epoch is skipped or trained twice."""
        if self.stream is not None:
            self.stream.restore(state)
            self.stream.replay(state.get("pending_prompts", []))

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()
            self.pool.shutdown()
