"""A run the `coati` command launches on 2 processes from a TRL recipe saves its resolved config, from which it reruns
with the same metrics."""
import json
import re

import pytest
import yaml

from conftest import train_records
from support import run_coati as _run_coati


@pytest.mark.slow
def test_grpo_from_a_trl_recipe_saves_its_config_and_reruns_from_it_with_the_same_metrics(tiny_assets, tmp_path):
    """`coati grpo --config recipe.yaml` launches 2 processes, saves the resolved config and where each value came
    from; `coati grpo --config OUT/run_config.yaml --output_dir NEW` reruns it from scratch (the saved
    `--checkpoint_path latest` is left out) on as many processes and logs the same metrics. Its length is open-r1's
    way, TRL's `num_train_epochs` with `max_steps: -1`: an eighth of the 96 prompts' 24 batches a rank = 3 episodes,
    counted again by the rerun (the saved config leaves `num_episodes` out)."""
    recipe = {"model_name_or_path": str(tiny_assets["model"]), "dataset_name": str(tiny_assets["prompt_train"]),
              "output_dir": str(tmp_path / "first"), "save_dir": str(tmp_path / "first" / "ckpt"),
              "resume_from_checkpoint": True, "learning_rate": 1e-3, "num_generations": 3,
              "per_device_train_batch_size": 6, "max_steps": -1, "num_train_epochs": 0.125, "max_completion_length": 8, "logging_steps": 1,
              "loss_type": "dr_grpo", "reward_funcs": ["math_answer"], "num_processes": 2, "seed": 3}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    first = _run_coati("grpo", "--config", str(tmp_path / "recipe.yaml"))
    assert first.returncode == 0, first.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / "first" / "run_config.yaml").read_text())
    assert (saved["model"]["pretrain"], saved["optim"]["batch_size"], saved["algorithm"]["train_batch_size"],
            saved["episodes"]["num_epochs"]) == (str(tiny_assets["model"]), 2, 6, 0.125)
    assert "num_episodes" not in saved["episodes"]
    assert saved["logging"]["log_dir"] == "{output_dir}/logs" and saved["checkpoint"]["save_dir"] == "{output_dir}/ckpt"
    assert "checkpoint_path" not in saved["checkpoint"] and saved["nproc_per_node"] == 2
    assert all("config" not in section for section in saved.values() if isinstance(section, dict))
    checkpoints = sorted((tmp_path / "first" / "ckpt").glob("epoch-*"))
    assert checkpoints and all((c / "modeling" / "tokenizer.json").is_file() for c in checkpoints)   # loads alone
    info = json.loads((tmp_path / "first" / "run_info.json").read_text())
    assert info["sources"]["pretrain"] == "file" and info["sources"]["batch_size"] == "file (per_device_train_batch_size)"
    assert info["sources"]["plugin"] == "default" and info["versions"]["torch"]
    assert info["command"][1:] == ["--config", str(tmp_path / "recipe.yaml")]

    again = _run_coati("grpo", "--config", str(tmp_path / "first" / "run_config.yaml"), "--output_dir",
                       str(tmp_path / "second"))   # on as many processes as the first run, from its config
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" not in again.stdout + again.stderr
    assert (tmp_path / "second" / "ckpt").is_dir() and (tmp_path / "second" / "model" / "config.json").is_file()
    first_metrics, second_metrics = train_records(tmp_path / "first" / "logs"), train_records(tmp_path / "second" / "logs")
    assert [r["step"] for r in first_metrics] == [1, 2, 3] and first_metrics == second_metrics
    assert re.search(r"step 3/3 \| epoch \S+ \| loss \S+ \| reward \S+ ± \S+ \| lr \S+ \| \S+ s/step", first.stdout)


@pytest.mark.slow
def test_a_reward_column_missing_from_the_data_ends_a_launched_run_with_its_one_line_before_any_model_loads(
        tiny_assets, tmp_path):
    """`coati grpo --nproc_per_node 2` with a reward function of yours that takes a column the prompts lack: the run
    ends as a one-process run does, the line naming the function, the column and the data's columns last, status 2,
    and no torchrun report or traceback."""
    (tmp_path / "my_rewards.py").write_text("def accuracy(completions, solution, **kwargs):\n"
                                             "    return [1.0 for _ in completions]\n")
    result = _run_coati("grpo", "--pretrain", str(tiny_assets["model"]), "--dataset_name", str(tiny_assets["prompt_train"]),
                        "--reward_funcs", "my_rewards.accuracy", "--nproc_per_node", "2", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: reward function my_rewards.accuracy takes 'solution', which the data of --prompt_dataset has no column "
        "for (its columns: gt_answer, prompt); add the column, or give the parameter a default")
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr
