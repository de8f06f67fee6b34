"""Vision-language models trained from TRL-style image rows by two torchrun processes: SFT (Qwen2.5-VL), DPO (LLaVA,
LoRA on the language model, the vision tower frozen), reward models and GRPO (Qwen2.5-VL, image prompts on the hf
engine, with and without tools, synchronously and asynchronously, distilled from a vision-language teacher) and PPO
(scored by that reward model, its critic started from it) train, checkpoint, resume exactly and export a folder with
its processor; what cannot work is refused in one line before anything loads."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForImageTextToText, AutoProcessor

from coati.cli.main import main
from coati.models.reward_model import load_reward_model

from conftest import SCRIPTS, assert_same_records, checkpoint_names, torchrun, train_records
from support import run_coati


def _train(script: str, model: Path, data: Path, out: Path, *extra: str):
    args = ["--pretrain", str(model), "--dataset", str(data), "--plugin", "ddp", "--batch_size", "4", "--max_steps", "4",
            "--lr", "1e-3", "--log_interval", "1", "--save_interval", "2", "--save_dir", str(out / "ckpt"),
            "--log_dir", str(out / "logs"), "--output_dir", str(out / "final"), "--prepared_cache_dir",
            str(out.parent / "cache"), *extra]
    result = torchrun(SCRIPTS / script, 2, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _resumes_exactly(script: str, model: Path, data: Path, tmp_path: Path, *extra: str) -> Path:
    full = tmp_path / "full"
    _train(script, model, data, full, *extra)
    assert checkpoint_names(full / "ckpt") == ["epoch-0_step-2", "epoch-1_step-4"]   # 32 rows: 4 micro-batches a rank
    resumed = tmp_path / "resumed"
    result = _train(script, model, data, resumed, "--checkpoint_path", str(full / "ckpt" / "epoch-0_step-2"), *extra)
    assert "resumed from" in result.stdout
    assert_same_records(train_records(resumed / "logs"), train_records(full / "logs")[2:], rel=1e-6)
    return full


@pytest.mark.slow
def test_vision_sft_trains_resumes_exactly_and_exports_with_its_processor(vision_assets, tmp_path):
    full = _resumes_exactly("train_sft.py", vision_assets["qwen2_5_vl"], vision_assets["sft"], tmp_path,
                            "--max_pixels", "4704")
    exported = full / "final" / "model"
    processor = AutoProcessor.from_pretrained(exported)
    assert processor.image_processor.max_pixels == 4704   # the limit the image tokens were counted with travels
    assert (full / "ckpt" / "epoch-0_step-2" / "modeling" / "preprocessor_config.json").is_file()
    model = AutoModelForImageTextToText.from_pretrained(exported)
    trained = [r["train/loss"] for r in train_records(full / "logs")]
    assert trained[-1] < trained[0]
    start = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"])
    assert not torch.equal(model.visual.patch_embed.proj.weight, start.visual.patch_embed.proj.weight)   # the tower trained


@pytest.mark.slow
def test_vision_dpo_with_lora_on_the_language_model_resumes_exactly(vision_assets, tmp_path):
    full = _resumes_exactly("train_dpo.py", vision_assets["llava"], vision_assets["preference"], tmp_path,
                            "--lora_rank", "4", "--freeze_vision_tower")
    adapter = json.loads((full / "final" / "adapter" / "adapter_config.json").read_text())
    assert "vision_tower" in adapter["target_modules"] and adapter["target_modules"].startswith("^(?!")
    records = train_records(full / "logs")
    assert {"train/rewards/margins", "train/logps/chosen"} <= set(records[0])
    merged = AutoModelForImageTextToText.from_pretrained(full / "final" / "model")
    start = AutoModelForImageTextToText.from_pretrained(vision_assets["llava"])
    assert torch.equal(merged.vision_tower.vision_model.embeddings.patch_embedding.weight,
                       start.vision_tower.vision_model.embeddings.patch_embedding.weight)
    assert not torch.equal(merged.language_model.model.layers[0].self_attn.q_proj.weight,
                           start.language_model.model.layers[0].self_attn.q_proj.weight)


def _on_policy_resumes_exactly(script: str, vision_assets, tmp_path: Path, *extra: str) -> list:
    """Four episodes of `script` on the image prompts, then the run resumed from its step-2 checkpoint logging the
    same records; the export carries the processor. The full run's records."""
    def run(out: Path, *more: str):
        args = ["--pretrain", str(vision_assets["qwen2_5_vl"]), "--prompt_dataset", str(vision_assets["prompt"]),
                "--reward_fn", "math_answer", "answer_format", "--num_episodes", "4", "--batch_size", "2",
                "--max_new_tokens", "6", "--save_interval", "2", "--save_dir", str(out / "ckpt"), "--log_dir",
                str(out / "logs"), "--output_dir", str(out / "final"), "--prepared_cache_dir", str(tmp_path / "cache"),
                *extra, *more]
        result = torchrun(SCRIPTS / script, 2, *args)
        assert result.returncode == 0, result.stderr[-4000:]
        return result

    run(tmp_path / "full")
    records = train_records(tmp_path / "full" / "logs")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    result = run(tmp_path / "resumed", "--checkpoint_path", str(tmp_path / "full" / "ckpt" / "epoch-0_step-2"))
    assert "resumed from" in result.stdout
    assert_same_records(train_records(tmp_path / "resumed" / "logs"), records[2:], rel=1e-5)
    assert AutoProcessor.from_pretrained(tmp_path / "full" / "final" / "model").image_processor is not None
    return records


