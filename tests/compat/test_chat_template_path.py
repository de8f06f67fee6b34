"""TRL's `chat_template_path` (coati's `--chat_template`): a Jinja file's template, or a tokenizer folder's template
and EOS, replaces the tokenizer's in the prepared data and the saved tokenizer; a folder whose tokens the tokenizer
lacks is refused (TRL would resize the model's embeddings)."""
import json
import re

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
    settings = {"model_name_or_path": str(tiny_assets["model"]), "dataset_name": str(tmp_path / "train.jsonl"),
              "chat_template_path": str(tmp_path / "brackets.jinja"), "output_dir": str(tmp_path / "out"),
              "max_steps": 1, "per_device_train_batch_size": 1, "plugin": "ddp", "prepared_cache_dir": str(cache),
              "pad_token": "<|im_start|>"}
    (tmp_path / "sft.yaml").write_text(json.dumps(settings))
    result = run_main(commands.sft, ["--config", str(tmp_path / "sft.yaml")])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    entries = [p for p in cache.iterdir() if p.is_dir()]
    row = load_from_disk(str(entries[0]))[0]
    assert tokenizer.decode(row["input_ids"]) == f"[user]<|im_start|>What is 2 + 3?{tokenizer.eos_token}[assistant]" \
                                                f"<|im_start|>#### 5{tokenizer.eos_token}"
    labelled = tokenizer.decode([t for t, label in zip(row["input_ids"], row["labels"]) if label != IGNORE_INDEX])
    assert labelled == f"#### 5{tokenizer.eos_token}"
    saved = AutoTokenizer.from_pretrained(tmp_path / "out" / "model")
    assert saved.chat_template == BRACKETS and saved.pad_token == "<|im_start|>"
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    generation = json.loads((tmp_path / "out" / "model" / "generation_config.json").read_text())
    assert config["pad_token_id"] == generation["pad_token_id"] == saved.pad_token_id   # the configs say it too
    assert config["eos_token_id"] == saved.eos_token_id
    own = {**{k: v for k, v in settings.items() if k not in ("chat_template_path", "pad_token")},
           "output_dir": str(tmp_path / "out2")}
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


def test_a_template_that_fails_or_drops_the_answer_is_one_line_and_prepared_data_keeps_its_own(tiny_assets, tmp_path,
                                                                                                world_of_one):
    """A syntax error, a template that never writes the assistant's turn, and one whose raise_exception fires on a
    row are each one line; a prepared folder given with --chat_template is trained as it was prepared, said in a
    note; a generation prompt ending in a space the answer's first token joins is warned about."""
    from coati.dataset.prepare import prepare_dataset

    for text, said in (("{{ messages", "its chat template fails on the tokenizer (TemplateSyntaxError"),
                       ("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
                        "its chat template does not write the assistant's turn")):
        (tmp_path / "t.jinja").write_text(text)
        with pytest.raises(CoatiUsageError, match=re.escape(f"--chat_template {tmp_path / 't.jinja'}: {said}")):
            load_tokenizer(str(tiny_assets["model"]), chat_template=str(tmp_path / "t.jinja"))
    (tmp_path / "strict.jinja").write_text("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception("
                                           "'no system turns') }}{% endif %}[{{ m.role }}]<|im_start|>{{ m.content }}"
                                           "{{ eos_token }}{% endfor %}")
    tokenizer = load_tokenizer(str(tiny_assets["model"]), chat_template=str(tmp_path / "strict.jinja"))
    (tmp_path / "sys.jsonl").write_text(json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                                                 *CONVERSATION["prompt"], *CONVERSATION["completion"]]}))
    with pytest.raises(CoatiUsageError, match=r"the chat template fails on a row \(TemplateError: no system turns\)"):
        prepare_dataset([tmp_path / "sys.jsonl"], "sft", tokenizer, 64, tmp_path / "never")
    (tmp_path / "brackets.jinja").write_text(BRACKETS)
    result = run_main(commands.sft, ["--pretrain", str(tiny_assets["model"]), "--dataset", str(tiny_assets["sft_train"]),
                                     "--chat_template", str(tmp_path / "brackets.jinja"), "--max_steps", "1",
                                     "--plugin", "ddp", "--output_dir", str(tmp_path / "out")])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert f"{tiny_assets['sft_train']} is prepared already and keeps the template it was prepared with" in result.stderr

    (tmp_path / "space.jinja").write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}"
                                          "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    (tmp_path / "train.jsonl").write_text(json.dumps(CONVERSATION) + "\n")
    spaced = run_main(commands.sft, ["--pretrain", str(tiny_assets["model"]), "--dataset", str(tmp_path / "train.jsonl"),
                                     "--chat_template", str(tmp_path / "space.jinja"), "--max_steps", "1", "--plugin",
                                     "ddp", "--prepared_cache_dir", str(tmp_path / "cache")])
    assert spaced.returncode == 0 and "its generation prompt ends inside the answer's first token" in spaced.stderr
