"""The locally built tokenizer/model load through from_pretrained; labels mask all but assistant tokens."""
from transformers import AutoModelForCausalLM

from coati.dataset import (IGNORE_INDEX, KTOCollator, PreferenceCollator, PromptCollator, SupervisedCollator,
                           tokenize_conversation)
from coati.dataset.demo_data import _is_held_out, generate_problems, preference_records, prompt_records
from coati.models.tiny import END_OF_TURN


def test_tokenizer_eos_is_the_end_of_turn_token(tokenizer, tiny_assets):
    assert tokenizer.eos_token == END_OF_TURN
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert model.config.vocab_size >= len(tokenizer) and model.config.vocab_size % 64 == 0
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_digits_are_single_tokens_and_text_round_trips(tokenizer):
    ids = tokenizer("Ann has 12 apples.", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == "Ann has 12 apples."
    assert "1" in tokenizer.convert_ids_to_tokens(ids) and "2" in tokenizer.convert_ids_to_tokens(ids)


def test_labels_cover_assistant_tokens_and_end_of_turn_only(tokenizer):
    messages = [{"role": "user", "content": "Ann has 2 pens."}, {"role": "assistant", "content": "2 + 1 = 3. #### 3"}]
    encoded = tokenize_conversation(tokenizer, messages, max_length=128)
    labelled = [t for t, l in zip(encoded["input_ids"], encoded["labels"]) if l != IGNORE_INDEX]
    assert tokenizer.decode(labelled) == "2 + 1 = 3. #### 3" + END_OF_TURN
    assert tokenize_conversation(tokenizer, messages, max_length=8) is None   # the response would be cut away


def test_collator_pads_to_the_longest_in_batch(tokenizer):
    rows = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [5], "labels": [5]}]
    batch = SupervisedCollator(tokenizer.pad_token_id)(rows)
    assert batch["input_ids"].shape == (2, 3)
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [5, -100, -100]]


def test_collators_cut_rows_to_max_length_before_padding(tokenizer):
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}, {"input_ids": [5, 6], "labels": [-100, 6]}]
    batch = SupervisedCollator(tokenizer.pad_token_id, max_length=3)(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 6, tokenizer.pad_token_id]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, 6, -100]]
    pairs = [{"chosen_input_ids": [1, 2, 3, 4], "chosen_labels": [-100, 2, 3, 4],
              "rejected_input_ids": [1, 2], "rejected_labels": [-100, 2]}]
    batch = PreferenceCollator(tokenizer.pad_token_id, max_length=3)(pairs)
    assert batch["chosen_input_ids"].tolist() == [[1, 2, 3]]
    assert batch["rejected_attention_mask"].tolist() == [[1, 1, 0]]


def test_prompt_collator_left_pads_and_carries_fields(tokenizer):
    rows = [{"input_ids": [5, 6, 7], "gt_answer": "3"}, {"input_ids": [8], "gt_answer": "1"}]
    batch = PromptCollator(tokenizer.pad_token_id, max_length=2)(rows)
    assert batch["input_ids"].tolist() == [[6, 7], [tokenizer.pad_token_id, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1], [0, 1]]
    assert batch["gt_answer"] == ["3", "1"]


def test_prompt_rows_reach_workflows_unpadded_whether_or_not_the_loader_padded_them(tokenizer):
    """coati's prompt loaders hand rows over as they are (cut to `max_length`, the end kept); a left-padded batch
    (ColossalChat's prompt collator) is unpadded into the same rows."""
    from coati.dataset.collators import PromptRows, prompt_rows

    rows = [{"input_ids": [5, 6, 7], "gt_answer": "3"}, {"input_ids": [8], "gt_answer": "1"}]
    want = [{"input_ids": [6, 7], "gt_answer": "3"}, {"input_ids": [8], "gt_answer": "1"}]
    assert prompt_rows(PromptRows(max_length=2)(rows)) == want
    assert prompt_rows(PromptCollator(tokenizer.pad_token_id, max_length=2)(rows)) == want


def test_kto_collator_pairs_each_prompt_with_the_next_completion(tokenizer):
    rows = [{"input_ids": [1, 2, 10, 11], "labels": [-100, -100, 10, 11], "prompt_length": 2, "desirable": True},
            {"input_ids": [3, 20], "labels": [-100, 20], "prompt_length": 1, "desirable": False}]
    batch = KTOCollator(tokenizer.pad_token_id)(rows)
    pad = tokenizer.pad_token_id
    assert batch["kl_input_ids"].tolist() == [[1, 2, 20], [3, 10, 11]]
    assert batch["kl_labels"].tolist() == [[-100, -100, 20], [-100, 10, 11]]
    assert batch["input_ids"].tolist() == [[1, 2, 10, 11], [3, 20, pad, pad]]
    assert batch["desirable"].tolist() == [True, False]


def test_default_rejections_are_learnable_kinds():
    problems = generate_problems(40, "train")
    for problem, pref in zip(problems, preference_records(problems)):
        rejected = pref["rejected"][0]["content"]
        flipped = "-" if " + " in problem.solution else "+"
        assert f" {flipped} " in rejected or "####" not in rejected
    hard = preference_records(problems, rejections=["wrong_answer"])
    for problem, pref in zip(problems, hard):
        rejected = pref["rejected"][0]["content"]
        assert rejected.split(" = ")[0] == problem.solution.split(" = ")[0] and not rejected.endswith(f"#### {problem.answer}")


def test_task_splits_are_disjoint_and_answers_verifiable():
    train, held_out = generate_problems(200, "train"), generate_problems(50, "eval")
    for problem in train + held_out:
        left = problem.solution.split("=")[0]
        assert eval(left) == problem.answer and problem.solution.endswith(f"#### {problem.answer}")
    assert not {p.question for p in train} & {p.question for p in held_out}
    for pref in preference_records(held_out):
        assert pref["chosen"][0]["content"] != pref["rejected"][0]["content"]
    assert prompt_records(held_out[:1])[0]["gt_answer"] == str(held_out[0].answer)
    assert all(not _is_held_out(*_wording(p)) for p in train) and all(_is_held_out(*_wording(p)) for p in held_out)
    assert _facts(held_out) <= _facts(generate_problems(2000, "train")), "held-out arithmetic is covered by training"


def _wording(problem):
    """(name, item) of a question: what the held-out split is keyed on."""
    words = problem.question.split(" ")
    return words[0], words[3]


def _facts(problems):
    return {p.solution.split(" = ")[0] for p in problems}
