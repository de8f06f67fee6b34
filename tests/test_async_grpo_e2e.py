"""train_grpo.py --async_rollout under two torchrun processes: rank 0 drives Ray generators, both ranks
train on their share; staleness stays within --max_staleness; the run checkpoints and resumes."""
import importlib.util
import json

import pytest

from conftest import SCRIPTS, torchrun


def _args(assets, out, episodes: int) -> list:
    return ["--pretrain", str(assets["model"]), "--prompt_dataset", str(assets["prompt_train"]), "--plugin", "ddp",
            "--batch_size", "2", "--num_generations", "4", "--max_new_tokens", "8", "--num_episodes", str(episodes),
            "--lr", "1e-3", "--reward_fn", "math_answer", "answer_format", "--async_rollout", "--max_staleness", "1",
            "--save_interval", "2", "--save_dir", str(out / "ckpt"), "--log_dir", str(out / "logs"),
            "--sample_log_interval", "0", "--tools", "calculator", "--max_turns", "2"]


def _records(out):
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_async_grpo_trains_within_the_staleness_bound_and_resumes(tiny_assets, tmp_path):
    result = torchrun(SCRIPTS / "train_grpo.py", 2, *_args(tiny_assets, tmp_path, 4))
    assert result.returncode == 0, result.stderr[-4000:]
    records = _records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert 0 <= r["train/rollout/staleness@trained/min"] <= r["train/rollout/staleness@trained/max"] <= 1
        assert r["train/behaviour_weight"] > 0 and "train/time/rollout_wait" in r
        assert 0 <= r["train/rewards/answer_format/mean"] <= 1
        assert r["train/rollout/turns"] >= 1 and "train/rollout/tool_errors/malformed" in r   # multi-turn episodes
    state = json.loads((tmp_path / "ckpt" / "epoch-0_step-4" / "running_states.json").read_text())
    # rank 0 drew the 4 episodes' 2 x 2 prompts, and at most the default 2 x 4 more for rollouts in flight
    assert 4 * 2 * 2 <= state["prompt_index"] <= 4 * 2 * 2 + 8

    result = torchrun(SCRIPTS / "train_grpo.py", 2, *_args(tiny_assets, tmp_path, 6), "--checkpoint_path", "latest")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resumed from" in result.stdout + result.stderr
    assert [r["step"] for r in _records(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_async_rollout_refuses_what_it_does_not_support(tiny_assets, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("train_grpo", SCRIPTS / "train_grpo.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as exited:
        script.main([*_args(tiny_assets, tmp_path, 1), "--lora_rank", "4"])
    assert exited.value.code == 2
    assert "--async_rollout does not support --lora_rank" in capsys.readouterr().err
