"""Rollouts: workflows that turn a prompt into training samples, generator processes (Ray actors) that hold
copies of the policy, the executor that runs workflows under concurrency and staleness bounds while the
trainer trains, and the local engine that runs the same workflows synchronously on the training model."""
from .engine import Completions, GeneratorError, GeneratorPool, RolloutEngine, all_of
from .executor import PromptStream, RolloutEvent, WorkflowExecutor
from .local import LocalEngine, run_episodes
from .workflow import RLVRWorkflow, RolloutWorkflow, Trajectory

__all__ = ["RolloutEngine", "all_of", "Completions", "GeneratorError", "GeneratorPool", "LocalEngine", "PromptStream",
           "RLVRWorkflow", "RolloutEvent", "RolloutWorkflow", "Trajectory", "WorkflowExecutor", "run_episodes"]