@pytest.mark.slow
def test_vision_grpo_trains_on_image_prompts_and_resumes_exactly(vision_assets, tmp_path):
    records = _on_policy_resumes_exactly("train_grpo.py", vision_assets, tmp_path, "--num_generations", "4",
                                         "--kl_coef", "0.05")
    assert records[0]["train/kl"] == 0   # policy and reference read the same pixels: the same log-probs before any update


@pytest.mark.slow
@pytest.mark.extended
def test_vision_reward_model_resumes_exactly_then_scores_ppos_rollouts_and_starts_its_critic(vision_assets, tmp_path):
    """A reward model of the vision-language model trains (LoRA, its value head trained and saved beside the adapters)
    on image preference pairs and resumes exactly; PPO on image prompts then scores its rollouts with it (reading
    their pixels) and starts its critic from it, as ColossalChat's recipe does; the critic reads the same pixels as
    the policy and trains beside it."""
    rm = _resumes_exactly("train_rm.py", vision_assets["qwen2_5_vl"], vision_assets["preference"], tmp_path / "rm",
                          "--lora_rank", "4")
    assert {"train/accuracy", "train/margin"} <= set(train_records(rm / "logs")[0])
    exported = rm / "final" / "model"
    assert AutoProcessor.from_pretrained(exported).image_processor is not None
    # the value head trains and is saved beside the adapters: the base with them is the merged export
    model = load_reward_model(str(exported), 0).eval()
    rebuilt = PeftModel.from_pretrained(load_reward_model(str(vision_assets["qwen2_5_vl"]), 0),
                                        rm / "final" / "adapter").merge_and_unload().eval()
    for name, tensor in model.state_dict().items():
        assert torch.allclose(tensor, rebuilt.state_dict()[name], atol=1e-6), name
    records = _on_policy_resumes_exactly("train_ppo.py", vision_assets, tmp_path / "ppo", "--rm_pretrain",
                                         str(exported), "--critic_pretrain", str(exported))
    assert all(r["train/loss/value"] > 0 for r in records) and records[0]["train/kl"] == 0
    assert all("train/rewards/reward_model/mean" in r for r in records)


ASYNC = ("--async_rollout", "--max_staleness", "1", "--partial_rollout_tokens", "3")


def _vision_teacher(vision_assets, folder: Path) -> Path:
    """The tiny Qwen2.5-VL with its weights moved by seeded noise, saved with its processor: a teacher to distil from."""
    model = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    model.save_pretrained(folder)
    AutoProcessor.from_pretrained(vision_assets["qwen2_5_vl"]).save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("mode", [(), pytest.param(ASYNC, marks=pytest.mark.extended)], ids=["synchronous", "asynchronous"])
