"""Rollouts: workflows that turn a prompt into training samples, generator processes (Ray actors) that hold
copies of the policy, the executor that runs workflows under concurrency and staleness bounds while the
trainer trains, and the local engine that runs the same workflows synchronously on the training model."""
from .engine import Completions, GeneratorError, GeneratorPool
from .executor import PromptStream, RolloutEvent, WorkflowExecutor
from .local import LocalEngine, run_episodes
from .workflow import AsyncEngine, RLVRWorkflow, RolloutWorkflow, Trajectory

__all__ = ["AsyncEngine", "Completions", "GeneratorError", "GeneratorPool", "LocalEngine", "PromptStream",
           "RLVRWorkflow", "RolloutEvent", "RolloutWorkflow", "Trajectory", "WorkflowExecutor", "run_episodes"]
