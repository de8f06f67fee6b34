"""train_grpo.py and train_ppo.py under two torchrun processes: the same command run twice logs the same metrics
exactly, and a run killed mid-way and resumed from its last checkpoint logs what an uninterrupted run logs; exports
and sample tables land on disk."""
import json
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from coati.utils.ckpt_io import latest_checkpoint
from conftest import REPO, SCRIPTS, assert_same_records, kill_run, start_torchrun, torchrun, train_records

EPISODES, SAVE_EVERY = 24, 4


def _args(script: str, assets, out: Path, turn_ender: Path) -> list:
    pretrain = turn_ender if script == "train_grpo.py" else assets["model"]
    common = ["--pretrain", str(pretrain), "--prompt_dataset", str(assets["prompt_train"]), "--plugin", "ddp",
              "--batch_size", "2", "--max_new_tokens", "8", "--num_episodes", str(EPISODES), "--lr", "1e-3",
              "--save_interval", str(SAVE_EVERY), "--sample_log_interval", "6", "--save_dir", str(out / "ckpt"),
              "--log_dir", str(out / "logs"), "--packing"]   # packed update forwards resume exactly too
    if script == "train_grpo.py":
        return common + ["--num_generations", "4", "--kl_coef", "0.05", "--reward_fn", "math_answer", "answer_format",
                         # episodes of several turns, with tools that take a random time: they resume exactly too
                         "--tools", "tool_timing:clock", "--tool_parser", "tool_timing:every_turn_a_call", "--max_turns", "3"]
    return common + ["--rm_pretrain", str(assets["model"]), "--reward_fn", "answer_format", "--num_update_steps", "2",
                     "--ptx_dataset", str(assets["sft_train"]), "--ptx_coef", "0.1"]


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_grpo.py", "train_ppo.py"])
def test_killed_rl_run_resumes_with_the_same_metrics(tiny_assets, turn_ender, tmp_path, script):
    tools = {"PYTHONPATH": str(REPO / "tests")}   # tool_timing
    full = tmp_path / "full"
    result = torchrun(SCRIPTS / script, 2, *_args(script, tiny_assets, full, turn_ender), "--output_dir", str(full),
                      **tools)
    assert result.returncode == 0, result.stderr[-4000:]
    expected = train_records(full / "logs")
    assert [r["step"] for r in expected] == list(range(1, EPISODES + 1))
    assert AutoModelForCausalLM.from_pretrained(full / "model").config.model_type == "llama"
    table = json.loads((full / "logs" / "rich_completions" / "completions_step_000006.json").read_text())
    assert table["data"] and {"prompt", "completion", "reward", "answer_format", "advantage"} <= set(table["columns"])
    assert all(len(row) == len(table["columns"]) for row in table["data"])
    if script == "train_ppo.py":
        assert (full / "ckpt" / f"epoch-0_step-{EPISODES}" / "critic" / "modeling").is_dir()
        assert all("train/loss/ptx" in r and "train/loss/value" in r for r in expected)
    else:   # turns call the clock, several per episode, before the first checkpoint (the policy may learn to stop)
        assert all(r["train/rollout/tool_calls"] > 0 and r["train/rollout/turns"] > 1 for r in expected[:SAVE_EVERY])

    run = tmp_path / "killed"
    run.mkdir()
    proc = start_torchrun(SCRIPTS / script, 2, *_args(script, tiny_assets, run, turn_ender), log=run / "first.log",
                          **tools)
    deadline = time.monotonic() + 300
    while latest_checkpoint(run / "ckpt") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kill_run(proc) != 0, "the run finished before it could be killed"
    killed_at = latest_checkpoint(run / "ckpt")
    assert killed_at is not None and not killed_at.name.endswith(f"step-{EPISODES}")

    result = torchrun(SCRIPTS / script, 2, *_args(script, tiny_assets, run, turn_ender), "--checkpoint_path", "latest",
                      **tools)
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"resumed from {killed_at}" in result.stdout + result.stderr
    resumed = train_records(run / "logs")
    assert [r["step"] for r in resumed] == list(range(1, EPISODES + 1))
    before_kill = int(killed_at.name.rsplit("-", 1)[1])   # logged by the second run of the same command, unresumed
    if script == "train_grpo.py":   # the resumed stretch holds episodes of several turns
        assert any(r["train/rollout/turns"] > 1 for r in expected[before_kill:])
    assert resumed[:before_kill] == expected[:before_kill]   # exactly: same seed, same machine, same ranks
    assert_same_records(resumed, expected)
