"""The imports a ColossalChat user writes, and the constructor arguments they pass, work against coati."""
import math

import pytest
import torch


def test_trainers_import_from_coati_trainer():
    from coati.trainer import (DPOTrainer, GRPOTrainer, KTOTrainer, ORPOTrainer, PPOTrainer, RewardModelTrainer,
                               SFTTrainer, SLTrainer, OLTrainer)

    assert issubclass(SFTTrainer, SLTrainer) and issubclass(RewardModelTrainer, SLTrainer)
    assert all(issubclass(t, SLTrainer) for t in (DPOTrainer, KTOTrainer, ORPOTrainer))
    assert issubclass(PPOTrainer, OLTrainer) and issubclass(GRPOTrainer, OLTrainer)


def test_callbacks_experience_and_utils_import_from_colossalchat_paths():
    from coati.experience.experience import Experience as Ours
    from coati.experience_maker import Experience
    from coati.trainer.callbacks import Callback, PerformanceEvaluator
    from coati.utils import AccumulativeMeanMeter, load_checkpoint, save_checkpoint

    assert Experience is Ours and issubclass(PerformanceEvaluator, Callback)
    assert callable(save_checkpoint) and callable(load_checkpoint)
    meter = AccumulativeMeanMeter()
    meter.add("loss", 3.0, count_update=2)
    assert meter.get("loss") == 1.5


def test_losses_with_colossalchat_constructor_arguments():
    from coati.models import KTOLoss, LogExpLoss, LogSigLoss, ValueLoss

    chosen, rejected = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2      # ColossalChat's mean reduction
    assert LogSigLoss()(chosen, rejected).item() == pytest.approx(expected)
    assert LogExpLoss()(chosen, rejected).item() == pytest.approx(expected)
    assert ValueLoss(clip_eps=0.2).clip_eps == 0.2
    kto = KTOLoss(beta=0.1, desirable_weight=1.0, undesirable_weight=1.33)
    assert (kto.beta, kto.desirable_weight, kto.undesirable_weight) == (0.1, 1.0, 1.33)
