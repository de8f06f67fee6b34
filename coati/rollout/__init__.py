"""Rollouts: workflows that turn a prompt into training samples, the rollout pools they generate with (generator
processes, Ray actors that hold copies of the policy; vLLM servers; the local pool that runs the same workflows
synchronously on the training model), and the executor that runs workflows under concurrency and staleness bounds
while the trainer trains."""
from coati.experience.experience import RolloutSample

from .pool import Completions, LocalPool, RolloutPool, all_of
from .generators import GeneratorError, GeneratorPool
from .executor import PromptStream, RolloutEvent, WorkflowExecutor
from .workflow import RLVRWorkflow, RolloutWorkflow, Trajectory, run_episodes, scored

__all__ = ["RolloutPool", "all_of", "Completions", "GeneratorError", "GeneratorPool", "LocalPool", "PromptStream",
           "RLVRWorkflow", "RolloutEvent", "RolloutSample", "RolloutWorkflow", "Trajectory", "WorkflowExecutor",
           "run_episodes", "scored"]

RolloutEngine = RolloutPool
"""The pools' name before they were told apart from generation engines: workflows written against it keep working."""
