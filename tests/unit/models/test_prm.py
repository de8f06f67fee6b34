"""Process reward models: step-labelled data (labels on the tokens that end the steps), the per-step metrics, step
scores landing on the tokens that end each step of a left-padded completion, the process advantage estimator against
hand-computed values, and the PRM loss. train_prm.py, then GRPO and PPO with its step scores, under torchrun:
e2e/test_prm_e2e.py."""
import pytest
import torch

from coati.dataset.tokenization import IGNORE_INDEX, tokenize_steps
from coati.dataset.validation import DataValidationError, validate_prm
from coati.experience.advantages import AdvantageConfig, process_advantages
from coati.models.prm import separator_tokens, step_ends, step_scores
from coati.trainer.prm import first_error_hits, step_metrics


def test_each_steps_label_sits_on_the_token_that_ends_it(tokenizer):
    steps, labels = ["3 + 4 = 7.", "#### 8", "so it is 8"], [True, False, False]
    row = tokenize_steps(tokenizer, "Ann has 3 pens and gets 4 more.", steps, labels, 256)
    ids, marked = row["input_ids"], [(i, label) for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX]
    assert [label for _, label in marked] == [1, 0, 0]
    assert all("\n" in tokenizer.decode([ids[i + 1]]) for i, _ in marked)   # each on the step's last token
    assert tokenizer.decode(ids[:marked[0][0] + 1]).endswith("3 + 4 = 7.")
    cut = tokenize_steps(tokenizer, "Ann has 3 pens and gets 4 more.", steps, labels, marked[1][0])
    assert [label for label in cut["labels"] if label != IGNORE_INDEX] == [1]   # the steps past max_length are dropped
    assert tokenize_steps(tokenizer, "Ann has 3 pens and gets 4 more.", steps, labels, 3) is None


@pytest.mark.parametrize("row, field, problem", [
    ({"prompt": "q", "completions": ["a", "b"]}, "labels", "missing: a process reward model needs a label per step"),
    ({"prompt": "q", "completions": ["a", "b"], "labels": [True]}, "labels", "1 labels for 2 steps"),
    ({"prompt": "q", "completions": ["a"], "labels": ["yes"]}, "labels", "expected a list of true/false"),
    ({"prompt": "q", "completions": [], "labels": []}, "completions", "expected a non-empty list")])
def test_prm_rows_without_usable_step_labels_are_refused_by_name(row, field, problem):
    with pytest.raises(DataValidationError, match=f"rows.jsonl:3: field '{field}': {problem}"):
        validate_prm(row, "rows.jsonl:3")


def test_per_step_metrics_and_the_first_error():
    labels = torch.tensor([[IGNORE_INDEX, 1, IGNORE_INDEX, 0, 0, 1], [1, 1, 1, 1, IGNORE_INDEX, IGNORE_INDEX]])
    predicted = torch.tensor([[0, 1, 0, 1, 0, 1], [1, 1, 0, 1, 0, 0]])
    labelled = labels != IGNORE_INDEX
    correct = (predicted == labels) & labelled
    metrics = step_metrics(correct, labelled)
    assert metrics["accuracy"] == (6, 8)
    assert metrics["accuracy/step_1"] == (2, 2) and metrics["accuracy/step_2"] == (1, 2)
    assert metrics["accuracy/step_3"] == (1, 2) and metrics["accuracy/later_steps"] == (2, 2)
    # row 0: first wrong step is the 2nd, the model says the 3rd; row 1: none wrong, the model says the 3rd
    assert first_error_hits(predicted, labels, labelled) == (0, 2)
    assert first_error_hits(labels.clamp(min=0), labels, labelled) == (2, 2)


def test_step_scores_land_on_the_tokens_that_end_each_step_of_left_padded_rows(tiny_assets, tokenizer):
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    prm = AutoModelForTokenClassification.from_pretrained(tiny_assets["model"], num_labels=2).eval()
    separators = separator_tokens(tokenizer, "\n")
    prompts = [tokenizer("Ann has 3 pens.")["input_ids"], tokenizer("Ben has 9 coins and gets 1 more.")["input_ids"]]
    completions = [tokenizer("3 + 1 = 4.\n#### 4", add_special_tokens=False)["input_ids"],
                   tokenizer("9 + 1 = 10.\n", add_special_tokens=False)["input_ids"]]
    width, length = max(map(len, prompts)), max(map(len, completions))
    sequences = torch.full((2, width + length), tokenizer.pad_token_id)
    attention, action = torch.zeros_like(sequences), torch.zeros(2, length, dtype=torch.bool)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        sequences[row, width - len(prompt):width] = torch.tensor(prompt)
        sequences[row, width:width + len(completion)] = torch.tensor(completion)
        attention[row, width - len(prompt):width + len(completion)] = 1
        action[row, :len(completion)] = True
    scores, ends = step_scores(prm, sequences, attention, width, action, separators)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        expected = [i for i, t in enumerate(completion[:-1]) if "\n" in tokenizer.decode([completion[i + 1]])]
        if "\n" not in tokenizer.decode([completion[-1]]):
            expected.append(len(completion) - 1)   # a last step with no separator after it
        assert ends[row].nonzero().flatten().tolist() == expected
        with torch.no_grad():
            alone = torch.softmax(prm(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt):], -1)[:, 1]
        assert torch.allclose(scores[row, :len(completion)][ends[row, :len(completion)]], alone[expected], atol=1e-5)
        assert (scores[row][~ends[row]] == 0).all()
    assert ends[1].sum() == 1   # row 1 ends with its separator: one step
    stopped = step_ends(sequences[:, width:], action, separators, terminated=torch.tensor([True, False]))
    assert stopped[0].nonzero().flatten().tolist() == [*ends[0].nonzero().flatten().tolist()[:-1], len(completions[0]) - 2]
    assert torch.equal(stopped[1], ends[1])
    cut = step_ends(sequences[:, width:], action, separators, terminated=torch.tensor([False, False]))
    assert cut[0].nonzero().flatten().tolist() == ends[0].nonzero().flatten().tolist()[:-1]   # its last step unfinished


