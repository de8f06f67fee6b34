"""Runs made before the run-config refactor still work with the code of today (`tests/recorded/before_refactor/`,
written by commit 2f6e49b): their checkpoints resume and train on, and the `run_config.yaml` they saved loads as a
`--config`, with the settings it holds."""
import json
import shutil

import pytest

from conftest import REPO, SCRIPTS, parsed_args, torchrun

BEFORE = REPO / "tests" / "recorded" / "before_refactor"


def _trained_steps(log_dir) -> list:
    return [json.loads(line)["step"] for line in (log_dir / "metrics.jsonl").read_text().splitlines()
            if "train/loss" in json.loads(line)]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["sft", "grpo"])
def test_a_checkpoint_written_before_the_refactor_resumes_and_trains_on(algorithm, tiny_assets, tmp_path):
    checkpoint = tmp_path / "epoch-0_step-2"
    shutil.copytree(BEFORE / algorithm / "epoch-0_step-2", checkpoint)
    common = ["--pretrain", str(tiny_assets["model"]), "--plugin", "ddp", "--seed", "3", "--log_dir", str(tmp_path / "logs"),
              "--save_dir", str(tmp_path / "ckpt"), "--checkpoint_path", str(checkpoint)]
    if algorithm == "sft":
        args = [*common, "--dataset", str(tiny_assets["sft_train"]), "--batch_size", "4", "--max_steps", "3"]
    else:
        args = [*common, "--prompt_dataset", str(tiny_assets["prompt_train"]), "--batch_size", "2", "--num_generations",
                "2", "--max_new_tokens", "8", "--num_episodes", "3", "--reward_fn", "math_answer", "--kl_coef", "0.05"]
    result = torchrun(SCRIPTS / f"train_{algorithm}.py", 2, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"resumed from {checkpoint}" in result.stdout + result.stderr
    assert _trained_steps(tmp_path / "logs") == [3]                          # the one step left, none again
    assert (tmp_path / "ckpt" / "epoch-0_step-3" / "COMPLETE").is_file()


@pytest.mark.parametrize("command, data_flag, data, expected", [
    ("sft", "--dataset", "sft_train", {"batch_size": 4, "max_steps": 2, "seed": 3, "keep_last": 1}),
    ("grpo", "--prompt_dataset", "prompt_train", {"batch_size": 2, "num_generations": 2, "max_new_tokens": 8,
                                                  "num_episodes": 2, "kl_coef": 0.05, "seed": 3,
                                                  "reward_fn": ["math_answer"]}),
])
def test_a_config_saved_before_the_refactor_loads_with_its_settings(command, data_flag, data, expected, tiny_assets,
                                                                   monkeypatch):
    """Its paths were the recording machine's, so the model and data are given again (later flags win)."""
    args = parsed_args(command, ["--config", str(BEFORE / command / "run_config.yaml"), "--pretrain",
                                 str(tiny_assets["model"]), data_flag, str(tiny_assets[data])], monkeypatch)
    assert {name: getattr(args, name) for name in expected} == expected
