"""GAE, group advantages, policy/value losses, KL estimators and loss aggregation against hand-computed values."""
import math

import pytest
import torch

from coati.utils.errors import CoatiUsageError
from coati.experience.advantages import AdvantageConfig, compute_gae, group_advantages, tied_groups
from coati.models.logprobs import kl_penalty
from coati.models.loss import PolicyLoss, ValueLoss, token_entropy
from coati.utils.registry import KL_ESTIMATORS

T = torch.tensor


def test_gae_matches_the_recursion_and_stops_at_the_mask():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = T([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert advantages.tolist() == [pytest.approx([0.225, 0.25, 0.3]), pytest.approx([0.5, 0.6, 0.0])]
    assert returns.tolist() == [pytest.approx([0.725, 0.85, 1.0]), pytest.approx([0.7, 1.0, 0.0])]


def test_gae_discount():
    advantages, _ = compute_gae(T([[0.0, 1.0]]), T([[0.0, 0.0]]), T([[1, 1]]), gamma=0.9, lam=1.0)
    assert advantages.tolist() == [pytest.approx([0.9, 1.0])]


def test_group_advantages_and_tied_groups():
    rewards = T([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    std = math.sqrt(1 / 3)                                   # unbiased std of (1, 0, 0, 1)
    expected = [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0.0, 0.0, 0.0, 0.0]
    assert group_advantages(rewards, AdvantageConfig(4)).tolist() == pytest.approx(expected, rel=1e-5)
    assert group_advantages(rewards, AdvantageConfig(4, scale_rewards=False)).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    assert tied_groups(rewards, 4).tolist() == [False] * 4 + [True] * 4


def test_policy_loss_clips_with_separate_bounds():
    logps, old = T([[-1.0, -2.0]]), T([[-1.2, -1.0]])
    mask = T([[1, 1]])
    r1, r2 = math.exp(0.2), math.exp(-1.0)
    loss, stats = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)(logps, old, T([1.0]), mask)
    assert loss.item() == pytest.approx(-(r1 + r2) / 2, rel=1e-5)             # neither ratio is clipped for A > 0
    assert stats["clip_ratio/region"].item() == 0.0
    loss, stats = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.1)(logps, old, T([1.0]), mask)
    assert loss.item() == pytest.approx(-(1.1 + r2) / 2, rel=1e-5)            # 1.2214 clipped to 1 + 0.1
    assert [stats[f"clip_ratio/{k}"].item() for k in ("low", "high", "region")] == [0.0, 0.5, 0.5]
    loss, stats = PolicyLoss(0.2)(logps, old, T([-1.0]), mask)
    assert loss.item() == pytest.approx((r1 + 0.8) / 2, rel=1e-5)              # pessimistic: max(r, clip(r)) * |A|
    assert [stats[f"clip_ratio/{k}"].item() for k in ("low", "high", "region")] == [0.5, 0.0, 0.5]   # e^-1 < 0.8
    assert stats["approx_kl"].item() == pytest.approx((0.2 ** 2 + 1.0) / 4, rel=1e-5)


def test_value_loss_takes_the_larger_of_clipped_and_unclipped():
    loss = ValueLoss(0.2)(T([[1.0, 0.0]]), T([[0.5, 0.0]]), T([[1.5, 0.0]]), T([[1, 0]]))    # returns 1.5 + 0.5
    assert loss.item() == pytest.approx(0.5 * (0.7 - 2.0) ** 2)


def test_kl_estimators():
    logps, ref = T([-1.0]), T([-1.5])
    assert kl_penalty(logps, ref, KL_ESTIMATORS.get("k1")).item() == pytest.approx(0.5)
    assert kl_penalty(logps, ref, KL_ESTIMATORS.get("k2")).item() == pytest.approx(0.125)
    assert kl_penalty(logps, ref, KL_ESTIMATORS.get("k3")).item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)


def test_aggregations():
    losses, mask = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]), T([[1, 1, 1], [1, 0, 0]])
    assert PolicyLoss(aggregation="token-mean").aggregate(losses, mask).item() == pytest.approx(2.5)
    assert PolicyLoss(aggregation="seq-mean-token-mean").aggregate(losses, mask).item() == pytest.approx(3.0)
    assert PolicyLoss(aggregation="seq-mean-token-sum-norm", norm_length=4).aggregate(losses, mask).item() == \
        pytest.approx(1.25)


def test_token_entropy_of_uniform_and_peaked_distributions():
    logits = torch.stack([torch.zeros(4), T([100.0, 0.0, 0.0, 0.0])]).unsqueeze(0)
    assert token_entropy(logits)[0].tolist() == pytest.approx([math.log(4), 0.0], abs=1e-5)


