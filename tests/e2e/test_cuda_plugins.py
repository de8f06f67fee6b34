"""Every trainer, on every CUDA plugin, trains, checkpoints, exports and resumes through its real script
(needs a GPU).

Run on a GPU machine with `python -m pytest tests/e2e/test_cuda_plugins.py` (or `tests/gpu/check.sh` where that machine has
its own torch); on a machine without CUDA these
tests are skipped and `test_plugins.py` checks the refusal instead.
"""
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from conftest import SCRIPTS, torchrun

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA plugins need a GPU")]

PLUGIN_FLAGS = {
    "ddp": ["--plugin", "ddp", "--mixed_precision", "bf16"],
    "zero2": ["--plugin", "zero2", "--mixed_precision", "bf16"],
    "zero2_cpu": ["--plugin", "zero2_cpu", "--mixed_precision", "bf16"],
    "gemini": ["--plugin", "gemini", "--mixed_precision", "bf16"],
    "gemini_auto": ["--plugin", "gemini_auto", "--mixed_precision", "bf16"],
    "3d": ["--plugin", "3d", "--mixed_precision", "bf16", "--zero_stage", "1"],
}

SUPERVISED = {"sft": ("train_sft.py", "sft"), "rm": ("train_rm.py", "pref"), "dpo": ("train_dpo.py", "pref"),
              "orpo": ("train_orpo.py", "pref"), "kto": ("train_kto.py", "kto")}
"""Supervised trainer -> (script, data): 96 rows, batch 8, accumulation 2: six optimizer steps."""
SUPERVISED_STEPS, SUPERVISED_SAVE = 6, 2
RL_EPISODES, RL_SAVE = 4, 2


@pytest.fixture(scope="module")
def assets(tiny_assets, tmp_path_factory):
    """The tiny assets plus a prepared KTO train/eval set."""
    from coati.dataset.demo_data import generate_problems, kto_records, write_jsonl
    from coati.dataset.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("kto")
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    paths = dict(tiny_assets)
    for split, n in (("train", 96), ("eval", 32)):
        raw = write_jsonl(kto_records(generate_problems(n, split)), root / f"kto_{split}.jsonl")
        prepare_dataset([raw], "kto", tokenizer, 128, root / f"kto_{split}")
        paths[f"kto_{split}"] = root / f"kto_{split}"
    return paths


def _trainer_args(trainer: str, assets) -> list:
    if trainer in SUPERVISED:
        data = SUPERVISED[trainer][1]
        return ["--dataset", str(assets[f"{data}_train"]), "--eval_dataset", str(assets[f"{data}_eval"]),
                "--batch_size", "8", "--accumulation_steps", "2", "--max_epochs", "1", "--lr", "1e-3",
                "--log_interval", "1", "--save_interval", str(SUPERVISED_SAVE)]
    common = ["--prompt_dataset", str(assets["prompt_train"]), "--batch_size", "2", "--max_new_tokens", "8",
              "--num_episodes", str(RL_EPISODES), "--lr", "1e-3", "--save_interval", str(RL_SAVE)]
    if trainer == "grpo":
        return common + ["--num_generations", "4", "--kl_coef", "0.05", "--reward_fn", "math_answer", "answer_format"]
    return common + ["--rm_pretrain", str(assets["model"]), "--reward_fn", "answer_format", "--num_update_steps", "2"]


FORWARD_WITHOUT_GRADIENTS_FIRST = {"kto", "grpo", "ppo"}
"""Trainers whose first forward has no gradients (KTO's KL estimate, rollout generation): gemini_auto refuses them."""


def _launch(trainer: str, assets, out: Path, plugin: str, *extra: str):
    script = SUPERVISED[trainer][0] if trainer in SUPERVISED else f"train_{trainer}.py"
    args = ["--pretrain", str(assets["model"]), *_trainer_args(trainer, assets), "--save_dir", str(out / "ckpt"),
            "--log_dir", str(out / "logs"), "--output_dir", str(out / "final"), *PLUGIN_FLAGS[plugin], *extra]
    return torchrun(SCRIPTS / script, 1, *args)


