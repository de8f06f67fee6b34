"""Pairwise losses against their formulas; the reward-model trainer's forward, metrics and HF round trip."""
import math

import pytest
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from coati.dataset import PreferenceCollator, pad_sequences, tokenize_preference
from coati.dataset.demo_data import generate_problems, preference_records
from coati.models.loss import LogExpLoss, LogSigLoss
from coati.models.reward_model import load_reward_model, sequence_rewards
from coati.trainer.rm import RewardModelTrainer


def test_pairwise_losses_match_hand_computed_values():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([0.0, 1.0, 0.5])
    expected = [math.log(1 + math.exp(-2.0)), math.log(1 + math.exp(2.0)), math.log(2.0)]
    assert LogSigLoss(reduction="none")(chosen, rejected).tolist() == pytest.approx(expected)
    assert LogExpLoss(reduction="none")(chosen, rejected).tolist() == pytest.approx(expected)
    assert LogSigLoss()(chosen, rejected).item() == pytest.approx(sum(expected) / 3)
    assert LogSigLoss(reduction="sum")(torch.tensor([100.0]), torch.tensor([0.0])).item() == pytest.approx(0.0, abs=1e-30)


@pytest.fixture()
def rm_batch(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    records = preference_records(generate_problems(8, "eval"))
    rows = [tokenize_preference(tokenizer, r["context"], r["chosen"], r["rejected"], 128) for r in records]
    return tokenizer, PreferenceCollator(tokenizer.pad_token_id)(rows)


def test_collator_pads_both_sides_to_one_length(rm_batch):
    tokenizer, batch = rm_batch
    assert batch["chosen_input_ids"].shape == batch["rejected_input_ids"].shape
    lengths = batch["chosen_attention_mask"].sum(1)
    for row, n in enumerate(lengths.tolist()):
        assert (batch["chosen_input_ids"][row, n:] == tokenizer.pad_token_id).all()


def test_trainer_metrics_match_separate_forwards(world_of_one, tiny_assets, rm_batch, tmp_path):
    tokenizer, batch = rm_batch
    model = load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id)
    model.eval()
    with torch.no_grad():
        chosen = sequence_rewards(model, batch["chosen_input_ids"], batch["chosen_attention_mask"])
        rejected = sequence_rewards(model, batch["rejected_input_ids"], batch["rejected_attention_mask"])
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    boosted, optimizer, *_ = booster.boost(model, optimizer)
    trainer = RewardModelTrainer(boosted, booster, optimizer, plugin, tokenizer=tokenizer)
    boosted.eval()
    with torch.no_grad():
        result = trainer._compute_batch(batch)
    pairs = len(chosen)
    expected_loss = LogSigLoss(reduction="sum")(chosen, rejected).item()
    assert result.loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert result.metrics["chosen_rewards"][0] == pytest.approx(chosen.sum().item(), rel=1e-5, abs=1e-5)
    assert result.metrics["margin"][0] == pytest.approx((chosen - rejected).sum().item(), rel=1e-4, abs=1e-5)
    assert result.metrics["accuracy"] == ((chosen > rejected).sum().item(), pairs)

    model.save_pretrained(tmp_path / "rm")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    with torch.no_grad():
        again = sequence_rewards(reloaded, batch["chosen_input_ids"], batch["chosen_attention_mask"])
    assert torch.allclose(again, chosen, atol=1e-5)


def test_reward_is_read_at_the_last_non_pad_token_under_right_and_left_padding(tiny_assets, rm_batch):
    tokenizer, batch = rm_batch
    model = load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id).eval()
    ids, mask = batch["chosen_input_ids"], batch["chosen_attention_mask"]
    lengths = mask.sum(1).tolist()
    assert min(lengths) < ids.size(1), "the shortest row carries padding"
    rows = [ids[i, :n].tolist() for i, n in enumerate(lengths)]
    left_ids = pad_sequences(rows, tokenizer.pad_token_id, left=True)
    left_mask = pad_sequences([[1] * n for n in lengths], 0, left=True)
    with torch.no_grad():
        right = sequence_rewards(model, ids, mask)
        left = sequence_rewards(model, left_ids, left_mask)
        alone = torch.cat([sequence_rewards(model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)) for r in rows])
    assert torch.allclose(right, alone, atol=1e-5)
    assert torch.allclose(left, alone, atol=1e-5)