def test_policy_loss_weights_tokens_by_the_capped_behaviour_ratio():
    """Decoupled PPO: each token's clipped loss times min(pi_prox / pi_behaviour, cap)."""
    logps = torch.tensor([[-1.0, -2.0, -0.5]])
    prox = torch.tensor([[-1.1, -2.0, -0.7]])
    behaviour = torch.tensor([[-1.2, -4.0, -0.7]])   # ratios e^0.1, e^2 (capped at 3), 1
    advantages = torch.tensor([1.0])
    mask = torch.ones(1, 3)
    loss, stats = PolicyLoss(0.2, behaviour_cap=3.0)(logps, prox, advantages, mask, behaviour)
    ratio = torch.exp(logps - prox)
    clipped = -torch.min(ratio, ratio.clamp(0.8, 1.2))
    weights = torch.tensor([[math.exp(0.1), 3.0, 1.0]])
    assert loss.item() == pytest.approx((clipped * weights).mean().item(), rel=1e-6)
    assert stats["behaviour_weight"].item() == pytest.approx(weights.mean().item(), rel=1e-6)
    assert stats["behaviour_capped"].item() == pytest.approx(1 / 3)
    plain, _ = PolicyLoss(0.2)(logps, prox, advantages, mask)
    assert plain.item() == pytest.approx(clipped.mean().item(), rel=1e-6)


@pytest.mark.parametrize("correction, options, expected", [
    # ratios r = e^0.7, e^-1, e^0.1, 1 on row 0 (its last token masked out) and e^0.5, e^-0.2, 1, 1 on row 1
    ("masked", {}, [[0.0, math.exp(-1), math.exp(0.1), 1.0], [math.exp(0.5), math.exp(-0.2), 1.0, 1.0]]),
    ("masked", {"high": 1.5}, [[0.0, math.exp(-1), math.exp(0.1), 1.0], [0.0, math.exp(-0.2), 1.0, 1.0]]),
    ("icepop", {}, [[math.exp(0.7), 0.0, math.exp(0.1), 1.0], [math.exp(0.5), math.exp(-0.2), 1.0, 1.0]]),
    ("icepop", {"low": 0.3, "high": 1.7}, [[0.0, math.exp(-1), math.exp(0.1), 1.0],
                                            [math.exp(0.5), math.exp(-0.2), 1.0, 1.0]]),
    ("sequence", {}, [[math.exp(-0.2)] * 4, [math.exp(0.3)] * 4]),   # prod r over the masked tokens
    ("sequence_masked", {"low": 0.9}, [[0.0] * 4, [math.exp(0.3)] * 4]),
])
def test_behaviour_corrections_weight_tokens_as_their_papers_say(correction, options, expected):
    prox = torch.tensor([[0.7, -1.0, 0.1, 3.0], [0.5, -0.2, 0.0, 0.0]]) - 2.0
    behaviour = torch.full((2, 4), -2.0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    advantages = torch.tensor([1.0, -1.0])
    policy = PolicyLoss(0.2, behaviour_cap=3.0, behaviour_correction=correction, behaviour_options=options)
    loss, stats = policy(prox, prox, advantages, mask, behaviour)   # on the proximal policy: each token's loss is -A
    weights = torch.tensor(expected)
    weights[0, 3] = 1.0 if correction in ("masked", "icepop") else weights[0, 3]   # the masked-out token
    assert loss.item() == pytest.approx((-(weights * advantages[:, None]) * mask).sum().item() / 7, rel=1e-5)
    assert stats["behaviour_weight"].item() == pytest.approx((weights * mask).sum().item() / 7, rel=1e-5)


def test_sequence_correction_caps_the_product_and_bad_options_are_refused():
    prox, behaviour, mask = torch.zeros(1, 3), torch.full((1, 3), -1.0), torch.ones(1, 3)   # prod r = e^3 > cap 5
    _, stats = PolicyLoss(0.2, behaviour_cap=5.0, behaviour_correction="sequence")(prox, prox, torch.ones(1), mask,
                                                                                   behaviour)
    assert stats["behaviour_weight"].item() == pytest.approx(5.0) and stats["behaviour_capped"].item() == 1.0
    with pytest.raises(CoatiUsageError, match="--behaviour_correction_option: behaviour correction 'masked' takes no "
                                              "option 'low'; its options: high"):
        PolicyLoss(behaviour_correction="masked", behaviour_options={"low": 0.5})
    with pytest.raises(ValueError, match="low 0.5 is not below high 0.3: every token would be masked out"):
        PolicyLoss(behaviour_correction="icepop", behaviour_options={"high": 0.3})
