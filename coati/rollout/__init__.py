"""Asynchronous rollouts: workflows that turn a prompt into training samples, generator processes (Ray
actors) that hold copies of the policy, and the executor that runs workflows under concurrency and
staleness bounds while the trainer trains."""
from .engine import Completions, GeneratorError, GeneratorPool
from .executor import PromptStream, RolloutEvent, WorkflowExecutor
from .workflow import AsyncEngine, RLVRWorkflow, RolloutWorkflow, Trajectory

__all__ = ["AsyncEngine", "Completions", "GeneratorError", "GeneratorPool", "PromptStream", "RLVRWorkflow",
           "RolloutEvent", "RolloutWorkflow", "Trajectory", "WorkflowExecutor"]
