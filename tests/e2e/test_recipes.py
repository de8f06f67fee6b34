"""The recipes users start from (examples/recipes/*.yaml): each one's keys and values are taken by its command as
written, and the ones a CPU can run (all but vLLM's and the 2-node one) train two steps on the tiny model with only
the model, data, plugin and lengths overridden, then resume as the recipes page says (and find nothing left)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, child_env, parsed_args, unknown_metrics

RECIPES = REPO / "examples" / "recipes"
GPU_OR_CLUSTER = ("grpo_vllm.yaml", "grpo_2nodes.yaml")


def _command(recipe: Path) -> str:
    return recipe.stem.split("_")[0]


def test_every_recipe_is_taken_as_written(monkeypatch):
    recipes = sorted(RECIPES.glob("*.yaml"))
    assert {r.name for r in recipes} >= {"sft.yaml", "sft_lora.yaml", "rm.yaml", "dpo.yaml", "grpo.yaml", "ppo.yaml",
                                         *GPU_OR_CLUSTER}
    for recipe in recipes:
        args = parsed_args(_command(recipe), ["--config", str(recipe), "--resume_from_checkpoint", "true"], monkeypatch)
        assert args.plugin == "zero2" and yaml.safe_load(recipe.read_text())["num_processes"] == 8, recipe.name
        assert (args.save_dir, args.checkpoint_path) == (f"{args.output_dir}/checkpoints", "latest"), recipe.name


@pytest.mark.slow
@pytest.mark.extended   # every recipe's keys are checked by the test above, config files run in test_quickstart.py
@pytest.mark.parametrize("recipe", [r.name for r in sorted(RECIPES.glob("*.yaml")) if r.name not in GPU_OR_CLUSTER])
def test_a_recipe_trains_on_a_cpu_with_the_model_and_data_overridden(recipe, tiny_assets, tmp_path):
    command = _command(RECIPES / recipe)
    data = {"sft": "sft_train", "rm": "pref_train", "dpo": "pref_train", "grpo": "prompt_train",
            "ppo": "prompt_train"}[command]
    overrides = ["--model_name_or_path", str(tiny_assets["model"]), "--dataset_name", str(tiny_assets[data]),
                 "--output_dir", str(tmp_path / "out"), "--plugin", "ddp", "--bf16", "false", "--nproc_per_node", "1"]
    if command in ("grpo", "ppo"):
        overrides += ["--max_steps", "2", "--max_completion_length", "8", "--max_prompt_length", "64",
                      "--per_device_train_batch_size", "8" if command == "grpo" else "2", "--eval_steps", "1"]
    else:
        overrides += ["--max_steps", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
                      "--max_length", "128"]
    if command == "ppo":
        overrides += ["--rm_pretrain", str(tiny_assets["model"])]
    run = [sys.executable, "-m", "coati.cli.main", command, "--config", str(RECIPES / recipe), *overrides]
    done = subprocess.run(run, capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "out" / "model" / "config.json").is_file()
    assert "step 2/2" in done.stdout
    logged = [json.loads(line) for line in (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert logged and not unknown_metrics(logged)   # every name it logs is in the catalogue (docs/reference/metrics.md)
    again = subprocess.run([*run, "--resume_from_checkpoint", "true"], capture_output=True, text=True,
                           env=child_env(), cwd=tmp_path, timeout=600)   # the recipes' resume: nothing left to do
    assert again.returncode == 0 and "the run is finished: " in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