def _run(trainer: str, assets, out: Path, plugin: str, *extra: str) -> list:
    result = _launch(trainer, assets, out, plugin, *extra)
    assert result.returncode == 0, result.stderr[-6000:]
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "train/loss" in r]


def _weights(trainer: str, model_dir: Path) -> dict:
    """The exported model's weights, loaded with the class its trainer exports."""
    model_class = AutoModelForSequenceClassification if trainer == "rm" else AutoModelForCausalLM
    return model_class.from_pretrained(model_dir).state_dict()


@pytest.mark.parametrize("plugin", sorted(PLUGIN_FLAGS))
@pytest.mark.parametrize("trainer", [*SUPERVISED, "grpo", "ppo"])
def test_trainer_on_plugin_trains_checkpoints_exports_and_resumes(trainer, plugin, assets, tmp_path):
    if plugin == "gemini_auto" and trainer in FORWARD_WITHOUT_GRADIENTS_FIRST:
        result = _launch(trainer, assets, tmp_path, plugin)
        assert "exitcode  : 2" in result.stderr and "use --plugin gemini (static placement)" in result.stderr
        assert not (tmp_path / "logs" / "metrics.jsonl").exists()
        return
    supervised = trainer in SUPERVISED
    steps, every = (SUPERVISED_STEPS, SUPERVISED_SAVE) if supervised else (RL_EPISODES, RL_SAVE)
    records = _run(trainer, assets, tmp_path / "full", plugin)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in records)
    if supervised:
        assert records[-1]["train/loss"] < records[0]["train/loss"]
    mid = tmp_path / "full" / "ckpt" / f"epoch-0_step-{every}"
    assert (mid / "COMPLETE").is_file()
    exported = _weights(trainer, tmp_path / "full" / "final" / "model")

    resumed = _run(trainer, assets, tmp_path / "resumed", plugin, "--checkpoint_path", str(mid))
    assert [r["step"] for r in resumed] == list(range(every + 1, steps + 1))
    if supervised:
        assert resumed[0]["train/loss"] == pytest.approx(records[every]["train/loss"], rel=2e-2)
    if supervised:
        again = _weights(trainer, tmp_path / "resumed" / "final" / "model")
        for (name, a), b in zip(exported.items(), again.values()):
            assert torch.allclose(a, b, atol=2e-2, rtol=0), name


@pytest.mark.parametrize("plugin", sorted(set(PLUGIN_FLAGS) - {"gemini_auto"}))
def test_packed_grpo_on_plugin_trains(plugin, assets, tmp_path):
    """GRPO's packed update (a group's prompt computed once) on each CUDA plugin that takes --packing; 3d refuses it."""
    if plugin == "3d":
        result = _launch("grpo", assets, tmp_path, plugin, "--packing")
        assert "--packing is not supported with --plugin 3d" in result.stderr
        return
    records = _run("grpo", assets, tmp_path, plugin, "--packing")
    assert [r["step"] for r in records] == list(range(1, RL_EPISODES + 1))
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in records)


LORA = ["--lora_rank", "4", "--lora_alpha", "8"]


@pytest.mark.parametrize("plugin", sorted(set(PLUGIN_FLAGS) - {"gemini_auto"}))
@pytest.mark.parametrize("trainer", ["sft", "grpo"])
def test_lora_on_plugin_trains_and_exports_the_adapter(trainer, plugin, assets, tmp_path):
    """LoRA adapters on each CUDA plugin that colossalai gives LoRA (ddp, zero2, zero2_cpu, 3d): the run trains and
    exports the adapters alone and the merged model; Gemini refuses it in one line."""
    if plugin == "gemini":
        result = _launch(trainer, assets, tmp_path, plugin, *LORA)
        assert "exitcode  : 2" in result.stderr and f"--plugin {plugin} does not support LoRA" in result.stderr
        return
    steps = SUPERVISED_STEPS if trainer in SUPERVISED else RL_EPISODES
    records = _run(trainer, assets, tmp_path, plugin, *LORA)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in records)
    assert (tmp_path / "final" / "adapter" / "adapter_config.json").is_file()
    assert _weights(trainer, tmp_path / "final" / "model").keys() == _weights(trainer, assets["model"]).keys()


