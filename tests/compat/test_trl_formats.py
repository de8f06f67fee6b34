"""TRL's dataset formats (docs/source/dataset_formats.md) prepare with TRL's meaning and train on every trainer they
apply to; the reward functions of TRL's GRPO documentation (tests/trl_reward_examples.py) run unchanged."""
import json
import math

import pytest
from datasets import load_from_disk

from coati.dataset.prepare import PROMPT_COLUMN, prepare_dataset
from coati.dataset.tokenization import IGNORE_INDEX, load_tokenizer
from coati.cli import commands
from support import run_main

SKY = [{"role": "user", "content": "What color is the sky?"}]
BLUE = [{"role": "assistant", "content": "It is blue."}]
GREEN = [{"role": "assistant", "content": "It is green."}]
FORMATS = {
    "sft": {"text": [{"text": "The sky is blue."}],
            "messages": [{"messages": SKY + BLUE}],
            "prompt_completion": [{"prompt": "The sky is", "completion": " blue."}],
            "prompt_completion_conv": [{"prompt": SKY, "completion": BLUE}]},
    "preference": {"explicit": [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}],
                   "implicit": [{"chosen": "The sky is blue.", "rejected": "The sky is green."}],
                   "explicit_conv": [{"prompt": SKY, "chosen": BLUE, "rejected": GREEN}],
                   "implicit_conv": [{"chosen": SKY + BLUE, "rejected": SKY + GREEN}]},
    "kto": {"unpaired": [{"prompt": "The sky is", "completion": " blue.", "label": True}],
            "unpaired_conv": [{"prompt": SKY, "completion": GREEN, "label": False}],
            "preference": [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}]},
    "prompt": {"prompt_only": [{"prompt": "The sky is", "ground_truth": "blue", "task": "math"}],
               "prompt_only_conv": [{"prompt": SKY, "ground_truth": "blue", "task": "coding"}]},
}
"""Each format of TRL's dataset-formats page, as the page writes it, by the kind of data it prepares as."""


@pytest.fixture(scope="module")
def prepared(tiny_assets, tmp_path_factory):
    """Every format prepared (16 copies of its row, so a trainer has batches), by kind and format."""
    tokenizer = load_tokenizer(str(tiny_assets["model"]))
    root = tmp_path_factory.mktemp("trl_formats")
    folders = {}
    for kind, formats in FORMATS.items():
        for name, rows in formats.items():
            raw = root / "raw" / f"{kind}_{name}.jsonl"
            raw.parent.mkdir(parents=True, exist_ok=True)
            raw.write_text("".join(json.dumps(row) + "\n" for row in rows * 16))
            prepare_dataset([raw], kind, tokenizer, 64, root / kind / name)
            folders[kind, name] = root / kind / name
    return tokenizer, folders


def _first(folders, kind, name):
    return load_from_disk(str(folders[kind, name]))[0]


def _labelled(tokenizer, ids, labels):
    return tokenizer.decode([t for t, label in zip(ids, labels) if label != IGNORE_INDEX])


def test_standard_rows_take_no_chat_template_and_train_on_their_completion(prepared):
    tokenizer, folders = prepared
    eos = tokenizer.eos_token
    text = _first(folders, "sft", "text")
    assert tokenizer.decode(text["input_ids"]) == "The sky is blue." + eos == _labelled(tokenizer, text["input_ids"],
                                                                                         text["labels"])
    pair = _first(folders, "sft", "prompt_completion")
    assert tokenizer.decode(pair["input_ids"]) == "The sky is blue." + eos
    assert _labelled(tokenizer, pair["input_ids"], pair["labels"]) == " blue." + eos      # the completion only
    for name in ("explicit", "implicit"):                                                  # implicit: the shared start
        row = _first(folders, "preference", name)
        assert _labelled(tokenizer, row["chosen_input_ids"], row["chosen_labels"]) == " blue." + eos
        assert _labelled(tokenizer, row["rejected_input_ids"], row["rejected_labels"]) == " green." + eos
        assert tokenizer.decode(row["chosen_input_ids"]) == "The sky is blue." + eos
    kto = _first(folders, "kto", "unpaired")
    assert kto["desirable"] and tokenizer.decode(kto["input_ids"][:kto["prompt_length"]]) == "The sky is"
    prompt = _first(folders, "prompt", "prompt_only")
    assert tokenizer.decode(prompt["input_ids"]) == "The sky is" and json.loads(prompt[PROMPT_COLUMN]) == "The sky is"


