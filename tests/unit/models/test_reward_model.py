"""Pairwise losses against their formulas; the reward-model trainer's forward, metrics and HF round trip."""
import json
import math

import pytest
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from colossalai.cluster import DistCoordinator
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from coati.dataset import PreferenceCollator, load_prepared, pad_sequences, tokenize_preference
from coati.dataset.demo_data import generate_problems, preference_records
from coati.models.loss import LogExpLoss, LogSigLoss
from coati.models.reward_model import load_reward_model, sequence_rewards
from coati.trainer.rm import RewardModelTrainer
from coati.cli.runner import build_dataloader
from coati.utils import CoatiUsageError


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
    expected_loss = LogSigLoss(beta=0.1, reduction="sum")(chosen, rejected).item()   # the published default beta
    assert result.loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert result.metrics["chosen_rewards"][0] == pytest.approx(chosen.sum().item(), rel=1e-5, abs=1e-5)
    assert result.metrics["margin"][0] == pytest.approx((chosen - rejected).sum().item(), rel=1e-4, abs=1e-5)
    assert result.metrics["accuracy"] == ((chosen > rejected).sum().item(), pairs)

    model.save_pretrained(tmp_path / "rm")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    with torch.no_grad():
        again = sequence_rewards(reloaded, batch["chosen_input_ids"], batch["chosen_attention_mask"])
    assert torch.allclose(again, chosen, atol=1e-5)


def test_trls_margin_column_and_reward_centring_give_trls_loss(world_of_one, tiny_assets, tmp_path):
    """A preference row's TRL `margin` survives preparation and collation, and the pair's loss is TRL's
    -log sigmoid(r_c - r_r - margin), plus center_rewards_coefficient * (r_c + r_r)^2."""
    from coati.dataset.demo_data import write_jsonl
    from coati.dataset.prepare import prepare_preference

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    records = [{**r, "margin": m} for r, m in zip(preference_records(generate_problems(4, "eval")), (0.0, 1.5, 3.0, -1))]
    prepare_preference([write_jsonl(records, tmp_path / "margins.jsonl")], tokenizer, 128, tmp_path / "prepared")
    rows = list(load_prepared([tmp_path / "prepared"], "preference"))
    batch = PreferenceCollator(tokenizer.pad_token_id)(rows)
    assert batch["margin"].tolist() == [0.0, 1.5, 3.0, -1.0]
    model = load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id).eval()
    with torch.no_grad():
        chosen = sequence_rewards(model, batch["chosen_input_ids"], batch["chosen_attention_mask"])
        rejected = sequence_rewards(model, batch["rejected_input_ids"], batch["rejected_attention_mask"])
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    trainer = RewardModelTrainer(boosted, booster, optimizer, plugin, tokenizer=tokenizer,   # `coati rm`'s loss
                                 loss_fn=LogSigLoss(reduction="none"), center_rewards_coefficient=0.01)
    boosted.eval()
    with torch.no_grad():
        loss = trainer._compute_batch(batch).loss.item()
    expected = (-torch.nn.functional.logsigmoid(chosen - rejected - batch["margin"]) + 0.01 * (chosen + rejected) ** 2)
    assert loss == pytest.approx(expected.sum().item(), rel=1e-5)


def test_a_margin_that_is_not_a_number_is_one_line_naming_the_row():
    from coati.dataset.validation import DataValidationError, validate_preference

    assert validate_preference({"chosen": "a b", "rejected": "a c", "margin": 2}, "f:1")["margin"] == 2.0
    assert "margin" not in validate_preference({"chosen": "a b", "rejected": "a c"}, "f:1")
    with pytest.raises(DataValidationError, match=r"f:3: field 'margin': expected a finite number, got 'big'"):
        validate_preference({"chosen": "a b", "rejected": "a c", "margin": "big"}, "f:3")


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


def _rm_setup(tiny_assets, tokenizer):
    model = load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id)
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    return model, booster, optimizer, plugin, scheduler


