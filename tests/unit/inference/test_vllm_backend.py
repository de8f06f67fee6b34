"""The vLLM rollout backend for real: servers run in vLLM's own environment (`make vllm-env`), nothing mocked.
Engine-level checks share one server (the training scripts on the backend: e2e/test_vllm_backend_e2e.py)."""
import asyncio
import dataclasses
import os
import signal
import tempfile
from pathlib import Path

import pytest
import torch

from conftest import completion_tokens as _tokens
from coati.inference.vllm import EngineError, VLLMConfig, VLLMPool
from coati.models.generation import HFEngine
from coati.config import SamplingConfig
from coati.rollout.pool import generate_requests

pytestmark = [pytest.mark.extended, pytest.mark.usefixtures("vllm_environment")]


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


@pytest.fixture(scope="module")
def served(small_model, tmp_path_factory):
    """One server on the small model (serving LoRA adapters too), with the same model in this process for
    reference."""
    from transformers import AutoModelForCausalLM

    tokenizer = _tokenizer(small_model)
    logs = tmp_path_factory.mktemp("vllm_logs")
    pool = VLLMPool(VLLMConfig(model=str(small_model), log_dir=str(logs), threads=1, max_restarts=2, timeout_s=30,
                               enforce_eager=True, max_lora_rank=4), [tokenizer.eos_token_id])
    model = AutoModelForCausalLM.from_pretrained(small_model).eval()
    yield pool, model, tokenizer, logs
    pool.shutdown()


def test_greedy_is_deterministic_and_matches_the_hf_engine(served, tiny_assets):
    pool, model, tokenizer, logs = served
    prompts = _prompts(tiny_assets)
    greedy = SamplingConfig(max_new_tokens=12, do_sample=False)
    first, again = _generate(pool, prompts, greedy), _generate(pool, prompts, greedy)
    reference = _hf_greedy(model, tokenizer, prompts, greedy)
    for ours, repeat, theirs in zip(first, again, reference):
        assert ours.version == 0 and _tokens(ours) == _tokens(repeat) == _tokens(theirs)
        assert torch.allclose(torch.tensor(ours.rows[0].logprobs), torch.tensor(theirs.rows[0].logprobs), atol=1e-4)
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
        assert len(completions.rows) == 4
        for row in range(4):
            tokens = _tokens(completions, row)
            assert 1 <= len(tokens) <= 6 and stop not in tokens[:-1]
            assert tokens[-1] == stop or len(tokens) == 6
            logprobs = completions.rows[row].logprobs
            assert len(logprobs) == len(tokens) and max(logprobs) <= 0


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
    from coati.rollout import LocalPool
    from coati.rollout.workflow import RLVRWorkflow

    pool, model, tokenizer, _ = served
    rows = [{"input_ids": list(r["input_ids"]), "gt_answer": r["gt_answer"]}
            for r in load_prepared([str(tiny_assets["prompt_eval"])], "prompt").select(range(6))]
    workflow = RLVRWorkflow(Scorer(tokenizer, WeightedReward.from_specs(["math_answer", "answer_format"])),
                            SamplingConfig(max_new_tokens=10), 1)
    greedy = SamplingConfig(max_new_tokens=10, do_sample=False)
    on_engine = complete(pool, workflow, rows, greedy)
    on_model = complete(LocalPool(HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id])), workflow, rows,
                        greedy)
    for engine_side, model_side in zip(on_engine, on_model):
        assert [s.completion_ids for s in engine_side.samples] == [s.completion_ids for s in model_side.samples]
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
                    [tokenizer.eos_token_id])
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
        VLLMPool(VLLMConfig(model=str(small_model), python="/nonexistent/python", log_dir=str(tmp_path)), [1])
    with pytest.raises(EngineError, match=r"could not start: it exited with code 1 while starting \(.*\)"):
        VLLMPool(VLLMConfig(model=str(tmp_path / "no_model"), log_dir=str(tmp_path)), [1])
    assert set(work.glob(f"coati-vllm-{os.getpid()}-*")) == ours and not left_by_a_killed_run.exists()


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
            padded = Experience(sequences, torch.ones_like(sequences), torch.ones(3, 7, dtype=torch.bool), 5, None,
                                torch.zeros(3), torch.zeros(3))
            scored[engine] = dataclasses.replace(padded, **ServedTeacher(
                local.url, DistillConfig(top_k=3), vocab, "judge", token=local.token).scores(padded, None))
            monkeypatch.setenv("COATI_TEACHER_TOKEN", local.token)
            assert check_served_vocabulary(local.url, "judge", AutoTokenizer.from_pretrained(small_model))
        finally:
            local.close()
    assert answers["vllm"] == answers["hf"]
    assert all(text for texts in answers["hf"] for text in texts)
    assert torch.allclose(scored["vllm"].teacher_log_probs, scored["hf"].teacher_log_probs, atol=1e-4)
    assert torch.allclose(scored["vllm"].teacher_top_logps, scored["hf"].teacher_top_logps, atol=1e-4)
    assert torch.equal(scored["vllm"].teacher_top_ids, scored["hf"].teacher_top_ids)
