"""Failing safe, as real processes: workers die with a killed torchrun or a killed `coati`, a reward function that hangs ends the
run with one line, an on-policy run checkpoints at its end, and asynchronous GRPO with several collect steps
per episode does not stall."""
import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from conftest import REPO, SCRIPTS, checkpoint_names, child_env, start_torchrun, torchrun_cmd


def _grpo_args(assets, *extra, reward="math_answer"):
    return ["--pretrain", str(assets["model"]), "--prompt_dataset", str(assets["prompt_train"]), "--plugin", "ddp",
            "--batch_size", "2", "--num_generations", "2", "--max_new_tokens", "8", "--sample_log_interval", "0",
            "--reward_fn", reward, *extra]


def _python(script, *args, env=None, timeout=600):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(**(env or {})), cwd=REPO)


@pytest.mark.slow
def test_workers_exit_when_torchrun_itself_is_killed(tiny_assets, tmp_path):
    proc = start_torchrun(SCRIPTS / "train_sft.py", 2, "--pretrain", str(tiny_assets["model"]), "--dataset",
                          str(tiny_assets["sft_train"]), "--batch_size", "2", "--max_epochs", "1000", "--plugin", "ddp",
                          log=tmp_path / "log.txt")
    workers = []
    try:
        deadline = time.monotonic() + 300
        while "train:" not in (tmp_path / "log.txt").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()[-3000:]
            time.sleep(1)
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert len(workers) >= 2
        proc.kill()                                   # SIGKILL: torchrun gets no chance to stop its workers
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, f"workers still running 20 s after torchrun was killed: {[p.pid for p in alive]}"
    finally:
        for worker in workers + psutil.Process().children(recursive=True):
            try:
                worker.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.slow
def test_a_launched_run_ends_with_its_coati_process_killed_outright(tiny_assets, tmp_path):
    """`kill -9` of `coati sft --nproc_per_node 2` (what an out-of-memory killer or a lost shell does): its torchrun
    gets SIGTERM from the kernel and stops its workers, which say how to resume; none trains on, orphaned."""
    log = tmp_path / "log.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "coati"), "sft", "--nproc_per_node", "2",
                                 "--pretrain", str(tiny_assets["model"]), "--dataset", str(tiny_assets["sft_train"]),
                                 "--batch_size", "2", "--max_epochs", "1000"], stdout=out, stderr=subprocess.STDOUT,
                                env=child_env(), cwd=REPO)
    run = []
    try:
        deadline = time.monotonic() + 300
        while "train:" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        run = psutil.Process(proc.pid).children(recursive=True)
        assert len(run) >= 3                                  # torchrun and its two workers
        proc.kill()
        proc.wait()
        gone, alive = psutil.wait_procs(run, timeout=60)
        assert not alive, f"still running 60 s after coati was killed: {[p.cmdline() for p in alive]}"
        assert "error: interrupted; the complete checkpoints in --save_dir, if any, are kept" in log.read_text()
    finally:
        for process in run:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.slow
def test_a_reward_function_that_never_returns_ends_the_run_with_one_line(tiny_assets, tmp_path):
    (tmp_path / "stuck_reward.py").write_text("import time\n\ndef reward(prompts, completions, **fields):\n"
                                             "    time.sleep(3600)\n")
    start = time.monotonic()
    result = subprocess.run(
        torchrun_cmd(SCRIPTS / "train_grpo.py", 2, *_grpo_args(tiny_assets, "--reward_timeout", "3",
                                                               "--num_episodes", "2", reward="stuck_reward:reward")),
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=child_env(PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"))
    assert time.monotonic() - start < 300
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if "did not return" in line]
    assert ours and ours[0] == "error: reward function stuck_reward:reward did not return within --reward_timeout 3 s"
    assert "traceback : error: reward function stuck_reward:reward did not return" in result.stderr


@pytest.mark.slow
def test_an_on_policy_run_without_save_interval_checkpoints_at_its_end(tiny_assets, tmp_path):
    result = _python(SCRIPTS / "train_grpo.py", *_grpo_args(tiny_assets, "--num_episodes", "2", "--save_dir",
                                                            str(tmp_path / "ckpt")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert checkpoint_names(tmp_path / "ckpt") == ["epoch-0_step-2"]
    assert (tmp_path / "ckpt" / "epoch-0_step-2" / "COMPLETE").is_file()


@pytest.mark.slow
@pytest.mark.extended
def test_async_grpo_with_two_collect_steps_per_episode_runs_to_the_end(tiny_assets, tmp_path):
    result = _python(SCRIPTS / "train_grpo.py", *_grpo_args(tiny_assets, "--num_episodes", "3", "--num_collect_steps",
                                                            "2", "--async_rollout", "--max_staleness", "1",
                                                            "--log_dir", str(tmp_path / "logs")), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["train/rollout/staleness@trained/max"] <= 1 for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_sft.py", "train_grpo.py"])
def test_a_diverging_run_stops_with_one_line_and_saves_no_nan(tiny_assets, tmp_path, script):
    """An absurd learning rate makes the weights diverge within a few steps: SFT stops at the step whose loss
    is NaN, GRPO when the policy's logits are (sampling from them would crash); the checkpoints written
    before hold finite weights only, and nothing is exported."""
    from safetensors.torch import load_file

    data = ["--dataset", str(tiny_assets["sft_train"]), "--batch_size", "8", "--max_steps", "12"]
    if script == "train_grpo.py":
        data = _grpo_args(tiny_assets, "--num_episodes", "12", "--entropy_coef", "0.1")[2:]   # a gradient without rewards
    result = _python(SCRIPTS / script, "--pretrain", str(tiny_assets["model"]), *data, "--lr", "1e20", "--grad_clip",
                     "0", "--save_dir", str(tmp_path / "ckpt"), "--save_interval", "1", "--output_dir",
                     str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    expected = {"train_sft.py": r"error: step \d+: the loss is NaN or infinite; the run stops",
                "train_grpo.py": r"error: generation: the policy's next-token logits are NaN or infinite"}[script]
    assert re.match(expected, last), last
    assert not (tmp_path / "out" / "model").exists()   # the run's config and logs are there, no model
    for shard in (tmp_path / "ckpt").rglob("*.safetensors"):
        assert all(bool(t.isfinite().all()) for t in load_file(shard).values()), shard