def test_process_advantages_normalise_each_groups_step_scores_and_sum_those_still_to_come():
    step_rewards = torch.tensor([[0.9, 0.0, 0.5, 0.0], [0.0, 0.2, 0.0, 0.0]])
    step_mask = step_rewards > 0
    rewards = torch.tensor([1.0, 0.0])
    advantages = process_advantages(rewards, AdvantageConfig(2, True, {"aggregation": "sum"}, step_rewards, step_mask))
    scores = [0.9, 0.5, 0.2]
    mean = sum(scores) / 3
    std = (sum((s - mean) ** 2 for s in scores) / 2) ** 0.5
    n = [(s - mean) / std for s in scores]
    outcome = [0.5 / 0.5 ** 0.5, -0.5 / 0.5 ** 0.5]   # grpo on [1, 0]: the group's std is sqrt(0.5)
    expected = torch.tensor([[n[0] + n[1], n[1], n[1], 0.0], [n[2], n[2], 0.0, 0.0]]) + torch.tensor(outcome)[:, None]
    assert torch.allclose(advantages, expected, atol=1e-5)
    with pytest.raises(ValueError, match="needs a process reward model's step scores"):
        process_advantages(rewards, AdvantageConfig(2))
    with pytest.raises(ValueError, match="aggregation=mean: expected one of min, sum"):
        process_advantages(rewards, AdvantageConfig(2, True, {"aggregation": "mean"}, step_rewards, step_mask))


def test_process_advantages_by_default_give_each_completion_its_worst_steps_score_group_centred():
    step_rewards = torch.tensor([[0.9, 0.0, 0.5], [0.0, 0.2, 0.0], [0.8, 0.8, 0.8], [0.0, 0.0, 0.0]])
    step_mask = step_rewards > 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    advantages = process_advantages(rewards, AdvantageConfig(2, True, {}, step_rewards, step_mask))
    worst = [0.5, 0.2, 0.8, 0.0]   # the last completion has no ended step: 0
    pairs = [(worst[0], worst[1]), (worst[2], worst[3])]
    process = [d for a, b in pairs for d in ((a - b) / 2, (b - a) / 2)]   # centred within the group, not scaled
    outcome = [0.5 / 0.5 ** 0.5, -0.5 / 0.5 ** 0.5, 0.0, 0.0]
    assert torch.allclose(advantages, torch.tensor(process) + torch.tensor(outcome), atol=1e-5)
    more_steps = step_rewards.clone()
    more_steps[0, 1] = 0.95   # one more good step cannot raise a completion's advantage
    assert process_advantages(rewards, AdvantageConfig(2, True, {}, more_steps, more_steps > 0))[0] <= advantages[0]


def test_the_prm_loss_is_the_cross_entropy_of_the_labelled_steps_only(tiny_assets, tokenizer):
    from types import SimpleNamespace

    import torch.nn.functional as F
    from transformers import AutoModelForTokenClassification

    from coati.dataset.collators import SupervisedCollator
    from coati.trainer.prm import PRMTrainer

    torch.manual_seed(0)
    prm = AutoModelForTokenClassification.from_pretrained(tiny_assets["model"], num_labels=2)
    rows = [tokenize_steps(tokenizer, "Ann has 3 pens.", ["3 + 1 = 4.", "#### 4"], [True, False], 64),
            tokenize_steps(tokenizer, "Ben has 9 coins and gets 1 more.", ["9 + 1 = 10."], [True], 64)]
    batch = SupervisedCollator(tokenizer.pad_token_id)(rows)
    result = PRMTrainer._compute_batch(SimpleNamespace(model=prm), batch)
    logits = [prm(input_ids=torch.tensor([row["input_ids"]])).logits[0] for row in rows]
    by_hand = sum(F.cross_entropy(l[i:i + 1], torch.tensor([label]), reduction="sum")
                  for l, row in zip(logits, rows) for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX)
    assert result.metrics["loss"][1] == 3   # three labelled steps, padding and prompt tokens left out
    assert result.loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
