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


def test_policy_loss_takes_colossalchat_clip_eps_and_skips_a_runaway_ratio():
    from coati.models import PolicyLoss

    loss_fn = PolicyLoss(0.1, 5.0)                                 # ColossalChat's (clip_eps, skip_threshold)
    assert (loss_fn.clip_eps_low, loss_fn.clip_eps_high, loss_fn.skip_threshold) == (0.1, 0.1, 5.0)
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    logps = torch.tensor([[0.5, 0.0]], requires_grad=True)          # ratios e^0.5 and 1, mean 1.32
    loss, stats = loss_fn(logps, old, torch.tensor([1.0]), mask)
    assert loss.item() == pytest.approx(-(1.1 + 1.0) / 2) and stats["skipped"].item() == 0.0
    logps = torch.tensor([[3.0, 0.0]], requires_grad=True)          # mean ratio (e^3 + 1) / 2 = 10.5 > 5
    loss, stats = loss_fn(logps, old, torch.tensor([1.0]), mask)
    loss.backward()
    assert loss.item() == 0.0 and stats["skipped"].item() == 1.0 and logps.grad.abs().sum() == 0


def test_value_loss_takes_advantages_as_colossalchat_does():
    from coati.models import ValueLoss

    values, old, advantages, mask = torch.tensor([[1.0]]), torch.tensor([[0.9]]), torch.tensor([[0.6]]), torch.ones(1, 1)
    returns = 1.5                                                   # advantages + old values
    assert ValueLoss(clip_eps=0.2)(values, old, advantages, mask).item() == pytest.approx(0.5 * (1.0 - returns) ** 2)


def test_dpo_loss_with_colossalchat_arguments_per_token_masks_and_margin():
    from coati.compat.losses import DpoLoss as held
    from coati.models import DpoLoss
    from coati.models.loss import DpoLoss as at_its_module

    assert DpoLoss is held is at_its_module

    beta, gamma = 0.5, 0.2
    chosen, rejected = torch.tensor([[-1.0, -2.0, -9.0]]), torch.tensor([[-3.0, -1.0, -9.0]])
    chosen_mask, reject_mask = torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    ref_chosen, ref_rejected = torch.tensor([[-1.5, -1.5, -9.0]]), torch.tensor([[-2.0, -2.0, -9.0]])
    losses, chosen_rewards, rejected_rewards = DpoLoss(beta, gamma)(chosen, rejected, ref_chosen, ref_rejected,
                                                                     chosen_mask, reject_mask)
    h = (-3.0 - -3.0) - (-4.0 - -4.0)                                # masked sums: policy minus reference
    assert losses.item() == pytest.approx(-math.log(1 / (1 + math.exp(-(beta * h - gamma)))))
    assert chosen_rewards.item() == pytest.approx(0.0) and rejected_rewards.item() == pytest.approx(0.0)
    losses, chosen_rewards, _ = DpoLoss(beta)(chosen, rejected, None, None, chosen_mask, reject_mask)
    assert losses.item() == pytest.approx(-math.log(1 / (1 + math.exp(-beta * (-3.0 - -4.0)))))  # reference-free
    assert chosen_rewards.item() == pytest.approx(beta * -3.0)


def test_odds_ratio_loss_with_colossalchat_per_token_masks():
    from coati.models import OddsRatioLoss

    chosen, rejected = torch.tensor([[-0.2, -0.4, -5.0]]), torch.tensor([[-1.0, -3.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = OddsRatioLoss()(chosen, rejected, mask, mask)
    a_c, a_r = -0.3, -2.0                                            # length-normalised
    log_odds = (a_c - math.log1p(-math.exp(a_c))) - (a_r - math.log1p(-math.exp(a_r)))
    assert out.extras["log_odds_ratio"].item() == pytest.approx(log_odds, rel=1e-5)
    assert out.losses.item() == pytest.approx(-a_c + 0.1 * math.log1p(math.exp(-log_odds)), rel=1e-5)
