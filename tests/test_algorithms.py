"""The algorithm registries: RLOO, REINFORCE++ and GSPO against hand-computed values, the KL and entropy terms
under --loss_agg, a bad name refused with the choices, and an advantage estimator added from outside the
package that a GRPO step trains with."""
import math

import pytest
import torch

from coati.experience.advantages import ADVANTAGE_ESTIMATORS
from coati.models.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, PolicyLoss
from coati.utils.errors import CoatiUsageError
from conftest import dist_script_result

T = torch.tensor


def test_rloo_baseline_is_the_mean_of_the_other_rewards():
    advantages = ADVANTAGE_ESTIMATORS.get("rloo")(T([1.0, 0.0, 0.0, 2.0]), 4)
    # r_i - (sum - r_i) / 3: 1 - 2/3, 0 - 1, 0 - 1, 2 - 1/3
    assert advantages.tolist() == pytest.approx([1 / 3, -1.0, -1.0, 5 / 3])
    assert ADVANTAGE_ESTIMATORS.get("rloo")(T([3.0, 1.0, 5.0, 5.0]), 2).tolist() == pytest.approx([2.0, -2.0, 0.0, 0.0])


def test_reinforce_pp_normalises_over_the_whole_batch_not_the_group():
    rewards = T([1.0, 0.0, 3.0, 4.0])                       # mean 2, population std sqrt(2.5)
    advantages = ADVANTAGE_ESTIMATORS.get("reinforce_pp")(rewards, 2)
    assert advantages.tolist() == pytest.approx([(r - 2) / math.sqrt(2.5) for r in (1, 0, 3, 4)], rel=1e-5)
    assert ADVANTAGE_ESTIMATORS.get("reinforce_pp")(rewards, 2, scale_by_std=False).tolist() == [-1.0, -2.0, 1.0, 2.0]


def test_reinforce_pp_statistics_span_every_rank():
    result = dist_script_result("advantages_reduce.py")
    # rank 0 holds rewards [0, 2], rank 1 [4, 6]: global mean 3, population std sqrt(5)
    assert result["rank0"] == pytest.approx([-3 / math.sqrt(5), -1 / math.sqrt(5)], rel=1e-5)


def test_gspo_clips_one_sequence_level_ratio():
    logps, old = T([[-1.0, -2.0, 0.0]]), T([[-1.2, -1.6, -5.0]])
    mask = T([[1.0, 1.0, 0.0]])
    ratio = POLICY_LOSSES.get("gspo")(logps, old, mask)
    s = math.exp(((0.2) + (-0.4)) / 2)                     # exp of the mean token log-ratio, padding left out
    assert ratio.tolist() == [pytest.approx([s, s, s])]
    gspo = PolicyLoss(0.05, ratio="gspo", aggregation="seq-mean-token-mean")
    loss, stats = gspo(logps, old, T([1.0]), mask)           # s = e^-0.1 ~ 0.905, below 1 - 0.05
    assert loss.item() == pytest.approx(-s) and stats["clip_ratio/low"].item() == 0.0   # -min(s A, 0.95 A), A = 1
    loss, stats = gspo(logps, old, T([-1.0]), mask)
    assert loss.item() == pytest.approx(0.95) and stats["clip_ratio/low"].item() == 1.0  # the clip binds for A < 0


def test_kl_and_entropy_terms_follow_the_loss_aggregation():
    loss = PolicyLoss(aggregation="seq-mean-token-mean")
    values, mask = T([[1.0, 3.0], [2.0, 0.0]]), T([[1.0, 1.0], [1.0, 0.0]])
    assert loss.aggregate(values, mask).item() == pytest.approx((2.0 + 2.0) / 2)
    assert PolicyLoss().aggregate(values, mask).item() == pytest.approx(6.0 / 3)
    assert set(AGGREGATIONS.names()) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(CoatiUsageError, match="unknown advantage estimator 'nope'; expected one of grpo, rloo"):
        ADVANTAGE_ESTIMATORS.get("nope")
    with pytest.raises(CoatiUsageError, match="cannot be imported"):
        ADVANTAGE_ESTIMATORS.get("no_such_module:fn")


def sign_advantages(rewards: torch.Tensor, group_size: int, scale_by_std: bool = True) -> torch.Tensor:
    """A toy estimator written outside coati: +1 above the group's mean, -1 below, 0 at it."""
    groups = rewards.view(-1, group_size)
    return torch.sign(groups - groups.mean(-1, keepdim=True)).reshape(-1)


def test_an_estimator_from_outside_the_package_trains(world_of_one, tiny_assets, monkeypatch):
    from test_grpo import _grpo_trainer

    ADVANTAGE_ESTIMATORS.register("sign")(sign_advantages)
    trainer = _grpo_trainer(tiny_assets)
    monkeypatch.setattr(trainer.maker.settings, "advantage_estimator", "sign")
    seen = []
    original = trainer._learn_step
    monkeypatch.setattr(trainer, "_learn_step", lambda experience: seen.append(experience) or original(experience))
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)
    rewards = seen[0].rewards
    assert torch.equal(seen[0].advantages, sign_advantages(rewards, 4)) and trainer.global_step == 1
    assert ADVANTAGE_ESTIMATORS.get("test_algorithms:sign_advantages") is sign_advantages
