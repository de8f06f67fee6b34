"""The vLLM rollout backend for real: servers run in vLLM's own environment (`make vllm-env`), nothing mocked.
Engine-level checks share one server; the end-to-end ones launch the training scripts under torchrun."""
import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import SCRIPTS, assert_same_records, completion_tokens as _tokens, kill_run, start_torchrun, torchrun, train_records
from coati.inference.vllm import EngineError, VLLMConfig, VLLMPool, default_vllm_python
from coati.models.generation import HFEngine
from coati.config import SamplingConfig
from coati.rollout.engine import generate_requests

SERVER_MODULE = "coati.inference.vllm_server"

if not os.access(default_vllm_python(), os.X_OK):
    if os.environ.get("CI"):
        raise RuntimeError(f"CI runs the vLLM tests: {default_vllm_python()} is missing (make vllm-env builds it)")
    pytest.skip("no vLLM environment: `make vllm-env` builds it", allow_module_level=True)


def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _prompts(assets, count: int = 4):
    from coati.dataset.prepare import load_prepared

    rows = load_prepared([str(assets["prompt_eval"])], "prompt")
    return [list(rows[i]["input_ids"]) for i in range(count)]


def _generate(pool: VLLMPool, prompts, config: SamplingConfig, n: int = 1):
    async def every():
        return await asyncio.gather(*(pool.agenerate(prompt, config, n) for prompt in prompts))

    return asyncio.run(every())


def _hf_greedy(model, tokenizer, prompts, config: SamplingConfig):
    engine = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    return generate_requests(engine, [(prompt, 1) for prompt in prompts], config, 0, logprobs=True)