VISION = {"sft": ("train_sft.py", "qwen2_5_vl", "sft"), "dpo": ("train_dpo.py", "llava", "preference"),
          "rm": ("train_rm.py", "qwen2_5_vl", "preference")}
"""Vision-language trainer -> (script, tiny model, image rows): 32 rows, batch 4: eight optimizer steps."""


@pytest.mark.parametrize("plugin", ["ddp", "zero2", "gemini"])
@pytest.mark.parametrize("trainer", sorted(VISION))
def test_vision_trainer_on_plugin_trains_and_resumes(trainer, plugin, vision_assets, tmp_path):
    """Image rows on the plugins that hold a whole model on one GPU, in bf16: SFT (Qwen2.5-VL), DPO (LLaVA) and the
    reward model (Qwen2.5-VL with a value head) train, export with the processor and resume from a mid-run
    checkpoint."""
    script, model, data = VISION[trainer]

    def run(out: Path, *extra: str) -> list:
        args = ["--pretrain", str(vision_assets[model]), "--dataset", str(vision_assets[data]), "--batch_size", "4",
                "--lr", "1e-3", "--log_interval", "1", "--save_interval", "4", "--save_dir", str(out / "ckpt"),
                "--log_dir", str(out / "logs"), "--output_dir", str(out / "final"), "--prepared_cache_dir",
                str(tmp_path / "cache"), *PLUGIN_FLAGS[plugin], *extra]
        result = torchrun(SCRIPTS / script, 1, *args)
        assert result.returncode == 0, result.stderr[-6000:]
        records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
        return [r for r in records if "train/loss" in r]

    records = run(tmp_path / "full")
    assert [r["step"] for r in records] == list(range(1, 9))
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in records)
    assert (tmp_path / "full" / "final" / "model" / "preprocessor_config.json").is_file()
    resumed = run(tmp_path / "resumed", "--checkpoint_path", str(tmp_path / "full" / "ckpt" / "epoch-0_step-4"))
    assert [r["step"] for r in resumed] == list(range(5, 9))
    assert resumed[0]["train/loss"] == pytest.approx(records[4]["train/loss"], rel=2e-2)


VISION_GRPO = {"single_turn": (), "tools": ("--tools", "calculator", "--max_turns", "2"),
               "async": ("--async_rollout", "--max_staleness", "1", "--partial_rollout_tokens", "3")}
"""GRPO on image prompts, by how its rollouts run -> its flags."""


@pytest.mark.parametrize("plugin", ["ddp", "zero2"])
@pytest.mark.parametrize("mode", sorted(VISION_GRPO))
def test_vision_grpo_on_plugin_trains(mode, plugin, vision_assets, tmp_path):
    """GRPO on image prompts (Qwen2.5-VL, bf16) on one GPU, single-turn, with tools and asynchronously (Ray
    generators, partial rollouts, where the machine has Ray): four episodes train and export the model with its
    processor."""
    if mode == "async":
        pytest.importorskip("ray")
    args = ["--pretrain", str(vision_assets["qwen2_5_vl"]), "--prompt_dataset", str(vision_assets["prompt"]),
            "--reward_fn", "math_answer", "--batch_size", "2", "--num_generations", "4", "--max_new_tokens", "6",
            "--num_episodes", str(RL_EPISODES), "--lr", "1e-3", "--log_dir", str(tmp_path / "logs"), "--output_dir",
            str(tmp_path / "final"), "--prepared_cache_dir", str(tmp_path / "cache"), *PLUGIN_FLAGS[plugin],
            *VISION_GRPO[mode]]
    result = torchrun(SCRIPTS / "train_grpo.py", 1, *args)
    assert result.returncode == 0, result.stderr[-6000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in records] == list(range(1, RL_EPISODES + 1))
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in records)
    assert (tmp_path / "final" / "model" / "preprocessor_config.json").is_file()