def test_conversational_rows_take_the_template_and_train_on_the_response(prepared):
    tokenizer, folders = prepared
    templated = tokenizer.apply_chat_template(SKY + BLUE, tokenize=False)
    for name in ("messages", "prompt_completion_conv"):
        row = _first(folders, "sft", name)
        assert templated.startswith(tokenizer.decode(row["input_ids"]))
        assert _labelled(tokenizer, row["input_ids"], row["labels"]) == "It is blue." + tokenizer.eos_token
    explicit, implicit = _first(folders, "preference", "explicit_conv"), _first(folders, "preference", "implicit_conv")
    assert explicit == implicit                                  # the implicit prompt is the shared user turn
    kto = load_from_disk(str(folders["kto", "preference"]))
    assert kto["desirable"][:2] == [True, False] and len(kto) == 32          # a preference row is two KTO rows
    prompt = _first(folders, "prompt", "prompt_only_conv")
    assert tokenizer.decode(prompt["input_ids"]) == tokenizer.apply_chat_template(SKY, tokenize=False,
                                                                                  add_generation_prompt=True)
    assert json.loads(prompt[PROMPT_COLUMN]) == SKY and prompt["ground_truth"] == "blue"


TRAINERS = {"sft": ("sft", ["--batch_size", "8"]), "rm": ("preference", ["--batch_size", "8"]),
            "dpo": ("preference", ["--batch_size", "8"]), "kto": ("kto", ["--batch_size", "8"]),
            "grpo": ("prompt", ["--batch_size", "4", "--num_generations", "2", "--max_new_tokens", "6",
                                "--num_episodes", "2", "--reward_fn", "trl_reward_examples:completion_length_reward",
                                "trl_reward_examples:completion_chars_reward", "trl_reward_examples:math_reward_func",
                                "trl_reward_examples:coding_reward_func", "trl_reward_examples:async_reward_func",
                                "trl_reward_examples:curriculum_reward"])}
"""GRPO's run mixes standard and conversational prompts, so it takes TRL's examples that read either; those
written for one format (2 for conversational, 3 and 6 for standard) are in `test_format_specific_trl_examples`."""


@pytest.mark.parametrize("script", sorted(TRAINERS))
def test_every_format_trains_on_its_trainers(script, prepared, tiny_assets, tmp_path, world_of_one):
    """One run per trainer over every format it takes, each format's folder one of its --dataset folders; GRPO
    scores with TRL's documented reward functions, unchanged. The trainers run in this process, as
    `coati.cli.commands` (what train_<trainer>.py is) on a world of one."""
    _, folders = prepared
    kind, extra = TRAINERS[script]
    data = [str(folder) for (k, _), folder in folders.items() if k == kind]
    flag = "--prompt_dataset" if script == "grpo" else "--dataset"
    argv = ["--pretrain", str(tiny_assets["model"]), flag, *data, "--plugin", "ddp", "--log_dir", str(tmp_path / "logs"),
            *extra]
    if script == "grpo":                               # ptx beside GRPO's loss, as ColossalChat's GRPO takes it
        argv += ["--ptx_dataset", str(folders["sft", "text"]), "--ptx_coef", "0.1"]
    else:
        argv += ["--max_epochs", "1"]
    result = run_main(getattr(commands, script), argv)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert records and all(math.isfinite(r["loss"]) for r in records if "loss" in r)
    if script == "grpo":
        _check_trl_reward_metrics(records)


