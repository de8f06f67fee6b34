"""GRPO whose rollouts run in generator processes while the trainer trains (AReaL-style asynchronous RL).

Rank 0 holds the rollout side: a `WorkflowExecutor` over a `GeneratorPool` of Ray actors and the
`PromptStream`. Each episode it takes one batch of trajectories (every rank's share) and scatters it; every
rank then computes the proximal policy's and the reference's log-probs, group advantages, and trains with
the behaviour-weighted clipped loss. After each episode rank 0 publishes the new weights to the generators
and raises the executor's version, which is the number of episodes trained.
"""
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from coati.distributed.comm import is_distributed, rank, world_size
from coati.experience.experience import Experience
from coati.rollout import GeneratorPool, PromptStream, Trajectory, WorkflowExecutor

from .grpo import GRPOTrainer


class AsyncGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` fed by `executor` (rank 0; None elsewhere), whose `prepare_batch` keeps generation
    running up to `max_staleness` versions ahead of training. Takes `GRPOTrainer`'s arguments besides;
    `fit` shuts the executor and the generators down when it ends, however it ends."""

    def __init__(self, *args, executor: Optional[WorkflowExecutor] = None, pool: Optional[GeneratorPool] = None,
                 prompt_stream: Optional[PromptStream] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if rank() == 0 and (executor is None or pool is None or prompt_stream is None):
            raise ValueError("rank 0 needs the executor, the generator pool and the prompt stream")
        self.executor, self.pool, self.stream = executor, pool, prompt_stream

    def fit(self, *args, **kwargs) -> None:
        try:
            super().fit(*args, **kwargs)
        finally:
            if self.executor is not None:
                self.executor.shutdown()
                self.pool.shutdown()

    def _episodes(self, num_episodes: int, num_collect_steps: int, num_update_steps: int) -> None:
        self._publish(self.start_episode)   # a resumed run's generators start from the restored weights
        super()._episodes(num_episodes, num_collect_steps, num_update_steps)

    def _make_experience(self, collect_step: int) -> Experience:
        self._set_train_mode(False)
        with self.stats.record_timing("rollout_wait"):
            trajectories = self._scatter(self._next_batch())
        experience = self.maker.from_trajectories(trajectories, self.device)
        self._record_staleness(trajectories)
        self._record_experience(experience, collect_step)
        return experience

    def _next_batch(self) -> Optional[List[Trajectory]]:
        return self.executor.prepare_batch(self.stream.next) if self.executor is not None else None

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

    def _record_staleness(self, trajectories: List[Trajectory]) -> None:
        """How many versions behind the trainer each trained sample's weights were, and the executor's drops."""
        lag = torch.tensor([float(self.episode - t.version) for t in trajectories])
        with self.stats.scope("rollout"):
            self.stats.denominator(trained=torch.ones_like(lag, dtype=torch.bool))
            self.stats.stat(denominator="trained", staleness=lag)
            if self.executor is not None:
                self.stats.scalar(dropped_stale=float(self.executor.dropped))

    def _prompts_per_epoch(self) -> int:
        """The stream (rank 0's) draws each prompt once per pass."""
        return len(self.prompts.dataloader.dataset)

    def _after_episode(self, episode: int) -> None:
        self._publish(episode + 1)
        super()._after_episode(episode)

    def _publish(self, version: int) -> None:
        """Rank 0 sends the actor's weights to the generators as `version` and moves the executor on."""
        if self.pool is None:
            return
        model = self.actor.unwrap() if hasattr(self.actor, "unwrap") else self.actor
        self.pool.publish(model.state_dict(), version)
        self.executor.set_version(version)

    def _extra_state(self) -> Dict[str, Any]:
        state = super()._extra_state()
        return {**state, **self.stream.state()} if self.stream is not None else state

    def _restore_extra_state(self, state: Dict[str, Any]) -> None:
        super()._restore_extra_state(state)
        if self.stream is not None:
            self.stream.restore(state)
