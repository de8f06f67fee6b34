"""The one `Callback` ABC that every coati trainer fires; subclass it and override only what you need."""
from abc import ABC
from typing import Any, Dict, Iterable


class Callback(ABC):
    """Lifecycle hooks of a training run; every hook is a no-op by default.

    On-policy trainers (`OLTrainer`) fire, in order::

        on_fit_start
          on_episode_start(episode)
            on_make_experience_start / on_make_experience_end(experience)   per collect step
            on_learn_epoch_start(update_step)
              on_learn_batch_start / on_learn_batch_end(experience)         per training batch
            on_learn_epoch_end(update_step)
          on_episode_end(episode)
        on_fit_end                                                          also when training raises

    Supervised trainers (`SLTrainer`) fire `on_fit_start/end`, `on_learn_epoch_start/end(epoch)` around
    each epoch, and `on_learn_batch_start()` / `on_learn_batch_end(batches)` around each optimizer step,
    where `batches` is the list of micro-batches (dicts of tensors) that formed the step.

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


def fire(callbacks: Iterable[Callback], hook: str, *args: Any) -> None:
    """Call `hook(*args)` on every callback, in order."""
    for callback in callbacks:
        getattr(callback, hook)(*args)
