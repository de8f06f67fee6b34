"""SLTrainer's loop (accumulation, step counting, hooks), in one process (OLTrainer's hooks: test_grpo.py)."""
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from coati.dataset.sampler import HeldOutBatchSampler
from coati.trainer import Callback
from support import linear_trainer, regression_rows


class Recorder(Callback):
    """Records every hook call as (name, argument)."""

    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            return lambda *args: self.calls.append((name, *args))
        return super().__getattribute__(name)


def _sgd_on_mean(w, x, y, lr):
    """One SGD step on the mean squared error over the rows given."""
    err = x @ w.T - y[:, None]
    grad = 2 * (err * x).mean(0, keepdim=True)
    return w - lr * grad


def test_accumulation_counts_steps_and_keeps_partial_last_group(world_of_one):
    rows, x, y = regression_rows(5)              # micro-batches of 2: [0,1] [2,3] [4]; accumulation 2 -> steps {0..3}, {4}
    recorder = Recorder()
    trainer, loader, w0 = linear_trainer(rows, batch_size=2, accumulation_steps=2, lr=0.1, callbacks=[recorder])
    trainer.fit(loader)
    assert trainer.step == 2
    expected = _sgd_on_mean(_sgd_on_mean(w0, x[:4], y[:4], 0.1), x[4:], y[4:], 0.1)
    assert torch.allclose(trainer.model.unwrap().weight.detach(), expected, atol=1e-6)
    step_sizes = [len(args[0]) for name, *args in recorder.calls if name == "on_optimizer_step_end"]
    assert step_sizes == [2, 1]
    assert [len(args[0]) for name, *args in recorder.calls if name == "on_learn_batch_end"] == [2, 1]   # published name


def test_sl_hooks_fire_in_documented_order(world_of_one):
    rows, _, _ = regression_rows(4)
    recorder = Recorder()
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, callbacks=[recorder])
    trainer.fit(loader)
    names = [c[0] for c in recorder.calls]
    step = ["on_optimizer_step_start", "on_learn_batch_start", "on_optimizer_step_end", "on_learn_batch_end", "on_log"]
    assert names == ["on_fit_start", "on_learn_epoch_start", *step, *step, "on_learn_epoch_end", "on_fit_end"]
    logged = [c[2] for c in recorder.calls if c[0] == "on_log"]
    assert all("train/loss" in m and "train/lr" in m for m in logged)


def test_a_callback_overriding_either_name_of_a_hook_is_called_once_per_step(world_of_one):
    class New(Callback):
        steps = []

        def on_optimizer_step_end(self, micro_batches):
            self.steps.append(len(micro_batches))

    class Published(Callback):
        steps = []

        def on_learn_batch_end(self, batches):
            self.steps.append(len(batches))

    rows, _, _ = regression_rows(4)
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, callbacks=[New(), Published()])
    trainer.fit(loader)
    assert New.steps == [1, 1] and Published.steps == [1, 1]


def test_callback_can_stop_training(world_of_one):
    class StopAfterFirstStep(Callback):
        def on_learn_batch_end(self, batches):
            self.stop_training = True

    rows, _, _ = regression_rows(8)
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1,
                                         callbacks=[StopAfterFirstStep()])
    trainer.fit(loader)
    assert trainer.step == 1


def test_max_steps_stops_at_that_optimizer_step_and_checkpoints_the_position(world_of_one, tmp_path):
    rows, _, _ = regression_rows(12)               # 6 micro-batches of 2 per epoch, 2 epochs
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1,
                                         max_steps=4, save_dir=str(tmp_path))
    trainer.max_epochs = 2
    trainer.fit(loader)
    assert trainer.step == 4
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["epoch-0_step-4"]
    state = (tmp_path / "epoch-0_step-4" / "running_states.json").read_text()
    assert '"sample_start_index": 8' in state


def test_max_steps_past_the_epochs_passes_over_the_data_again_as_in_trl(world_of_one, tmp_path):
    rows, _, _ = regression_rows(12)               # 6 micro-batches of 2 per epoch; max_epochs stays at its 1
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1,
                                         max_steps=8, save_dir=str(tmp_path))
    trainer.fit(loader)
    assert trainer.step == 8 and trainer.epochs_done == pytest.approx(1 + 2 / 6)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["epoch-1_step-8"]
    assert '"sample_start_index": 4' in (tmp_path / "epoch-1_step-8" / "running_states.json").read_text()


