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
    assert info["sources"]["pretrain"] == "file (model_name_or_path)" and \
        info["sources"]["batch_size"] == "file (per_device_train_batch_size)"
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


VERL_REWARD = """import json, os


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(f"seen-{os.environ['RANK']}.jsonl", "a") as seen:
        seen.write(json.dumps([data_source, ground_truth, extra_info["index"]]) + "\\n")
    return {"score": float(ground_truth in solution_str), "length": len(solution_str)}
"""


@pytest.mark.slow
def test_verls_grpo_command_with_its_parquet_rows_and_reward_function_runs_and_resumes(tiny_assets, tmp_path):
    """verl's GRPO quickstart as a verl user writes it (Hydra overrides, parquet rows with `reward_model` and
    `extra_info`, `compute_score` in a file of the working directory): `trainer.n_gpus_per_node=2` launches 2
    processes, 16 prompts a step over 2 ranks = 4 steps for 64 prompts; the reward function sees each row's ground
    truth, and its other numbers are logged, as is the dual clip's share (`clip_ratio_c`); checkpoints go to verl's
    checkpoints/PROJECT/EXPERIMENT, and the same command again finds the run finished there."""
    from datasets import Dataset

    rows = [{"data_source": "openai/gsm8k", "ability": "math", "extra_info": {"split": "train", "index": i},
             "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}} for i in range(64)]
    Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "my_reward.py").write_text(VERL_REWARD)
    command = ["grpo", "algorithm.adv_estimator=grpo", "data.train_files=train.parquet", "data.train_batch_size=16",
               "data.max_prompt_length=32", "data.max_response_length=8",
               f"actor_rollout_ref.model.path={tiny_assets['model']}",
               "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=True",
               "actor_rollout_ref.actor.clip_ratio_c=3.0", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2",
               "trainer.project_name=p", "trainer.experiment_name=e", "trainer.save_freq=2", "trainer.total_epochs=1",
               "custom_reward_function.path=my_reward.py", "--output_dir", "out"]
    first = _run_coati(*command, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert re.search(r"step 4/4 \| epoch 1 \|", first.stdout), first.stdout[-2000:]
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "p" / "e").iterdir()) == ["epoch-0_step-2",
                                                                                       "epoch-0_step-4"]
    seen = [json.loads(line) for rank in (0, 1) for line in (tmp_path / f"seen-{rank}.jsonl").read_text().splitlines()]
    assert len(seen) == 4 * 16 * 2 and all(truth == str(2 * index) for _, truth, index in seen)
    assert {source for source, _, _ in seen} == {"openai/gsm8k"} and len({index for *_, index in seen}) == 64
    records = train_records(tmp_path / "out" / "logs")
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all("train/rewards/compute_score/length/mean" in r and
                                                                "train/clip_ratio/dual_mean" in r for r in records)
    again = _run_coati(*command, cwd=tmp_path)
    assert again.returncode == 0 and "the run is finished" in again.stdout + again.stderr