def test_vision_grpo_with_tools_runs_tool_episodes_on_image_prompts(vision_assets, tmp_path, mode):
    """`--tools` on a vision-language model: the prompts rendered with the tools and their images train under
    torchrun, the episodes logged as multi-turn ones, distilled from a vision-language teacher; asynchronously, Ray
    generators make them in partial chunks, within the staleness bound."""
    teacher = _vision_teacher(vision_assets, tmp_path / "teacher")
    args = ["--pretrain", str(vision_assets["qwen2_5_vl"]), "--prompt_dataset", str(vision_assets["prompt"]),
            "--reward_fn", "math_answer", "--tools", "calculator", "--max_turns", "3", "--num_episodes", "3",
            "--batch_size", "2", "--num_generations", "4", "--max_new_tokens", "6", "--log_dir", str(tmp_path / "logs"),
            "--prepared_cache_dir", str(tmp_path / "cache"), "--teacher_model", str(teacher), *mode]
    result = torchrun(SCRIPTS / "train_grpo.py", 2, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    records = train_records(tmp_path / "logs")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert 1 <= record["train/rollout/turns"] <= 3 and record["train/rollout/sampled_tokens"] > 0
        assert record["train/rollout/distill_reverse_kl"] != 0
    if mode:
        assert all(r["train/rollout/staleness@token/max"] <= 1 for r in records)
        assert records[0]["train/rollout/staleness@token/max"] == 0
        # the generators' log-probs are those of the distribution they sample, without the image tokens and markers:
        # the tiny random model puts about 1 % of its mass there
        assert 0.95 < records[0]["train/behaviour_ratio/min"] <= records[0]["train/behaviour_ratio/max"] <= 1.0 + 1e-5


def test_what_cannot_work_with_images_is_refused_in_one_line(vision_assets, tiny_assets, tmp_path, capsys):
    qwen, sft = str(vision_assets["qwen2_5_vl"]), str(vision_assets["sft"])
    cache = ["--prepared_cache_dir", str(tmp_path / "cache")]
    cases = [
        (["sft", "--pretrain", qwen, "--dataset", sft, "--packing", *cache],
         "error: --packing: rows with images are padded, not packed"),
        (["ppo", "--pretrain", qwen, "--prompt_dataset", str(vision_assets["prompt"]), "--reward_fn", "math_answer",
          "--critic_pretrain", str(tiny_assets["model"]), *cache],
         f"error: --critic_pretrain {tiny_assets['model']}: the critic of a vision-language policy must read its images"),
        (["grpo", "--pretrain", qwen, "--prompt_dataset", str(vision_assets["prompt"]), "--reward_fn", "math_answer",
          "--rollout_backend", "vllm", *cache], "error: --rollout_backend: GRPO on a vision-language model generates "
         "on the hf engine"),
        (["kto", "--pretrain", qwen, "--dataset", str(vision_assets["preference"]), *cache],
         f"error: --pretrain {qwen} is a vision-language model: coati kto does not train one yet"),
        (["grpo", "--pretrain", qwen, "--prompt_dataset", str(vision_assets["prompt"]), "--rm_pretrain",
          str(tiny_assets["model"]), *cache], f"error: --rm_pretrain {tiny_assets['model']}: the reward model of a "
         "vision-language policy must read its images"),
        (["grpo", "--pretrain", qwen, "--prompt_dataset", str(vision_assets["prompt"]), "--teacher_url",
          "http://127.0.0.1:9/v1", *cache], "error: --teacher_url: GRPO on a vision-language model cannot send a served "
         "teacher the images"),
        (["sft", "--pretrain", str(tiny_assets["model"]), "--dataset", str(tiny_assets["sft_train"]),
          "--freeze_vision_tower"], "error: --freeze_vision_tower: " + str(tiny_assets["model"]) +
         " is not a vision-language model (its config has no vision_config)"),
        (["sft", "--pretrain", str(tiny_assets["model"]), "--dataset", str(tiny_assets["sft_train"]),
          "--max_pixels", "1000"], "error: --max_pixels: " + str(tiny_assets["model"]) + " is not a vision-language model"),
        (["sft", "--pretrain", str(tiny_assets["model"]), "--dataset", sft, *cache],
         "the data has images, and the tokenizer's folder has no image processor"),
    ]
    for argv, message in cases:   # in this process, through the `coati` command's own entry point
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2, (argv, err[-2000:])
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and message in lines[0], err[-2000:]

    prepared = tmp_path / "prepared"
    assert run_coati("prepare", "--type", "sft", "--data_input_dirs", sft, "--tokenizer_dir", qwen,
                     "--data_output_dirs", str(prepared), "--min_pixels", "9408").returncode == 0
    result = run_coati("sft", "--pretrain", qwen, "--dataset", str(prepared), "--min_pixels", "784")
    assert result.returncode == 2
    assert "error: --min_pixels 784: the data was prepared with min_pixels 9408" in result.stderr
    shutil.rmtree(prepared)