def test_trls_fraction_of_an_epoch_ends_the_run_that_far_into_the_last_pass(world_of_one, tmp_path):
    rows, _, _ = regression_rows(12)               # 6 micro-batches of 2 per epoch: 1.5 epochs are 9 steps
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, save_dir=str(tmp_path))
    trainer.max_epochs = 1.5
    trainer.fit(loader)
    assert trainer.step == 9 and trainer.epochs_done == pytest.approx(1.5)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["epoch-1_step-9"]


def test_a_supervised_config_sets_the_length_steps_and_checkpoints_that_keywords_cannot(world_of_one, tmp_path):
    """`config=SupervisedConfig(...)` (what the scripts pass) replaces the keywords: two epochs of two accumulated
    steps, and a checkpoint as each epoch ends (`save_freq_epochs`, which no keyword sets)."""
    from coati.config import CheckpointSettings, EpochSettings, StepSettings, SupervisedConfig

    rows, x, y = regression_rows(5)              # micro-batches [0,1] [2,3] [4]; accumulation 2 -> 2 steps an epoch
    config = SupervisedConfig(epochs=EpochSettings(max_epochs=2), steps=StepSettings(accumulation_steps=2),
                              checkpoints=CheckpointSettings(save_dir=str(tmp_path), save_freq_epochs=1))
    trainer, loader, w0 = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, config=config)
    trainer.fit(loader)
    assert trainer.step == 4
    w = w0
    for _ in range(2):
        w = _sgd_on_mean(_sgd_on_mean(w, x[:4], y[:4], 0.1), x[4:], y[4:], 0.1)
    assert torch.allclose(trainer.model.unwrap().weight.detach(), w, atol=1e-6)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["epoch-1_step-2", "epoch-2_step-4"]


def test_a_held_out_batch_a_rank_runs_only_to_keep_in_step_is_not_scored(world_of_one):
    rows, x, y = regression_rows(3)
    recorder = Recorder()
    trainer, loader, w0 = linear_trainer(rows, batch_size=3, accumulation_steps=1, lr=0.0, callbacks=[recorder])
    as_rank_1_of_2 = HeldOutBatchSampler(3, 1, 2, 1)      # row 1, then a filler batch of row 0
    assert list(as_rank_1_of_2) == [[1], [0]]
    trainer.fit(loader, eval_dataloader=DataLoader(rows, batch_sampler=as_rank_1_of_2, collate_fn=default_collate))
    results = [args[1] for name, *args in recorder.calls if name == "on_evaluate"]
    assert results and results[-1]["loss"] == pytest.approx(((x[1] @ w0.T - y[1]) ** 2).item())


def test_a_run_resumed_on_another_number_of_processes_counts_its_steps_done_and_those_its_data_left_takes():
    """300 rows in batches of 2 for 3 epochs: 75 steps an epoch on 2 ranks (225 in all), 150 on one. A checkpoint at
    step 100 (epoch 1, 50 rows into it on each of 2 ranks: 100 of the 300) resumed on one process has 200 rows of
    that epoch and one more epoch left: 100 + 100 + 150 = 350 steps, which the schedule counts down to, not 450."""
    from coati.dataset.sampler import StatefulDistributedSampler
    from coati.trainer.base import run_steps

    rows = list(range(300))
    loader = DataLoader(rows, batch_size=2, sampler=StatefulDistributedSampler(rows, num_replicas=1, rank=0))
    assert run_steps(loader, 1, 3, 0) == 450
    assert run_steps(loader, 1, 3, 0, (1, 100, 2 * 50 // 1)) == 350      # the global 100 rows, all on this rank
    assert len(loader) == 150                                            # the sampler is left at the epoch's start
    assert run_steps(loader, 1, 3, 0, (1, 175, 50)) == 450               # saved on this process count: the epochs'
    assert run_steps(loader, 1, 3, 0, (3, 225, 0)) == 225                # finished: nothing left
    assert run_steps(loader, 2, 3, 0, (1, 50, 100)) == 50 + 50 + 75      # accumulation: 2 micro-batches a step
    assert run_steps(loader, 1, 3, 7, (1, 100, 100)) == 7                # --max_steps decides
    assert run_steps(loader, 1, 1.5, 0) == 225 and run_steps(loader, 4, 0.1, 0) == 4    # TRL's fractions, rounded up
    # 1.5 epochs resumed from the 2-rank checkpoint above (400 rows seen): the 50 rows to 450 are 25 steps here
    assert run_steps(loader, 1, 1.5, 0, (1, 100, 100)) == 125
    assert run_steps(loader, 1, 1.5, 0, (1, 225, 150)) == 225                # saved here at its end: finished
