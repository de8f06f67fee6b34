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
