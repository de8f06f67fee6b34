"""Health alarms in a real run under torchrun: `--stop_on_alarm` ends it with a checkpoint that resumes."""
import json
import re

import pytest

from conftest import SCRIPTS, torchrun


@pytest.mark.slow
def test_stop_on_alarm_ends_the_run_with_a_checkpoint_that_resumes(tiny_assets, tmp_path):
    args = ["--pretrain", str(tiny_assets["model"]), "--prompt_dataset", str(tiny_assets["prompt_train"]),
            "--plugin", "ddp", "--batch_size", "2", "--max_new_tokens", "8", "--num_episodes", "4",
            "--num_generations", "2", "--reward_fn", "answer_format", "--save_dir", str(tmp_path / "ckpt"),
            "--log_dir", str(tmp_path / "logs")]
    stopped = torchrun(SCRIPTS / "train_grpo.py", 1, *args, "--output_dir", str(tmp_path / "out"),
                       "--stop_on_alarm", "entropy_collapse", "--alarm_threshold", "entropy_floor=2", "patience=1")
    assert stopped.returncode != 0 and re.search(r"exitcode\s*: 4", stopped.stderr), stopped.stderr[-3000:]
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: stopped by alarm entropy_collapse (--stop_on_alarm); complete checkpoints in "
                      f"{tmp_path / 'ckpt'} are kept (resume from epoch-0_step-1 with --checkpoint_path latest)"]
    assert "warning: alarm entropy_collapse at step 1: train/policy_entropy = " in stopped.stderr
    alarms = json.loads((tmp_path / "out" / "alarms.json").read_text())   # answer_format is 0 for all: no spread
    assert list(alarms) == ["entropy_collapse", "zero_std_groups"] and "--stop_on_alarm" in alarms["entropy_collapse"]
    assert (tmp_path / "ckpt" / "epoch-0_step-1").is_dir() and not (tmp_path / "out" / "model").exists()
    logged = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "alarm/entropy_collapse" in r] == [1]

    resumed = torchrun(SCRIPTS / "train_grpo.py", 1, *args, "--checkpoint_path", "latest",
                       "--eval_dataset", str(tiny_assets["prompt_train"]), "--eval_n_samples", "4",
                       "--save_best", "rewards/answer_format", "--output_dir", str(tmp_path / "final"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    best = json.loads((tmp_path / "final" / "best.json").read_text())
    evals = [r for r in map(json.loads, (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines())
             if "eval/rewards/answer_format" in r]
    assert best["value"] == max(r["eval/rewards/answer_format"] for r in evals) and best["metric"] == "eval/rewards/answer_format"
    assert (tmp_path / "final" / "best" / "config.json").is_file() and (tmp_path / "final" / "model" / "config.json").is_file()
    assert "resumed from" in resumed.stdout + resumed.stderr and (tmp_path / "ckpt" / "epoch-0_step-4").is_dir()
    final = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()][-1]
    sampled = {k: v for k, v in final.items() if k.startswith("eval/rewards/answer_format/")}
    assert set(sampled) == {f"eval/rewards/answer_format/{m}" for m in ("pass@1", "pass@2", "pass@4", "maj@4", "mean@4")}
    assert sampled["eval/rewards/answer_format/pass@1"] == pytest.approx(sampled["eval/rewards/answer_format/mean@4"])
    assert 0 <= sampled["eval/rewards/answer_format/pass@1"] <= sampled["eval/rewards/answer_format/pass@4"] <= 1
