"""The vLLM rollout backend under the training scripts, for real: servers run in vLLM's own environment
(`make vllm-env`), nothing mocked, the scripts under torchrun."""
import json
import shutil
import time
from pathlib import Path

import psutil
import pytest

from conftest import SCRIPTS, assert_same_records, kill_run, start_torchrun, torchrun, train_records

pytestmark = [pytest.mark.extended, pytest.mark.usefixtures("vllm_environment")]

SERVER_MODULE = "coati.inference.vllm_server"


def _server_processes(marker: str):
    """Live vLLM server processes whose command line contains `marker`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if SERVER_MODULE in cmdline and marker in cmdline and process.status() != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


# ---- the training scripts on the backend ---------------------------------------------------------
MULTI_TURN = ["--tools", "calculator", "--max_turns", "2"]
"""Episodes that may call the calculator: the multi-turn workflow on the engine, synchronously and asynchronously."""


def _rl_args(assets, model, out, episodes: int, eager: bool = True) -> list:
    """A vLLM GRPO run's flags; `eager` skips vLLM's torch.compile (a third of the start-up; one test runs compiled)."""
    return ["--pretrain", str(model), "--prompt_dataset", str(assets["prompt_train"]), "--plugin", "ddp",
            "--batch_size", "2", "--num_generations", "4", "--max_new_tokens", "8", "--num_episodes", str(episodes),
            "--lr", "1e-3", "--log_dir", str(out / "logs"), "--sample_log_interval", "0", "--rollout_backend", "vllm",
            "--vllm_threads", "1", *(["--vllm_enforce_eager"] if eager else [])]


def _records(out):
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def own_model(small_model, tmp_path):
    """A copy of the small model at a path of this test's own, which names its servers' processes."""
    return Path(shutil.copytree(small_model, tmp_path / "model"))


@pytest.mark.slow
def test_multi_turn_grpo_trains_on_vllm_rollouts_and_resumes_exactly(tiny_assets, own_model, tmp_path):
    """Multi-turn GRPO with LoRA on vLLM under two ranks, the engine served the adapters alone after every update
    (its sync probe and the behaviour ratio show it serves the adapted model); then the same command resumed from its
    step-2 checkpoint logs steps 3 and 4 exactly as the uninterrupted run did: each completion's draws come from a
    seed of its own (the server's, the version, the prompt, its place), not from the engine's state, which a
    checkpoint does not hold."""
    def args(out):
        return [*_rl_args(tiny_assets, own_model, out, 4), "--reward_fn", "math_answer", "answer_format", *MULTI_TURN,
                "--lora_rank", "4", "--lora_alpha", "8", "--vllm_lora_sync", "adapter", "--save_interval", "2",
                "--save_dir", str(out / "ckpt")]

    grpo = tmp_path / "grpo"
    result = torchrun(SCRIPTS / "train_grpo.py", 2, *args(grpo))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "vLLM rollout engine ready in" in result.stdout and "LoRA updates send the adapters alone" in result.stdout
    records = _records(grpo)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert 0 < r["train/behaviour_ratio/min"] <= r["train/behaviour_ratio"] <= r["train/behaviour_ratio/max"]
        assert abs(r["train/behaviour_ratio"] - 1) < 1e-3   # fp32 engine and trainer agree, on the sampled tokens
        assert r["train/rollout/turns"] >= 1 and r["train/rollout/sampled_tokens"] > 0
    assert all(r["train/time/weight_sync"] > 0 for r in records[1:])   # the weights of episodes 1 to 3
    assert all(r["train/engine/probe_logprob_diff"] < 1e-4 and r["train/time/engine_probe"] > 0 for r in records[1:])
    assert {p.name for p in (grpo / "logs").glob("vllm_*.log")} == {"vllm_rank0_0.log", "vllm_rank1_0.log"}
    assert not _server_processes(str(own_model))

    resumed = tmp_path / "resumed"
    result = torchrun(SCRIPTS / "train_grpo.py", 2, *args(resumed), "--checkpoint_path",
                      str(grpo / "ckpt" / "epoch-0_step-2"))
    assert result.returncode == 0, result.stderr[-4000:]
    # fresh servers batch the second turn's requests as they arrive: vLLM's log-probs may differ in the last bits
    assert_same_records(train_records(resumed / "logs"), train_records(grpo / "logs")[2:])


@pytest.mark.slow
def test_async_grpo_on_one_vllm_generator_stays_within_its_staleness(tiny_assets, own_model, tmp_path):
    """Asynchronous multi-turn LoRA GRPO on one vLLM generator (sent the merged weights, as auto picks on a CPU): the
    staleness bound holds, IcePop weighs the behaviour ratios, and every publish passes the sync probe."""
    result = torchrun(SCRIPTS / "train_grpo.py", 2, *_rl_args(tiny_assets, own_model, tmp_path, 4),
                      "--reward_fn", "answer_format", "--async_rollout", "--num_generators", "1", "--max_staleness", "1",
                      "--behaviour_correction", "icepop", *MULTI_TURN, "--lora_rank", "4", "--lora_alpha", "8")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "LoRA updates send the merged weights" in result.stdout   # --vllm_lora_sync auto, on a CPU
    records = _records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert 0 <= r["train/rollout/staleness@trained/min"] <= r["train/rollout/staleness@trained/max"] <= 1
        assert r["train/rollout/turns"] >= 1 and "train/rollout/ended/max_turns" in r
        assert 0 < r["train/behaviour_weight"] and 0 <= r["train/behaviour_capped"] <= 1   # IcePop's band weights
    probed = [r["train/engine/probe_logprob_diff"] for r in records if "train/engine/probe_logprob_diff" in r]
    assert probed and max(probed) < 1e-4   # publishes probed while the generator ran ahead
    assert (tmp_path / "logs" / "vllm_rank0_0.log").is_file()
    assert not _server_processes(str(own_model))


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.mark.slow
def test_killing_the_trainer_leaves_no_engine_behind(tiny_assets, own_model, tmp_path):
    """PPO on vLLM rollouts of multi-turn episodes (a critic and a reward model beside the engine) through its first
    episode, whose weights went to the servers in memory with no name in /dev/shm (so no kill can leave them there);
    then torchrun and its workers SIGKILLed: the servers notice and exit."""
    shm_before = set(Path("/dev/shm").glob("*coati*"))
    log = tmp_path / "run.log"
    proc = start_torchrun(SCRIPTS / "train_ppo.py", 2, *_rl_args(tiny_assets, own_model, tmp_path, 500),
                          "--reward_fn", "answer_format", *MULTI_TURN, log=log)
    metrics = tmp_path / "logs" / "metrics.jsonl"
    servers = []
    try:
        _wait_for(lambda: metrics.is_file() and "train/rollout/turns" in metrics.read_text(), 300, "PPO's first episode")
        assert "train/loss/value" in metrics.read_text()
        servers = _server_processes(str(own_model))
        assert len(servers) == 2 and set(Path("/dev/shm").glob("*coati*")) <= shm_before
    finally:
        trainers = [p for p in psutil.Process(proc.pid).children(recursive=True) if p not in servers]
        for process in [psutil.Process(proc.pid), *trainers]:   # SIGKILL torchrun and its workers, not the servers
            process.kill()
        proc.wait()
    _wait_for(lambda: not _server_processes(str(own_model)), 30, "the servers to exit")
    assert set(Path("/dev/shm").glob("*coati*")) <= shm_before


@pytest.mark.slow
def test_an_engine_that_dies_ends_the_run_with_one_line(tiny_assets, own_model, tmp_path):
    """Also the one run of vLLM compiled (its default), which the other tests start eager to save time."""
    log = tmp_path / "run.log"
    proc = start_torchrun(SCRIPTS / "train_grpo.py", 1, *_rl_args(tiny_assets, own_model, tmp_path, 500, eager=False),
                          "--reward_fn", "answer_format", "--vllm_max_restarts", "0", log=log)
    try:
        _wait_for(lambda: "episodes:" in log.read_text(errors="replace"), 300, "the first episode")
        for server in _server_processes(str(own_model)):
            server.kill()
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            kill_run(proc)
    errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "vLLM server 0 died" in errors[0] and "--vllm_max_restarts" in errors[0], errors


def test_a_missing_vllm_environment_is_one_line(tiny_assets, tmp_path):
    result = torchrun(SCRIPTS / "train_grpo.py", 1, *_rl_args(tiny_assets, tiny_assets["model"], tmp_path, 1),
                      "--reward_fn", "answer_format", "--vllm_python", str(tmp_path / "nowhere" / "python"))
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --rollout_backend vllm: no Python interpreter at {tmp_path / 'nowhere' / 'python'}; "
                      "build vLLM's environment with `make vllm-env`, or name one that has vLLM with --vllm_python"]
