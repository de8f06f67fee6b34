"""train_grpo.py --async_rollout under two torchrun processes: rank 0 drives Ray generators, both ranks
train on their share, with partial rollouts; staleness stays within --max_staleness; a run killed at a random
moment resumes and trains every prompt of each pass exactly once."""
import collections
import importlib.util
import json
import random
import time

import pytest

from coati.utils.ckpt_io import latest_checkpoint
from conftest import SCRIPTS, kill_run, start_torchrun, torchrun, unknown_metrics

PROMPTS, PER_STEP = 12, 4   # 2 ranks x batch 2: three steps a pass


def _args(assets, out, episodes: int, prompts=None) -> list:
    return ["--pretrain", str(assets["model"]), "--prompt_dataset", str(prompts or assets["prompt_train"]),
            "--plugin", "ddp", "--batch_size", "2", "--num_generations", "4", "--max_new_tokens", "8",
            "--num_episodes", str(episodes), "--lr", "1e-3", "--reward_fn", "math_answer", "answer_format",
            "--async_rollout", "--max_staleness", "1", "--save_interval", "1", "--save_dir", str(out / "ckpt"),
            "--log_dir", str(out / "logs"), "--sample_log_interval", "1", "--tools", "calculator", "--max_turns", "2",
            "--partial_rollout_tokens", "3"]


def _records(out):
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


def _trained_prompts(out) -> dict:
    """prompt_id ("pass:row") -> the steps whose sample tables hold it (every sample of a step is in its table)."""
    steps = collections.defaultdict(set)
    for table in (out / "logs" / "rich_completions").glob("completions_step_*.json"):
        data = json.loads(table.read_text())
        column = data["columns"].index("prompt_id")
        for row in data["data"]:
            steps[row[column]].add(int(table.stem.rsplit("_", 1)[1]))
    return steps


def _wait_randomly_before_the_last_step(ckpt, episodes: int, seconds: float) -> None:
    """Sleep up to `seconds`, returning early once the checkpoint before the last is written, so that the kill
    lands at a random moment while a step is still left to train (a step takes far longer than one poll)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _last_saved_step(ckpt) < episodes - 1:
        time.sleep(0.02)


def _last_saved_step(ckpt) -> int:
    latest = latest_checkpoint(ckpt)
    return int(latest.name.rsplit("step-", 1)[1]) if latest else 0


@pytest.fixture(scope="module")
def few_prompts(tiny_assets, tmp_path_factory):
    """A prompt set of PROMPTS rows, so that a short run makes two passes over it."""
    from coati.dataset.prepare import load_prepared

    path = tmp_path_factory.mktemp("few_prompts") / "prompts"
    load_prepared([str(tiny_assets["prompt_train"])], "prompt").select(range(PROMPTS)).save_to_disk(str(path))
    return path


@pytest.mark.slow
def test_async_grpo_killed_at_a_random_moment_trains_every_prompt_of_a_pass_once(tiny_assets, few_prompts, tmp_path):
    """Two passes over the prompts (6 steps); the first run is SIGKILLed at a random moment after its first
    checkpoint, while rank 0's executor holds prompts running or finished but not trained on; the resumed run
    rolls those out first. Each prompt of the first pass is trained on exactly once, and none of any pass twice."""
    episodes = 2 * PROMPTS // PER_STEP
    first = tmp_path / "first.log"
    proc = start_torchrun(SCRIPTS / "train_grpo.py", 2, *_args(tiny_assets, tmp_path, episodes, few_prompts), log=first)
    deadline = time.monotonic() + 300
    while latest_checkpoint(tmp_path / "ckpt") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _wait_randomly_before_the_last_step(tmp_path / "ckpt", episodes, random.uniform(0, 3))
    assert kill_run(proc) != 0, "the run finished before it could be killed: " + first.read_text()[-2000:]
    killed_at = latest_checkpoint(tmp_path / "ckpt")
    assert _last_saved_step(tmp_path / "ckpt") < episodes, "killed after the last checkpoint: nothing to resume"
    state = json.loads((killed_at / "running_states.json").read_text())
    assert state["pending_prompts"], "nothing was in flight at the checkpoint: the test checks nothing"

    result = torchrun(SCRIPTS / "train_grpo.py", 2, *_args(tiny_assets, tmp_path, episodes, few_prompts),
                      "--checkpoint_path", "latest")
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"resumed from {killed_at}" in result.stdout + result.stderr
    records = [r for r in _records(tmp_path) if "train/loss" in r]
    assert [r["step"] for r in records] == list(range(1, episodes + 1))
    assert not unknown_metrics(_records(tmp_path))   # asynchronous, multi-turn, partial: all in the catalogue
    for r in records:
        assert 0 <= r["train/rollout/staleness@trained/min"] <= r["train/rollout/staleness@trained/max"] <= 1
        assert 0 <= r["train/rollout/staleness@token/min"] <= r["train/rollout/staleness@token/max"] <= 1   # partial
        assert r["train/behaviour_weight"] > 0 and "train/time/rollout_wait" in r
        assert r["train/rollout/turns"] >= 1 and "train/rollout/tool_errors/malformed" in r   # multi-turn episodes
    trained = _trained_prompts(tmp_path)
    assert all(len(steps) == 1 for steps in trained.values()), {p: s for p, s in trained.items() if len(s) > 1}
    assert {p for p in trained if p.startswith("0:")} == {f"0:{row}" for row in range(PROMPTS)}
    assert len(trained) == episodes * PER_STEP


def test_async_rollout_refuses_what_it_does_not_support(tiny_assets, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("train_grpo", SCRIPTS / "train_grpo.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as exited:
        script.main([*_args(tiny_assets, tmp_path, 1), "--plugin", "gemini"])
    assert exited.value.code == 2
    assert "--async_rollout supports --plugin ddp, zero2 and zero2_cpu, whose ranks hold whole parameters" in \
        capsys.readouterr().err