def _server_processes(marker: str):
    """Live vLLM server processes whose command line contains `marker`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if SERVER_MODULE in cmdline and marker in cmdline and process.status() != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


@pytest.fixture(scope="module")
def small_model(tiny_assets, tmp_path_factory):
    """The tiny assets' tokenizer with the `small` model: vLLM's CPU attention takes head sizes from 32 up. Its context
    holds a multi-turn episode's prompt with the calculator's schema (about 550 tokens of this small vocabulary)."""
    from coati.models.tiny import build_tiny_llama

    tokenizer = _tokenizer(tiny_assets["model"])
    out = tmp_path_factory.mktemp("small_model")
    build_tiny_llama(tokenizer, size="small", max_position_embeddings=1024).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def served(small_model, tmp_path_factory):
    """One server on the small model (serving LoRA adapters too), with the same model in this process for
    reference."""
    from transformers import AutoModelForCausalLM

    tokenizer = _tokenizer(small_model)
    logs = tmp_path_factory.mktemp("vllm_logs")
    pool = VLLMPool(VLLMConfig(model=str(small_model), log_dir=str(logs), threads=1, max_restarts=2, timeout_s=30,
                               enforce_eager=True, max_lora_rank=4), tokenizer.pad_token_id, [tokenizer.eos_token_id])
    model = AutoModelForCausalLM.from_pretrained(small_model).eval()
    yield pool, model, tokenizer, logs
    pool.shutdown()


def test_greedy_is_deterministic_and_matches_the_hf_engine(served, tiny_assets):
    pool, model, tokenizer, logs = served
    prompts = _prompts(tiny_assets)
    greedy = SamplingConfig(max_new_tokens=12, do_sample=False)
    first, again = _generate(pool, prompts, greedy), _generate(pool, prompts, greedy)
    reference = _hf_greedy(model, tokenizer, prompts, greedy)
    for prompt, ours, repeat, theirs in zip(prompts, first, again, reference):
        assert ours.sequences[0, :ours.prompt_length].tolist() == prompt and ours.version == 0
        assert _tokens(ours) == _tokens(repeat) == _tokens(theirs)
        mask = ours.action_mask[0]
        assert torch.allclose(ours.logprobs[0][mask], theirs.logprobs[0][theirs.action_mask[0]], atol=1e-4)
    assert (logs / "vllm_0.log").read_text().count("ready:") == 1


def test_completions_follow_the_sampling_config(served, tiny_assets):
    pool, model, tokenizer, _ = served
    prompts = _prompts(tiny_assets, 2)
    free = _tokens(_generate(pool, prompts, SamplingConfig(max_new_tokens=10, do_sample=False))[0])
    stop = free[min(3, len(free) - 1)]   # a token greedy decoding does emit: the completion must end at its first one
    config = SamplingConfig(max_new_tokens=10, do_sample=False, stop_token_ids=(stop,))
    stopped = _generate(pool, prompts, config)
    expected = free[:free.index(stop) + 1]
    assert _tokens(stopped[0]) == expected and _tokens(stopped[0])[-1] == stop
    assert [_tokens(c) for c in stopped] == [_tokens(c) for c in _hf_greedy(model, tokenizer, prompts, config)]

    sampled = _generate(pool, prompts, SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=(stop,)), n=4)
    for completions in sampled:
        assert completions.sequences.size(0) == 4 and completions.action_mask.size(1) <= 6
        for row in range(4):
            tokens = _tokens(completions, row)
            assert 1 <= len(tokens) <= 6 and stop not in tokens[:-1]
            assert tokens[-1] == stop or len(tokens) == 6
            assert (completions.logprobs[row][completions.action_mask[row]] <= 0).all()
            assert (completions.logprobs[row][~completions.action_mask[row]] == 0).all()


def test_published_weights_are_served_with_their_version(served, tiny_assets):
    pool, model, tokenizer, _ = served
    prompts = _prompts(tiny_assets)
    greedy = SamplingConfig(max_new_tokens=12, do_sample=False)
    before = [_tokens(c) for c in _generate(pool, prompts, greedy)]
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    answers = pool.publish(model.state_dict(), 7).result()
    assert [a["version"] for a in answers] == [7] and pool.last_sync_seconds > 0
    after = _generate(pool, prompts, greedy)
    assert all(c.version == 7 for c in after)
    assert [_tokens(c) for c in after] == [_tokens(c) for c in _hf_greedy(model, tokenizer, prompts, greedy)]
    assert [_tokens(c) for c in after] != before
    pool.publish(model.state_dict(), 8).result()
    pool._shared.write({name: torch.zeros_like(t) for name, t in model.state_dict().items()}, 8)   # its slot, again
    assert [_tokens(c) for c in _generate(pool, prompts, greedy)] == [_tokens(c) for c in after]   # vLLM kept a copy
    pool.publish(model.state_dict(), 8).result()
    assert [p.name for p in pool.work_dir.iterdir()] == ["src"] and not list(Path("/dev/shm").glob("*coati*"))


def test_a_lora_model_is_served_merged_or_as_its_adapters(served, small_model, tiny_assets):
    """`--lora_rank` with vLLM: the engine serves the base weights with the adapters folded in, or the adapters alone
    over the base weights it holds; either way its greedy output equals the adapted model's (and each next adapter's
    in place of the one before), and the training model keeps its adapters apart (its state is unchanged)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from coati.models.lora import active_adapter, merged_weights

    pool, model, tokenizer, _ = served
    prompts = _prompts(tiny_assets)
    greedy = SamplingConfig(max_new_tokens=12, do_sample=False)
    base = [_tokens(c) for c in _hf_greedy(model, tokenizer, prompts, greedy)]
    own = AutoModelForCausalLM.from_pretrained(small_model)
    own.load_state_dict(model.state_dict())   # the weights the engine serves now (the tests before changed them)
    torch.manual_seed(0)
    peft_model = get_peft_model(own, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    adapted = peft_model.get_base_model().eval()   # what a boosted actor's `unwrap()` is: the base with adapter layers
    state = {name: tensor.clone() for name, tensor in adapted.state_dict().items()}
    weights = merged_weights(adapted)
    assert set(weights) == set(model.state_dict()) and any(".lora_" in name for name in state)
    pool.publish(weights, 9).result()
    served_tokens = [_tokens(c) for c in _generate(pool, prompts, greedy)]
    assert served_tokens == [_tokens(c) for c in _hf_greedy(adapted, tokenizer, prompts, greedy)] != base
    assert all(torch.equal(tensor, state[name]) for name, tensor in adapted.state_dict().items())

    pool.publish(model.state_dict(), 8).result()
    for version in (10, 11):   # adapters alone, the second in place of the first
        tensors, config = active_adapter(peft_model)
        assert all(".lora_" in name for name in tensors)
        assert sum(t.numel() for t in tensors.values()) < 0.1 * sum(t.numel() for t in weights.values())
        pool.publish_adapter(tensors, config, version).result()
        generated = _generate(pool, prompts, greedy)
        assert [c.version for c in generated] == [version] * len(prompts)
        assert [_tokens(c) for c in generated] == [_tokens(c) for c in _hf_greedy(adapted, tokenizer, prompts, greedy)]
        assert [p.name for p in (pool.work_dir / "adapters").iterdir()] == [f"v{version}"]
        with torch.no_grad():
            for name, parameter in adapted.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(-1.5)
    assert [_tokens(c) for c in generated] != served_tokens
    os.kill(pool.pids()[0], signal.SIGKILL)   # a restarted server serves the newest adapter over its base weights
    again = _generate(pool, prompts, greedy)
    assert pool.restarts == 1 and [c.version for c in again] == [11] * len(prompts)
    assert [_tokens(c) for c in again] == [_tokens(c) for c in generated]
    pool.publish(model.state_dict(), 8).result()   # the other tests' weights and version again: the adapter is dropped
    assert [_tokens(c) for c in _generate(pool, prompts, greedy)] == base


def test_held_out_evaluation_on_the_engine_scores_what_the_training_model_scores(served, tiny_assets):
    """A synchronous run evaluates on its rollout engine: greedy episodes of the same workflow give the same
    completions and rewards there as on the training model (which the served weights equal here)."""
    from coati.dataset.prepare import load_prepared
    from coati.experience.scorer import Scorer
    from coati.rewards import WeightedReward
    from coati.rollout.evaluation import complete
    from coati.rollout.local import LocalEngine
    from coati.rollout.workflow import RLVRWorkflow

    pool, model, tokenizer, _ = served
    rows = [{"input_ids": list(r["input_ids"]), "gt_answer": r["gt_answer"]}
            for r in load_prepared([str(tiny_assets["prompt_eval"])], "prompt").select(range(6))]
    workflow = RLVRWorkflow(Scorer(tokenizer, WeightedReward.from_specs(["math_answer", "answer_format"])),
                            SamplingConfig(max_new_tokens=10), 1)
    greedy = SamplingConfig(max_new_tokens=10, do_sample=False)
    on_engine = complete(pool, workflow, rows, greedy)
    on_model = complete(LocalEngine(HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id])), workflow, rows,
                        greedy)
    for engine_side, model_side in zip(on_engine, on_model):
        assert torch.equal(engine_side.sequences, model_side.sequences)
        assert engine_side.rewards.tolist() == model_side.rewards.tolist()


