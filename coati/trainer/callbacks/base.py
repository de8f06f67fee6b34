"""The one `Callback` ABC that every coati trainer fires; subclass it and override only what you need."""
from abc import ABC
from typing import Any, Dict, Iterable, List

from coati.compat.hooks import PUBLISHED_NAMES


class Callback(ABC):
    """Lifecycle hooks of a training run; every hook is a no-op by default.

    On-policy trainers (`OLTrainer`) fire, in order::

        on_fit_start
          on_episode_start(episode)
            on_make_experience_start / on_make_experience_end(experience)   per collect step
            on_update_pass_start(pass_index)                                per pass over the episode's experience
              on_update_batch_start / on_update_batch_end(experience)       per training micro-batch
            on_update_pass_end(pass_index)
          on_episode_end(episode)
        on_fit_end                                                          also when training raises

    Supervised trainers (`SLTrainer`) fire `on_fit_start/end`, `on_learn_epoch_start/end(epoch)` around
    each epoch, and `on_optimizer_step_start()` / `on_optimizer_step_end(micro_batches)` around each optimizer
    step, where `micro_batches` is the list of micro-batches (dicts of tensors) that formed the step.

    The published names of ColossalChat's hooks keep working: right after each of the hooks above, the same
    callback's published counterpart is called with the same arguments (`coati.compat.hooks`): on-policy,
    `on_learn_epoch_start/end(pass_index)` and `on_learn_batch_start/end(experience)`; supervised,
    `on_learn_batch_start/end(micro_batches)`. Override one name of each pair, not both.

    Every trainer also fires `on_log(step, metrics)` with the rank-reduced metrics it logs,
    `on_evaluate(epoch, results)` with evaluation results, and `on_checkpoint_saved(path)` once a
    checkpoint is complete. These hooks run on every rank. Set `self.stop_training = True` in any
    hook to end training after the current optimizer step (early stopping); on a multi-rank run,
    decide it from values that agree on every rank, such as the reduced metrics of `on_log`.
    """

    stop_training: bool = False

    def on_fit_start(self) -> None:
        pass

    def on_fit_end(self) -> None:
        pass

    def on_episode_start(self, episode: int) -> None:
        pass

    def on_episode_end(self, episode: int) -> None:
        pass

    def on_make_experience_start(self) -> None:
        pass

    def on_make_experience_end(self, experience: Any) -> None:
        pass

    def on_update_pass_start(self, pass_index: int) -> None:
        pass

    def on_update_pass_end(self, pass_index: int) -> None:
        pass

    def on_update_batch_start(self) -> None:
        pass

    def on_update_batch_end(self, experience: Any) -> None:
        pass

    def on_optimizer_step_start(self) -> None:
        pass

    def on_optimizer_step_end(self, micro_batches: List[Any]) -> None:
        pass

    def on_learn_epoch_start(self, epoch: int) -> None:
        pass

    def on_learn_epoch_end(self, epoch: int) -> None:
        pass

    def on_learn_batch_start(self) -> None:
        pass

    def on_learn_batch_end(self, experience: Any) -> None:
        pass

    def on_log(self, step: int, metrics: Dict[str, float]) -> None:
        pass

    def on_evaluate(self, epoch: int, results: Dict[str, float]) -> None:
        pass

    def on_checkpoint_saved(self, path: str) -> None:
        pass

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint keeps of this callback (JSON-able), so a resumed run goes on as if never stopped."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take back what `state_dict` gave when the run resumes."""


def fire(callbacks: Iterable[Callback], hook: str, *args: Any) -> None:
    """Call `hook(*args)` on every callback, in order, each followed by ColossalChat's name for it, if any; a hook a
    callback leaves as `Callback`'s no-op is skipped."""
    names = (hook, PUBLISHED_NAMES[hook]) if hook in PUBLISHED_NAMES else (hook,)
    for callback in callbacks:
        for name in names:
            method = getattr(callback, name)
            if getattr(method, "__func__", None) is not getattr(Callback, name, None):
                method(*args)