def test_published_signature_and_fit_keywords_write_eval_results_into_save_dir(world_of_one, tiny_assets, tmp_path):
    """ColossalChat's positional arguments (with beta), its fit keywords, and evaluation results in save_dir."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model, booster, optimizer, plugin, scheduler = _rm_setup(tiny_assets, tokenizer)
    collator = PreferenceCollator(tokenizer.pad_token_id)
    train = build_dataloader(plugin, load_prepared([tiny_assets["pref_train"]]), 16, collator, True, 0)
    held_out = build_dataloader(plugin, load_prepared([tiny_assets["pref_eval"]]), 16, collator, False, 0)
    trainer = RewardModelTrainer(model, booster, optimizer, plugin, scheduler, tokenizer, None, 1, 0.5, 1, 0, 0,
                                 str(tmp_path / "ckpt"), DistCoordinator())
    assert isinstance(trainer.loss_fn, LogSigLoss) and trainer.loss_fn.beta == 0.5
    assert all(callable(getattr(trainer, name)) for name in ("_before_fit", "_train", "_eval"))
    trainer.fit(train_preference_dataloader=train, eval_preference_dataloader=held_out, log_dir=str(tmp_path / "logs"),
                use_wandb=False)
    results = json.loads((tmp_path / "ckpt" / "eval_result_epoch0.json").read_text())
    assert results["epoch"] == 0 and 0 <= results["accuracy"] <= 1 and results["loss"] > 0
    assert (tmp_path / "ckpt" / "eval_result_epoch0.txt").read_text().startswith("epoch 0, optimizer step 6")


def _colossalchat_mean_loss(chosen, rejected):
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()


@pytest.mark.parametrize("loss_fn", [LogSigLoss(reduction="none"), LogSigLoss(reduction="mean"),
                                     LogSigLoss(reduction="sum"), _colossalchat_mean_loss],
                         ids=["none", "mean", "sum", "colossalchat_mean"])
def test_a_reducing_loss_gives_the_per_pair_loss_and_gradient(world_of_one, tiny_assets, rm_batch, loss_fn):
    tokenizer, _ = rm_batch
    trainer = RewardModelTrainer(*_rm_setup(tiny_assets, tokenizer), tokenizer, loss_fn)
    chosen = torch.tensor([2.0, -1.0, 0.5, 0.3], requires_grad=True)
    rejected = torch.tensor([0.0, 1.0, 0.5, -0.2])
    for _ in range(2):                                        # measured on the first call, reused after
        summed = trainer._summed_loss(chosen, rejected)
        expected = -torch.nn.functional.logsigmoid(chosen - rejected).sum()
        assert summed.item() == pytest.approx(expected.item(), rel=1e-6)
        grad, = torch.autograd.grad(summed, chosen)
        expected_grad, = torch.autograd.grad(expected, chosen)
        assert torch.allclose(grad, expected_grad, atol=1e-7)


def test_a_loss_reduced_some_other_way_is_refused_by_name(world_of_one, tiny_assets, rm_batch):
    def worst_pair(chosen, rejected):
        return (-torch.nn.functional.logsigmoid(chosen - rejected)).max()

    tokenizer, _ = rm_batch
    trainer = RewardModelTrainer(*_rm_setup(tiny_assets, tokenizer), tokenizer, worst_pair)
    with pytest.raises(CoatiUsageError, match="loss_fn worst_pair reduces its per-pair losses neither to their mean"):
        trainer._summed_loss(torch.tensor([2.0, -1.0, 0.5]), torch.tensor([0.0, 1.0, 0.2]))
    trainer.loss_fn = lambda chosen, rejected: torch.zeros(2, 2)
    trainer._reduction = None
    with pytest.raises(CoatiUsageError, match=r"returned a tensor of shape \(2, 2\) for 3 pairs"):
        trainer._summed_loss(torch.tensor([2.0, -1.0, 0.5]), torch.tensor([0.0, 1.0, 0.2]))


def test_the_scorer_reads_rollout_samples_as_they_are_and_pads_them_once(tiny_assets, rm_batch):
    """Samples of different prompt lengths, one with environment tokens after its last sampled token (a multi-turn
    episode cut by its token budget): collated once, each gets the score of its own attended tokens alone."""
    from coati.experience.experience import RolloutSample
    from coati.experience.scorer import REWARD_MODEL, Scorer

    tokenizer, _ = rm_batch
    model = load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id).eval()
    samples = [RolloutSample([5, 6, 7], [8, 9], [True, True], None, [0, 0]),
               RolloutSample([10], [11, 12, 13, 14], [True, False, True, False], None, [0] * 4),
               RolloutSample([15, 16], [17], [True], None, [0])]
    total, components = Scorer(tokenizer, reward_model=model).score_texts(["p"] * 3, ["c"] * 3, {}, samples)
    with torch.no_grad():
        alone = [sequence_rewards(model, torch.tensor([s.attended_ids]), torch.ones(1, len(s.attended_ids),
                                                                                     dtype=torch.long)).item()
                 for s in samples]
    assert [s.attended_ids for s in samples] == [[5, 6, 7, 8, 9], [10, 11, 12, 13], [15, 16, 17]]
    assert total == pytest.approx(alone, abs=1e-5) and components[REWARD_MODEL] == total


def test_a_critic_from_a_reward_model_says_only_its_bias_is_new(tiny_assets, tmp_path, capsys):
    from coati.models.critic import load_critic

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id).save_pretrained(tmp_path / "rm")
    capsys.readouterr()
    load_critic(str(tmp_path / "rm"), tokenizer.pad_token_id)
    said = capsys.readouterr().err
    assert "critic: score.bias start freshly initialised" in said and "language model" not in said


def test_a_margin_only_some_rows_have_is_kept_whichever_row_comes_first(tiny_assets, tmp_path):
    """Rows without TRL's margin beside rows with one (first, or in another file): the column is kept, and a pair
    without one trains with no margin (0)."""
    from coati.dataset.demo_data import write_jsonl
    from coati.dataset.prepare import prepare_preference

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    plain, with_margin = preference_records(generate_problems(2, "eval"))
    files = [write_jsonl([plain], tmp_path / "plain.jsonl"), write_jsonl([{**with_margin, "margin": 2.0}],
                                                                         tmp_path / "margin.jsonl")]
    prepare_preference(files, tokenizer, 128, tmp_path / "prepared")
    rows = list(load_prepared([tmp_path / "prepared"], "preference"))
    assert [row["margin"] for row in rows] == [None, 2.0]
    assert PreferenceCollator(tokenizer.pad_token_id)(rows)["margin"].tolist() == [0.0, 2.0]