def _check_trl_reward_metrics(records):
    """TRL's names (`rewards/<function>/mean`, under coati's `train/`); a function's None rows left out of its
    statistics (the math and coding examples each score only their own task's rows, half the prompts); the step
    that `trainer_state` says."""
    first = next((r for r in records if "train/rewards/math_reward_func/mean" in r), None)
    assert first is not None, sorted({k for r in records for k in r})
    for name in ("math_reward_func", "coding_reward_func"):            # +-1 on their rows; no 0 from the others
        assert {first[f"train/rewards/{name}/p00"], first[f"train/rewards/{name}/p100"]} <= {-1.0, 1.0}
    assert first["train/rewards/async_reward_func/mean"] >= 0 and first["train/rewards/completion_length_reward/mean"] > 0
    steps = [r["train/rewards/curriculum_reward/mean"] for r in records if "train/rewards/curriculum_reward/mean" in r]
    assert steps == [0.0, 1.0]
    ptx = [r["train/loss/ptx"] for r in records if "train/loss/ptx" in r]
    assert len(ptx) == 2 and all(value > 0 for value in ptx)          # one a step, from --ptx_dataset


def _scored(prepared, tiny_assets, names, specs, state=None):
    """Greedy completions of prompt rows of the named formats, scored by `specs` through coati's rollout workflow:
    (samples, completions, (total, components))."""
    from transformers import AutoModelForCausalLM

    from coati.dataset.collators import PromptCollator
    from coati.experience.experience import per_name
    from coati.experience.scorer import Scorer
    from coati.models.generation import HFEngine
    from coati.config import SamplingConfig
    from coati.rewards import WeightedReward
    from coati.rollout import LocalPool, RLVRWorkflow
    from coati.dataset.collators import prompt_rows
    from coati.rollout.evaluation import complete

    tokenizer, folders = prepared
    batch = PromptCollator(tokenizer.pad_token_id)([_first(folders, "prompt", name) for name in names])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    greedy = SamplingConfig(max_new_tokens=5, do_sample=False)
    scorer = Scorer(tokenizer, WeightedReward.from_specs(specs))
    scorer.trainer_state = state
    pool = LocalPool(HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
    samples = [s for t in complete(pool, RLVRWorkflow(scorer, greedy, 1), prompt_rows(batch), greedy) for s in t.samples]
    return samples, [s.completion for s in samples], ([s.reward for s in samples],
                                                      per_name(s.reward_components for s in samples))


def test_format_specific_trl_examples(prepared, tiny_assets):
    """Example 2 on conversational prompts; 3 and 6 (its extra columns and metric) on standard ones."""
    _, _, (_, components) = _scored(prepared, tiny_assets, ["prompt_only_conv"],
                                         ["trl_reward_examples:format_reward_func"])
    assert components["format_reward_func"] == [0.0]
    _, _, (_, components) = _scored(prepared, tiny_assets, ["prompt_only"],
                                         ["trl_reward_examples:reward_func",
                                          "trl_reward_examples:logging_reward_func"])
    assert components["reward_func"] == components["logging_reward_func"] == [0.0]       # no \boxed{blue}
    assert components["log_extra/golden_answer"] == ["blue"] and components["log_metric/accuracy"] == [0.0]
    from coati.experience.metrics import component_metrics
    from coati.rewards.registry import table_columns
    assert dict(component_metrics(components))["accuracy"] == [0.0]
    assert table_columns(components, 0)["extracted_answer"] == "[none]"


def test_trl_reward_contract_through_the_scorer(prepared, tiny_assets, monkeypatch):
    """The arguments TRL's contract names, in the data's format, through the real scorer: standard rows get text,
    conversational rows message lists; completion_ids are the generated tokens; None leaves a row out."""
    from transformers import TrainerState

    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, ground_truth, task, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, state=trainer_state, kwargs=kwargs)
        return [None, 2.0]

    import trl_reward_examples
    monkeypatch.setattr(trl_reward_examples, "spy", spy, raising=False)
    samples, completions, (total, components) = _scored(prepared, tiny_assets, ["prompt_only", "prompt_only_conv"],
                                                        ["trl_reward_examples:spy"], TrainerState(global_step=3))
    assert seen["prompts"] == ["The sky is", SKY] and seen["completions"][0] == completions[0]
    assert seen["completions"][1] == [{"role": "assistant", "content": completions[1]}]
    assert seen["ids"] == [s.completion_ids for s in samples] and all(seen["ids"])
    assert seen["state"].global_step == 3 and PROMPT_COLUMN not in seen["kwargs"]
    assert total == [0.0, 2.0] and math.isnan(components["spy"][0])