def test_the_sync_probe_stops_a_publish_that_did_nothing(small_model, tiny_assets, tmp_path, monkeypatch):
    """A server scores the probe after each load: equal to the trainer's log-probs after a real load; after a load
    dropped on purpose (the request replaced by one that loads nothing) the publish fails with one line, and so does
    every later request, before anything is generated on the unsynced weights."""
    from transformers import AutoModelForCausalLM

    from coati.rollout.probe import EngineSyncError, SyncProbe

    tokenizer = _tokenizer(small_model)
    model = AutoModelForCausalLM.from_pretrained(small_model).eval()
    pool = VLLMPool(VLLMConfig(model=str(small_model), log_dir=str(tmp_path), threads=1, enforce_eager=True),
                    tokenizer.pad_token_id, [tokenizer.eos_token_id])
    probe = SyncProbe(_prompts(tiny_assets, 2))
    try:
        synced = pool.publish(model.state_dict(), 1, probe.check(model, 1)).result()
        assert synced[0]["probe_diff"] < 1e-4 and synced[0]["probe_seconds"] > 0
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.001)   # a small update: within bf16's tolerance, but it moves the log-probs
        monkeypatch.setattr(pool, "_load_request", lambda slot, version: {"op": "info"})
        with pytest.raises(EngineSyncError, match="^the engine did not load weights version 2: its log-probs of the "
                                                  "sync probe are those of the previous version"):
            pool.publish(model.state_dict(), 2, probe.check(model, 2)).result()
        with pytest.raises(EngineSyncError, match="did not load weights version 2"):
            _generate(pool, _prompts(tiny_assets, 1), SamplingConfig(max_new_tokens=4))
    finally:
        pool.shutdown()


