"""Checkpoints: completeness marker, refusal of incomplete ones, pruning, and the RNG round trip."""
import json
import random

import numpy as np
import pytest
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from colossalai.cluster import DistCoordinator

from coati.utils import CoatiUsageError, latest_checkpoint, load_checkpoint, save_checkpoint
from coati.utils.ckpt_io import COMPLETE_MARKER, list_checkpoints



def _boosted():
    model = torch.nn.Linear(3, 2)
    booster = Booster(plugin=TorchDDPPlugin())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    return booster, model, optimizer, scheduler


def _train_one_step(model, optimizer, scheduler):
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def test_round_trip_restores_weights_optimizer_scheduler_and_rng(world_of_one, tmp_path):
    booster, model, optimizer, scheduler = _boosted()
    _train_one_step(model, optimizer, scheduler)
    path = save_checkpoint(tmp_path, booster, model, optimizer, scheduler, epoch=2, step=7, batch_size=4,
                           coordinator=DistCoordinator(), sample_start_index=12)
    assert path.name == "epoch-2_step-7" and (path / COMPLETE_MARKER).is_file()
    expected_next = (torch.rand(3), np.random.rand(), random.random())
    weights = model.unwrap().weight.detach().clone()

    booster2, model2, optimizer2, scheduler2 = _boosted()
    epoch, step, start = load_checkpoint(path, booster2, model2, optimizer2, scheduler2)
    assert (epoch, step, start) == (2, 7, 12)
    assert torch.equal(model2.unwrap().weight, weights)
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    assert optimizer2.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert torch.equal(torch.rand(3), expected_next[0])
    assert np.random.rand() == expected_next[1] and random.random() == expected_next[2]


def test_incomplete_checkpoint_is_refused_with_a_clear_message(world_of_one, tmp_path):
    booster, model, optimizer, scheduler = _boosted()
    good = save_checkpoint(tmp_path, booster, model, optimizer, scheduler, 0, 1, 4, DistCoordinator())
    broken = save_checkpoint(tmp_path, booster, model, optimizer, scheduler, 0, 2, 4, DistCoordinator())
    (broken / COMPLETE_MARKER).unlink()          # as if the writer died before the marker
    with pytest.raises(CoatiUsageError, match=r"incomplete .* the newest complete one is .*epoch-0_step-1"):
        load_checkpoint(broken, booster, model, optimizer, scheduler)
    assert latest_checkpoint(tmp_path) == good


def test_keep_last_prunes_only_after_the_new_one_is_complete(world_of_one, tmp_path):
    booster, model, optimizer, scheduler = _boosted()
    for step in (1, 2):
        save_checkpoint(tmp_path, booster, model, optimizer, scheduler, 0, step, 4, DistCoordinator(), keep_last=2)
    interrupted = tmp_path / "epoch-0_step-3"
    interrupted.mkdir()                           # a write that died: no marker
    save_checkpoint(tmp_path, booster, model, optimizer, scheduler, 0, 4, 4, DistCoordinator(), keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path, complete_only=False)] == ["epoch-0_step-2", "epoch-0_step-4"]
    state = json.loads((tmp_path / "epoch-0_step-4" / "running_states.json").read_text())
    assert state["step"] == 4 and state["sample_start_index"] == 16 and state["world_size"] == 1


def test_missing_checkpoint_is_a_usage_error(world_of_one, tmp_path):
    booster, model, optimizer, scheduler = _boosted()
    with pytest.raises(CoatiUsageError, match="does not exist"):
        load_checkpoint(tmp_path / "nope", booster, model, optimizer, scheduler)


def test_a_runs_output_folder_given_as_the_checkpoint_names_the_checkpoints_in_it(world_of_one, tmp_path):
    booster, model, optimizer, scheduler = _boosted()
    newest = save_checkpoint(tmp_path / "out" / "checkpoints", booster, model, optimizer, scheduler, 0, 3, 4,
                             DistCoordinator())
    with pytest.raises(CoatiUsageError, match=rf"{tmp_path / 'out'} holds checkpoints but is not one: pass one of the "
                                              rf"checkpoint folders in .*checkpoints \(the newest complete one is "
                                              rf"{newest}\), or --checkpoint_path latest"):
        load_checkpoint(tmp_path / "out", booster, model, optimizer, scheduler)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(CoatiUsageError, match="elsewhere is not a checkpoint"):
        load_checkpoint(tmp_path / "elsewhere", booster, model, optimizer, scheduler)


def test_a_fresh_run_sets_an_earlier_runs_checkpoints_aside_and_latest_with_none_says_it_starts(world_of_one, tmp_path,
                                                                                                 capsys):
    from argparse import Namespace

    from coati.cli.runner import checkpoint_to_resume

    booster, model, optimizer, scheduler = _boosted()
    for step in (14, 16):
        save_checkpoint(tmp_path, booster, model, optimizer, scheduler, 1, step, 4, DistCoordinator())
    (tmp_path / "epoch-2_step-17").mkdir()        # an interrupted write
    assert checkpoint_to_resume(Namespace(checkpoint_path=None, save_dir=str(tmp_path))) is None
    assert list_checkpoints(tmp_path, complete_only=False) == []
    [aside] = (tmp_path / "previous_runs").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["epoch-1_step-14", "epoch-1_step-16", "epoch-2_step-17"]
    assert f"held an earlier run's checkpoints; moved them to {aside}" in capsys.readouterr().err
    assert checkpoint_to_resume(Namespace(checkpoint_path="latest", save_dir=str(tmp_path))) is None
    assert "no complete checkpoint in" in capsys.readouterr().err
    save_checkpoint(tmp_path, booster, model, optimizer, scheduler, 0, 2, 4, DistCoordinator())
    assert checkpoint_to_resume(Namespace(checkpoint_path="latest", save_dir=str(tmp_path))) == str(tmp_path / "epoch-0_step-2")
