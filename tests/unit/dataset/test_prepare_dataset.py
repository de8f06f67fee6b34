"""prepare_dataset.py: accepted shapes, one-line errors with file/line/field and exit 2, skip counts."""
import json

import pytest
from datasets import Dataset, load_from_disk
from transformers import AutoTokenizer

from coati.cli.commands import prepare, rm
from coati.dataset import load_prepared
from coati.models.tiny import END_OF_TURN
from support import run_main

GOOD_SFT = {"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _prepare(tiny_assets, data_type, inputs, out, *extra):
    """prepare_dataset.py with these flags, in this process (`examples/.../prepare_dataset.py` is `coati prepare`;
    `tests/e2e/test_bad_inputs.py` runs it as a process of its own)."""
    return run_main(prepare, ["--type", data_type, "--data_input_dirs", *map(str, inputs), "--tokenizer_dir",
                              str(tiny_assets["model"]), "--data_output_dirs", str(out), "--max_length", "64", *extra])


BAD_ROWS = [
    ('{"messages": [', "field '<line>': invalid JSON (Expecting value at column 15)"),
    ({"conversation": []}, "field 'messages': missing (the row's columns: conversation; --dataset_columns "
                           "COLUMN=messages reads one of them as messages)"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "field 'messages': wrong role order: turn 1 is assistant, expected user"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]},
     "field 'messages': assistant turn 2 is empty"),
    ({"messages": [{"role": "robot", "content": "q"}]}, "field 'messages[0].role': unknown role 'robot'"),
]


def test_columns_named_otherwise_are_read_under_the_names_given(tiny_assets, tmp_path, world_of_one):
    """--dataset_columns question=prompt answer=completion: OpenRLHF's or verl's column names read as coati's; a
    column the row lacks, or one that would replace a column it has, is one line naming the row."""
    from datasets import load_from_disk

    rows = [{"question": f"What is {n}+1?", "answer": str(n + 1), "id": n} for n in range(4)]
    raw = _write(tmp_path / "raw.jsonl", rows)
    renamed = _prepare(tiny_assets, "sft", [raw], tmp_path / "out", "--dataset_columns", "question=prompt",
                       "answer=completion")
    assert renamed.returncode == 0, renamed.stderr[-2000:]
    plain = _write(tmp_path / "plain.jsonl", [{"prompt": r["question"], "completion": r["answer"]} for r in rows])
    assert _prepare(tiny_assets, "sft", [plain], tmp_path / "plain").returncode == 0
    assert load_from_disk(str(tmp_path / "out"))["input_ids"] == load_from_disk(str(tmp_path / "plain"))["input_ids"]
    from coati.dataset.cache import cache_key
    from coati.dataset.prepare import DataPart

    keys = {cache_key([str(raw)], "sft", str(tiny_assets["model"]), 64, DataPart(columns=columns))
            for columns in ((), (("question", "prompt"),), (("question", "prompt"), ("answer", "completion")))}
    assert len(keys) == 3   # a run's cache of raw data is keyed by the columns renamed
    from coati.cli import commands

    train = ["--pretrain", str(tiny_assets["model"]), "--max_steps", "1", "--dataset_columns", "question=prompt"]
    trained = run_main(commands.sft, [*train, "answer=completion", "--dataset", str(raw)])
    assert trained.returncode == 0, trained.stderr[-2000:]
    refused = run_main(commands.sft, [*train, "--dataset", str(tmp_path / "out")])
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"error: --dataset_columns renames raw data's columns as it is prepared; --dataset {tmp_path / 'out'} is "
        "prepared already: prepare its raw data again with them")
    missing = _prepare(tiny_assets, "sft", [raw], tmp_path / "missing", "--dataset_columns", "question=prompt",
                       "reply=completion")
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1] == (
        f"error: {raw}:1: field 'reply': no such column to read as 'completion' (--dataset_columns reply=completion); "
        "the row has 'question', 'answer', 'id'")   # the columns as the data names them
    both = _prepare(tiny_assets, "sft", [plain], tmp_path / "both", "--dataset_columns", "completion=prompt")
    assert both.returncode == 2 and both.stderr.strip().splitlines()[-1] == (
        f"error: {plain}:1: field 'prompt': the row has it already beside 'completion', which --dataset_columns "
        "completion=prompt reads as it: name one of them otherwise")