def test_a_dead_server_is_restarted_with_the_newest_weights_and_a_stopped_one_ends_the_run(served, tiny_assets):
    pool, model, tokenizer, _ = served
    prompts = _prompts(tiny_assets, 2)
    greedy = SamplingConfig(max_new_tokens=8, do_sample=False)
    served_before = [_tokens(c) for c in _generate(pool, prompts, greedy)]
    os.kill(pool.pids()[0], signal.SIGKILL)
    again = _generate(pool, prompts, greedy)
    assert pool.restarts == 2 and [c.version for c in again] == [8, 8]   # the LoRA test restarted it once
    assert [_tokens(c) for c in again] == served_before
    os.kill(pool.pids()[0], signal.SIGSTOP)   # alive, but it never answers
    with pytest.raises(EngineError, match=r"^vLLM server 0 \(pid \d+\) did not answer 'generate' within 30 s "
                                          r"\(--vllm_timeout\); its log: "):
        _generate(pool, prompts, greedy)
    os.kill(pool.pids()[0], signal.SIGKILL)
    with pytest.raises(EngineError, match=r"vLLM server 0 died .* used their 2 restarts \(--vllm_max_restarts\)"):
        _generate(pool, prompts, greedy)


def test_a_server_that_cannot_start_says_why(small_model, tmp_path):
    work = Path(tempfile.gettempdir())
    left_by_a_killed_run = work / "coati-vllm-999999999-abc"   # no such process id
    left_by_a_killed_run.mkdir(exist_ok=True)
    ours = set(work.glob(f"coati-vllm-{os.getpid()}-*"))   # the module's server
    with pytest.raises(EngineError, match="cannot start the vLLM server with /nonexistent/python"):
        VLLMPool(VLLMConfig(model=str(small_model), python="/nonexistent/python", log_dir=str(tmp_path)), 0, [1])
    with pytest.raises(EngineError, match=r"could not start: it exited with code 1 while starting \(.*\)"):
        VLLMPool(VLLMConfig(model=str(tmp_path / "no_model"), log_dir=str(tmp_path)), 0, [1])
    assert set(work.glob(f"coati-vllm-{os.getpid()}-*")) == ours and not left_by_a_killed_run.exists()


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
@pytest.mark.extended
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
@pytest.mark.extended
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


def test_a_judge_served_on_vllm_answers_as_the_hf_one(small_model, monkeypatch):
    """And, as a distillation teacher, scores the same prompt log-probs and top tokens, and tokenizes as the policy."""
    from transformers import AutoTokenizer

    from coati.experience.distillation import DistillConfig, ServedTeacher, check_served_vocabulary
    from coati.experience.experience import Experience
    from coati.inference.local_judge import JudgeServerConfig, LocalJudge
    from coati.rewards.judge import LLMJudge

    rubrics = ["What is 2 + 3? The answer is 5.", "A longer question about 7 - 4, answered with 3"]
    vocab = len(AutoTokenizer.from_pretrained(small_model))
    sequences = torch.randint(3, vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    answers, scored = {}, {}
    for engine in ("vllm", "hf"):
        local = LocalJudge(JudgeServerConfig(str(small_model), engine=engine, dtype="float32")).start()
        try:
            answers[engine] = [LLMJudge(local.url, token=local.token, api=api, max_tokens=6).answers(rubrics)[0]
                               for api in ("completions", "chat")]
            scored[engine] = Experience(sequences, torch.ones_like(sequences), torch.ones(3, 7, dtype=torch.bool), 5,
                                        None, torch.zeros(3), torch.zeros(3))
            ServedTeacher(local.url, DistillConfig(top_k=3), vocab, "judge", token=local.token).score(
                scored[engine], None)
            monkeypatch.setenv("COATI_TEACHER_TOKEN", local.token)
            assert check_served_vocabulary(local.url, "judge", AutoTokenizer.from_pretrained(small_model))
        finally:
            local.close()
    assert answers["vllm"] == answers["hf"]
    assert all(text for texts in answers["hf"] for text in texts)
    assert torch.allclose(scored["vllm"].teacher_log_probs, scored["hf"].teacher_log_probs, atol=1e-4)
    assert torch.allclose(scored["vllm"].teacher_top_logps, scored["hf"].teacher_top_logps, atol=1e-4)
    assert torch.equal(scored["vllm"].teacher_top_ids, scored["hf"].teacher_top_ids)
