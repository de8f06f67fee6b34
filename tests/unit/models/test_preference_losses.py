"""DPO, IPO, SimPO, ORPO and KTO against their formulas on hand-computed numbers; log-probs of labels;
the DPO trainer's batch against separate forwards, on the length-normalised and reference-free paths."""
import math

import pytest
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.dataset import PreferenceCollator, tokenize_preference
from coati.dataset.demo_data import generate_problems, preference_records
from coati.models.logprobs import label_logps, sequence_logps
from coati.models.loss import DPOLoss, KTOLoss, ORPOLoss, SimPOLoss
from coati.trainer.dpo import DPOTrainer

T = torch.tensor


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_dpo_sigmoid_with_label_smoothing():
    pc, pr, rc, rr = T([-5.0, -2.0]), T([-6.0, -1.0]), T([-5.5, -2.0]), T([-5.0, -1.5])
    out = DPOLoss(beta=0.5, label_smoothing=0.1)(pc, pr, rc, rr)
    h = [0.5 * ((-5 + 5.5) - (-6 + 5)), 0.5 * ((-2 + 2) - (-1 + 1.5))]            # 0.75, -0.25
    expected = [-0.9 * math.log(sig(x)) - 0.1 * math.log(sig(-x)) for x in h]
    assert out.losses.tolist() == pytest.approx(expected)
    assert out.chosen_rewards.tolist() == pytest.approx([0.25, 0.0])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.5, 0.25])


def test_ipo_is_a_squared_distance_to_one_over_two_beta():
    out = DPOLoss(beta=0.25, loss_type="ipo")(T([-1.0]), T([-2.0]), T([-1.5]), T([-1.0]))
    assert out.losses.item() == pytest.approx(((0.5 - -1.0) - 2.0) ** 2)           # h = 1.5, 1/(2 beta) = 2
    assert DPOLoss(loss_type="ipo").length_normalized and not DPOLoss().length_normalized


def test_simpo_is_reference_free_with_a_margin():
    loss = SimPOLoss(beta=2.0, gamma=0.5)
    out = loss(T([-0.5]), T([-1.0]))
    assert out.losses.item() == pytest.approx(-math.log(sig(2.0 * 0.5 - 0.5)))
    assert out.chosen_rewards.item() == pytest.approx(-1.0) and not loss.needs_reference


def test_orpo_adds_the_odds_ratio_term_to_the_chosen_nll():
    a_c, a_r = -0.2, -1.5
    log_odds = (a_c - a_r) - (math.log(1 - math.exp(a_c)) - math.log(1 - math.exp(a_r)))
    out = ORPOLoss(lam=0.1)(T([a_c]), T([a_r]))
    assert out.losses.item() == pytest.approx(-a_c + 0.1 * -math.log(sig(log_odds)), rel=1e-5)
    assert out.extras["log_odds_ratio"].item() == pytest.approx(log_odds, rel=1e-5)
    assert out.extras["nll_loss"].item() == pytest.approx(0.2)


def test_kto_weights_desirable_and_undesirable_against_the_kl_reference_point():
    loss = KTOLoss(beta=0.5, desirable_weight=2.0, undesirable_weight=0.5)
    losses = loss(T([-3.0, -4.0]), T([-4.0, -3.0]), T([True, False]), kl=T(0.2))
    assert losses.tolist() == pytest.approx([2.0 * (1 - sig(0.5 * (1.0 - 0.2))), 0.5 * (1 - sig(0.5 * (0.2 - -1.0)))])


def test_label_logps_pick_the_label_token_under_a_log_softmax():
    logits = torch.randn(2, 4, 7)
    labels = T([[-100, 3, 5, -100], [-100, -100, 1, 2]])
    logps, mask = label_logps(logits, labels)
    reference = torch.log_softmax(logits, -1)
    assert mask.tolist() == [[True, True, False], [False, True, True]]
    assert logps[0, 0].item() == pytest.approx(reference[0, 0, 3].item(), rel=1e-5)
    assert logps[1, 2].item() == pytest.approx(reference[1, 2, 2].item(), rel=1e-5)
    assert logps[0, 2].item() == 0.0


@pytest.fixture()
def dpo_setup(world_of_one, tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    records = preference_records(generate_problems(3, "eval"))
    rows = [tokenize_preference(tokenizer, r["context"], r["chosen"], r["rejected"], 128) for r in records]
    batch = PreferenceCollator(tokenizer.pad_token_id)(rows)
    policy = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    reference = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    with torch.no_grad():                    # make the policy differ from the reference
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return batch, policy, reference


def _separate(model, batch, side):
    with torch.no_grad():
        return sequence_logps(model, batch, f"{side}_")


@pytest.mark.parametrize("loss_fn", [DPOLoss(beta=0.1), DPOLoss(beta=0.1, loss_type="ipo"), SimPOLoss(), ORPOLoss()],
                         ids=["dpo", "ipo", "simpo", "orpo"])
def test_dpo_trainer_batch_equals_the_loss_of_separate_forwards(dpo_setup, loss_fn):
    batch, policy, reference = dpo_setup
    (pc, nc), (pr, nr) = _separate(policy, batch, "chosen"), _separate(policy, batch, "rejected")
    (rc, _), (rr, _) = _separate(reference, batch, "chosen"), _separate(reference, batch, "rejected")
    if loss_fn.length_normalized:
        pc, pr, rc, rr = pc / nc, pr / nr, rc / nc, rr / nr
    expected = loss_fn(pc, pr, rc, rr) if loss_fn.needs_reference else loss_fn(pc, pr)
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(policy, torch.optim.AdamW(policy.parameters(), lr=1e-3))
    trainer = DPOTrainer(model, booster, optimizer, plugin, ref_model=reference if loss_fn.needs_reference else None,
                         loss_fn=loss_fn)
    model.eval()
    with torch.no_grad():
        result = trainer._compute_batch(batch)
    assert result.loss.item() == pytest.approx(expected.losses.sum().item(), rel=1e-5)
    assert result.metrics["logps/chosen"][0] == pytest.approx(pc.sum().item(), rel=1e-5)
    margins = (expected.chosen_rewards - expected.rejected_rewards)
    assert result.metrics["rewards/margins"] == (pytest.approx(margins.sum().item(), rel=1e-4, abs=1e-6), 3)
    assert result.metrics["rewards/accuracies"][0] == (margins > 0).sum().item()


def test_rpo_adds_alpha_times_the_chosen_per_token_nll_to_dpo(dpo_setup):
    """TRL's rpo_alpha: each pair's DPO loss plus alpha * (-log p(chosen) / its tokens), nll_loss logged."""
    batch, policy, reference = dpo_setup
    (pc, nc), (pr, _) = _separate(policy, batch, "chosen"), _separate(policy, batch, "rejected")
    (rc, _), (rr, _) = _separate(reference, batch, "chosen"), _separate(reference, batch, "rejected")
    nll = -pc / nc
    expected = DPOLoss(beta=0.1)(pc, pr, rc, rr).losses + 0.5 * nll
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(policy, torch.optim.AdamW(policy.parameters(), lr=1e-3))
    trainer = DPOTrainer(model, booster, optimizer, plugin, ref_model=reference, loss_fn=DPOLoss(beta=0.1), rpo_alpha=0.5)
    model.eval()
    with torch.no_grad():
        result = trainer._compute_batch(batch)
    assert result.loss.item() == pytest.approx(expected.sum().item(), rel=1e-5)
    assert result.metrics["nll_loss"][0] == pytest.approx(nll.sum().item(), rel=1e-5)
