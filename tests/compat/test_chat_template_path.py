"""TRL's `chat_template_path` (coati's `--chat_template`): a Jinja file's template, or a tokenizer folder's template
and EOS, replaces the tokenizer's in the prepared data and the saved tokenizer; a folder whose tokens the tokenizer
lacks is refused (TRL would resize the model's embeddings)."""
import json

import pytest
from datasets import load_from_disk
from transformers import AutoTokenizer

from coati.cli import commands
from coati.dataset.tokenization import IGNORE_INDEX, load_tokenizer
from coati.utils.errors import CoatiUsageError
from conftest import parsed_args
from support import run_main

BRACKETS = ("{% for m in messages %}[{{ m['role'] }}]<|im_start|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]<|im_start|>{% endif %}")
CONVERSATION = {"prompt": [{"role": "user", "content": "What is 2 + 3?"}],
                "completion": [{"role": "assistant", "content": "#### 5"}]}


def _tokenizer_folder(tiny_assets, folder, template=BRACKETS, eos=None, extra_tokens=()):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    tokenizer.chat_template = template
    if eos:
        tokenizer.eos_token = eos
    if extra_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(extra_tokens)})
    tokenizer.save_pretrained(folder)
    return folder


def test_a_jinja_file_or_a_tokenizer_folder_sets_the_template(tiny_assets, tmp_path):
    """The file's text is the template; a folder gives its template and its EOS (TRL's clone_chat_template); TRL's
    --eos_token still decides over the folder's."""
    (tmp_path / "brackets.jinja").write_text(BRACKETS)
    own = load_tokenizer(str(tiny_assets["model"]))
    from_file = load_tokenizer(str(tiny_assets["model"]), chat_template=str(tmp_path / "brackets.jinja"))
    assert own.chat_template != BRACKETS and from_file.chat_template == BRACKETS
    assert from_file.apply_chat_template(CONVERSATION["prompt"], tokenize=False, add_generation_prompt=True) == \
        f"[user]<|im_start|>What is 2 + 3?{own.eos_token}[assistant]<|im_start|>"
    folder = _tokenizer_folder(tiny_assets, tmp_path / "other", eos="<|pad|>")
    from_folder = load_tokenizer(str(tiny_assets["model"]), chat_template=str(folder))
    assert (from_folder.chat_template, from_folder.eos_token) == (BRACKETS, "<|pad|>")
    kept = load_tokenizer(str(tiny_assets["model"]), eos_token="<|im_end|>", chat_template=str(folder))
    assert kept.eos_token == "<|im_end|>"
    padded = load_tokenizer(str(tiny_assets["model"]), pad_token="<|im_start|>")
    assert (padded.pad_token, padded.pad_token_id) == ("<|im_start|>", own.convert_tokens_to_ids("<|im_start|>"))
    with pytest.raises(CoatiUsageError, match="--pad_token '<none>' is not a token of the tokenizer"):
        load_tokenizer(str(tiny_assets["model"]), pad_token="<none>")


def test_a_folder_whose_tokens_the_tokenizer_lacks_or_with_no_template_is_refused(tiny_assets, tmp_path):
    bigger = _tokenizer_folder(tiny_assets, tmp_path / "bigger", extra_tokens=("<|think|>", "<|/think|>"))
    with pytest.raises(CoatiUsageError, match=r"this tokenizer lacks 2 of its tokens \(<\|think\|>, <\|/think\|>\); "
                                              "taking them would resize the model's embeddings"):
        load_tokenizer(str(tiny_assets["model"]), chat_template=str(bigger))
    plain = AutoTokenizer.from_pretrained(tiny_assets["model"])
    plain.chat_template = None
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(CoatiUsageError, match="its tokenizer has no chat template"):
        load_tokenizer(str(tiny_assets["model"]), chat_template=str(tmp_path / "plain"))


def test_trls_sft_config_with_chat_template_path_trains_on_that_template_and_saves_it(tiny_assets, tmp_path,
                                                                                       world_of_one):
    """SFT from a TRL config with `chat_template_path`: the raw rows are prepared in that template (its own cache
    entry, beside the tokenizer's own), only the completion is labelled, and the saved tokenizer carries it."""
    (tmp_path / "brackets.jinja").write_text(BRACKETS)
    (tmp_path / "train.jsonl").write_text(json.dumps(CONVERSATION) + "\n")
    cache = tmp_path / "cache"
    config = {"model_name_or_path": str(tiny_assets["model"]), "dataset_name": str(tmp_path / "train.jsonl"),
              "chat_template_path": str(tmp_path / "brackets.jinja"), "output_dir": str(tmp_path / "out"),
              "max_steps": 1, "per_device_train_batch_size": 1, "plugin": "ddp", "prepared_cache_dir": str(cache)}
    (tmp_path / "sft.yaml").write_text(json.dumps(config))
    result = run_main(commands.sft, ["--config", str(tmp_path / "sft.yaml")])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    entries = [p for p in cache.iterdir() if p.is_dir()]
    row = load_from_disk(str(entries[0]))[0]
    assert tokenizer.decode(row["input_ids"]) == f"[user]<|im_start|>What is 2 + 3?{tokenizer.eos_token}[assistant]" \
                                                f"<|im_start|>#### 5{tokenizer.eos_token}"
    labelled = tokenizer.decode([t for t, label in zip(row["input_ids"], row["labels"]) if label != IGNORE_INDEX])
    assert labelled == f"#### 5{tokenizer.eos_token}"
    assert AutoTokenizer.from_pretrained(tmp_path / "out" / "model").chat_template == BRACKETS
    own = {**{k: v for k, v in config.items() if k != "chat_template_path"}, "output_dir": str(tmp_path / "out2")}
    (tmp_path / "own.yaml").write_text(json.dumps(own))
    again = run_main(commands.sft, ["--config", str(tmp_path / "own.yaml")])
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2   # the tokenizer's own template: another entry


def test_a_grpo_run_config_saved_with_the_template_under_multi_turn_still_reads(monkeypatch, tmp_path):
    """GRPO's --chat_template was a multi-turn setting before it was the model's: a run_config.yaml saved then, with
    it under `multi_turn:`, reads as it did."""
    (tmp_path / "t.jinja").write_text(BRACKETS)
    (tmp_path / "old.yaml").write_text(json.dumps({"model": {"pretrain": "m"}, "data": {"dataset": ["d"]},
                                                   "multi_turn": {"chat_template": str(tmp_path / "t.jinja")}}))
    args = parsed_args("grpo", ["--config", str(tmp_path / "old.yaml"), "--reward_fn", "math_answer"], monkeypatch)
    assert args.chat_template == str(tmp_path / "t.jinja")