@pytest.mark.parametrize("bad,message", BAD_ROWS)
def test_bad_row_gives_one_line_with_file_line_and_field(tiny_assets, tmp_path, bad, message):
    raw = _write(tmp_path / "raw.jsonl", [GOOD_SFT, GOOD_SFT, bad])
    result = _prepare(tiny_assets, "sft", [raw], tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {raw}:3: {message}"
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_missing_input_file_exits_2(tiny_assets, tmp_path):
    result = _prepare(tiny_assets, "sft", [tmp_path / "nope.jsonl"], tmp_path / "out")
    assert result.returncode == 2 and result.stderr.strip().endswith(f"data input not found: {tmp_path / 'nope.jsonl'}")


def test_skip_invalid_counts_bad_rows_and_keeps_reading(tiny_assets, tmp_path):
    raw = _write(tmp_path / "raw.jsonl", [GOOD_SFT, '{"broken', GOOD_SFT, {"messages": []}, GOOD_SFT])
    result = _prepare(tiny_assets, "sft", [raw], tmp_path / "out", "--skip_invalid")
    assert result.returncode == 0, result.stderr
    assert "3 of 3 valid rows kept, 0 dropped by truncation, 2 invalid rows skipped" in result.stdout
    assert len(load_from_disk(str(tmp_path / "out"))) == 3


def test_colossalchat_keys_and_plain_string_preferences(tiny_assets, tmp_path):
    sft = _write(tmp_path / "sft.jsonl", [{"messages": [{"from": "human", "content": "q"}, {"from": "assistant", "content": "a"}]}])
    assert _prepare(tiny_assets, "sft", [sft], tmp_path / "sft").returncode == 0
    pref = _write(tmp_path / "pref.jsonl", [{"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}])
    result = _prepare(tiny_assets, "preference", [pref], tmp_path / "pref")
    assert result.returncode == 0, result.stderr
    row = load_from_disk(str(tmp_path / "pref"))[0]
    assert row["chosen_input_ids"] != row["rejected_input_ids"]


def test_prompt_rows_carry_ground_truth_fields(tiny_assets, tmp_path):
    raw = _write(tmp_path / "p.jsonl", [{"prompt": "3 + 4?", "gt_answer": "7"},
                                       {"messages": [{"role": "user", "content": "1 + 1?"}], "gt_answer": "2"}])
    assert _prepare(tiny_assets, "prompt", [raw], tmp_path / "out").returncode == 0
    rows = load_from_disk(str(tmp_path / "out"))
    assert rows["gt_answer"] == ["7", "2"]
    assert all(ids for ids in rows["input_ids"])


def test_responses_cut_away_by_truncation_are_dropped_and_counted(tiny_assets, tmp_path):
    long_question = {"messages": [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "a"}]}
    raw = _write(tmp_path / "raw.jsonl", [GOOD_SFT, long_question])
    result = _prepare(tiny_assets, "sft", [raw], tmp_path / "out")
    assert result.returncode == 0 and "1 of 2 valid rows kept, 1 dropped by truncation" in result.stdout


def test_local_dataset_folder_goes_through_load_dataset(tiny_assets, tmp_path):
    folder = tmp_path / "parquet"
    folder.mkdir()
    Dataset.from_list([GOOD_SFT, GOOD_SFT]).to_parquet(str(folder / "train.parquet"))
    result = _prepare(tiny_assets, "sft", [folder], tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert len(load_from_disk(str(tmp_path / "out"))) == 2


def test_prompt_sets_with_different_fields_mix_in_one_dataset(tiny_assets, tmp_path):
    gsm = _write(tmp_path / "gsm.jsonl", [{"prompt": "3 + 4?", "gt_answer": "7"}])
    chat = _write(tmp_path / "chat.jsonl", [{"prompt": "hello", "source": "chat"}])
    for name, raw in (("gsm", gsm), ("chat", chat)):
        assert _prepare(tiny_assets, "prompt", [raw], tmp_path / name).returncode == 0
    mixed = load_prepared([tmp_path / "gsm", tmp_path / "chat"], "prompt")
    assert mixed["gt_answer"] == ["7", None] and mixed["source"] == [None, "chat"]
    assert json.loads((tmp_path / "gsm" / "coati_prepared.json").read_text())["type"] == "prompt"


def test_training_script_refuses_data_of_another_type_by_name(tiny_assets):
    result = run_main(rm, ["--pretrain", str(tiny_assets["model"]), "--dataset", str(tiny_assets["pref_train"]),
                           str(tiny_assets["sft_train"]), "--plugin", "ddp"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (f"error: dataset {tiny_assets['sft_train']} was prepared as sft data; "
                                                      "this script needs preference data (prepare_dataset.py --type preference)")


def test_kto_rows_in_both_shapes_and_a_bad_label(tiny_assets, tmp_path):
    raw = _write(tmp_path / "kto.jsonl", [
        {"prompt": "2 + 2?", "completion": "4", "label": True},
        {"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "6"}], "label": False},
    ])
    assert _prepare(tiny_assets, "kto", [raw], tmp_path / "out").returncode == 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    rows = load_from_disk(str(tmp_path / "out"))
    assert rows["desirable"] == [True, False]
    for row, completion in zip(rows, ("4", "6")):
        start = row["prompt_length"]
        assert all(label == -100 for label in row["labels"][:start]) and row["labels"][start] != -100
        labelled = [t for t, label in zip(row["input_ids"], row["labels"]) if label != -100]
        assert tokenizer.decode(labelled) == completion + END_OF_TURN
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "q", "completion": "a", "label": "yes"}])
    result = _prepare(tiny_assets, "kto", [bad], tmp_path / "bad_out")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {bad}:1: field 'label': expected true or false, got 'yes'"


def test_preference_labels_skip_assistant_turns_of_the_context(tiny_assets, tmp_path):
    context = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}, {"role": "user", "content": "and 2 + 2?"}]
    raw = _write(tmp_path / "pref.jsonl", [{"context": context, "chosen": "4", "rejected": "5"}])
    assert _prepare(tiny_assets, "preference", [raw], tmp_path / "out").returncode == 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    row = load_from_disk(str(tmp_path / "out"))[0]
    labelled = [t for t, label in zip(row["chosen_input_ids"], row["chosen_labels"]) if label != -100]
    assert tokenizer.decode(labelled) == "4" + END_OF_TURN


def test_gsm8k_parquet_folder_reads_as_prompts_and_sft(tiny_assets, tmp_path):
    """openai/gsm8k's layout: a folder of parquet files with `question` and `answer` ending in `#### N`."""
    rows = [{"question": "Ann has 1,200 pens and gets 34 more. How many?", "answer": "1200 + 34 = 1234.\n#### 1,234"},
            {"question": "Ben owes 5 and pays 8. What is left?", "answer": "5 - 8 = -3.\n#### -3"}]
    (tmp_path / "gsm8k" / "main").mkdir(parents=True)
    Dataset.from_list(rows).to_parquet(str(tmp_path / "gsm8k" / "main" / "train-00000-of-00001.parquet"))
    assert _prepare(tiny_assets, "prompt", [tmp_path / "gsm8k"], tmp_path / "prompts").returncode == 0
    prompts = load_prepared([tmp_path / "prompts"], "prompt")
    assert prompts["gt_answer"] == ["1234", "-3"] and prompts["solution"] == [r["answer"] for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    assert "Ann has 1,200 pens" in tokenizer.decode(prompts[0]["input_ids"])
    assert _prepare(tiny_assets, "sft", [tmp_path / "gsm8k"], tmp_path / "sft").returncode == 0
    labelled = [t for t in load_from_disk(str(tmp_path / "sft"))[1]["labels"] if t != -100]
    assert tokenizer.decode(labelled) == rows[1]["answer"] + END_OF_TURN


def test_gsm8k_answer_without_final_mark_is_refused(tiny_assets, tmp_path):
    bad = _write(tmp_path / "gsm8k.jsonl", [{"question": "2 + 2?", "answer": "It is 4."}])
    result = _prepare(tiny_assets, "prompt", [bad], tmp_path / "out")
    assert result.returncode == 2
    assert f"{bad}:1: field 'answer': a GSM8K answer is a solution ending in '#### <number>'" in result.stderr


def test_sharegpt_conversations_and_colossalchat_kto_rows_prepare_like_ours(tiny_assets, tmp_path):
    from coati.dataset import prepare_dataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    sharegpt = _write(tmp_path / "sharegpt.jsonl", [{"conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "1 + 1?"}, {"from": "gpt", "value": "2"}]}])
    ours = _write(tmp_path / "ours.jsonl", [{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": "2"}]}])
    for name, raw in (("sharegpt", sharegpt), ("ours", ours)):
        assert prepare_dataset([raw], "sft", tokenizer, 64, tmp_path / name)["kept"] == 1
    assert load_from_disk(str(tmp_path / "sharegpt"))[0] == load_from_disk(str(tmp_path / "ours"))[0]

    prompts = _write(tmp_path / "prompts.jsonl", [{"conversations": [{"from": "human", "value": "2 + 2?"}],
                                                   "gt_answer": "4"}])
    prepare_dataset([prompts], "prompt", tokenizer, 64, tmp_path / "prompts")
    row = load_from_disk(str(tmp_path / "prompts"))[0]
    assert row["gt_answer"] == "4" and "conversations" not in row

    kto = _write(tmp_path / "kto.jsonl", [
        {"prompt": [{"from": "user", "content": "2 + 2?"}], "completion": {"from": "assistant", "content": "4"},
         "label": True}])
    listed = _write(tmp_path / "kto_listed.jsonl", [{"prompt": [{"role": "user", "content": "2 + 2?"}],
                                                     "completion": [{"role": "assistant", "content": "4"}], "label": True}])
    plain = _write(tmp_path / "kto_plain.jsonl", [{"prompt": "2 + 2?", "completion": "4", "label": True}])
    for name, raw in (("kto", kto), ("kto_listed", listed), ("kto_plain", plain)):
        prepare_dataset([raw], "kto", tokenizer, 64, tmp_path / name)
    assert load_from_disk(str(tmp_path / "kto"))[0] == load_from_disk(str(tmp_path / "kto_listed"))[0]
    plain_row = load_from_disk(str(tmp_path / "kto_plain"))[0]                    # TRL's standard text: no template
    assert tokenizer.decode(plain_row["input_ids"]) == "2 + 2?4" + tokenizer.eos_token


def test_data_prepared_by_colossalchat_is_refused_with_how_to_prepare_it_again(tmp_path):
    from coati.utils import CoatiUsageError

    Dataset.from_dict({"chosen_input_ids": [[1, 2]], "chosen_loss_mask": [[0, 1]], "rejected_input_ids": [[1, 3]],
                       "rejected_loss_mask": [[0, 1]]}).save_to_disk(str(tmp_path / "cc"))
    with pytest.raises(CoatiUsageError, match=r"prepared by ColossalChat's prepare_dataset.py \(it has a "
                                              r"'chosen_loss_mask' column\); prepare the raw data again with "
                                              r"examples/data_preparation_scripts/prepare_dataset.py --type preference"):
        load_prepared([tmp_path / "cc"], "preference")


def test_template_system_message_opens_conversations_without_one_and_prompt_answers_are_dropped(tiny_assets, tmp_path):
    """ColossalChat's template config: its `system_message` becomes the first turn of a conversation that has no
    system turn (one that has its own keeps it); a prompt row ending with the answer is prepared without it."""
    from coati.dataset.prepare import prepare_dataset
    from coati.dataset.tokenization import load_tokenizer, template_system_message

    config = tmp_path / "template.json"
    config.write_text(json.dumps({"system_message": "Answer with a number.", "stop_ids": [2]}))
    tokenizer = load_tokenizer(str(tiny_assets["model"]), template_config=str(config))
    own = {"role": "system", "content": "Be brief."}
    ask = {"role": "user", "content": "1 + 1?"}
    raw = _write(tmp_path / "p.jsonl", [{"messages": [ask, {"role": "assistant", "content": "2"}]}, {"messages": [own, ask]}])
    prepare_dataset([raw], "prompt", tokenizer, 64, tmp_path / "out", system_message=template_system_message(str(config)))
    texts = [tokenizer.decode(ids) for ids in load_from_disk(str(tmp_path / "out"))["input_ids"]]
    assert texts == [tokenizer.apply_chat_template([{"role": "system", "content": "Answer with a number."}, ask],
                                                   tokenize=False, add_generation_prompt=True),
                     tokenizer.apply_chat_template([own, ask], tokenize=False, add_generation_prompt=True)]


def _user(text):
    return {"role": "user", "content": text}


def _assistant(text):
    return {"role": "assistant", "content": text}


@pytest.mark.parametrize("row, message", [
    ({"question": [_user("q")], "chosen": [_assistant("x")], "rejected": [_assistant("y")]},
     "field 'chosen': no `prompt` (or `context`) column, so the prompt is the turns chosen and rejected start with "
     "(TRL's implicit prompt), and they share none up to a user turn; the row's other columns (question) are not read "
     "as its prompt"),
    ({"chosen": "same text", "rejected": "same text"}, "field 'chosen': the same text as rejected: a pair needs two "
                                                       "responses"),
    ({"chosen": [_user("q"), _assistant("a1"), _user("q2"), _assistant("a2")],
      "rejected": [_user("q"), _assistant("b1"), _user("q2"), _assistant("b2")]},
     "field 'chosen': chosen and rejected differ from turn 2 on, and the response after their shared turns holds a "
     "user turn: a response is assistant turns only; give the conversations every turn but the last reply in common, "
     "or a `prompt` column"),
    ({"prompt": "p", "chosen_response": "x", "rejected": "y"},
     "field 'chosen': missing (the row's columns: prompt, chosen_response, rejected; --dataset_columns "
     "COLUMN=chosen reads one of them as chosen)"),
], ids=["prompt_named_otherwise", "identical", "differ_before_the_last_reply", "misnamed"])
def test_a_preference_row_that_cannot_pair_says_why_in_the_data_s_terms(row, message):
    from coati.dataset.validation import DataValidationError, validate_preference

    with pytest.raises(DataValidationError) as refused:
        validate_preference(row, "f.jsonl:1")
    assert str(refused.value) == f"f.jsonl:1: {message}"


def test_trls_eos_token_becomes_the_tokenizers_and_keys_the_prepared_cache(tiny_assets, tmp_path):
    from coati.dataset.cache import cache_key
    from coati.dataset.tokenization import load_tokenizer
    from coati.utils.errors import CoatiUsageError

    model = str(tiny_assets["model"])
    tokenizer = load_tokenizer(model, eos_token="<|pad|>")
    assert tokenizer.eos_token == "<|pad|>" and tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|pad|>")
    with pytest.raises(CoatiUsageError, match=r"--eos_token '<\|eot_id\|>' is not a token of the tokenizer in "):
        load_tokenizer(model, eos_token="<|eot_id|>")
    raw = _write(tmp_path / "raw.jsonl", [GOOD_SFT])
    assert cache_key([str(raw)], "sft", model, 64, eos_token="<|pad|>") != cache_key([str(raw)], "sft", model, 64)
