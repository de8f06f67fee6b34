"""The asynchronous rollout side with real Ray generator actors holding the tiny model: the executor's
concurrency and staleness bounds (checked on what it recorded), batch sizes, weight updates during a
rollout, stale trajectories dropped, generators killed, and the packing of trajectories into experience."""
import os
import signal

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM

from coati.experience.experience import stack_trajectories
from coati.experience.scorer import Scorer
from coati.models.generation import HFEngine
from coati.config import SamplingConfig
from coati.rewards import WeightedReward
from coati.rollout import (GeneratorError, GeneratorPool, LocalPool, PromptStream, RLVRWorkflow, RolloutSample,
                           WorkflowExecutor, run_episodes, scored)
from conftest import REPO, completion_tokens as _tokens

GENERATIONS = 4
SAMPLING = SamplingConfig(max_new_tokens=8)


@pytest.fixture(scope="module")
def pool(tiny_assets, tokenizer):
    generators = GeneratorPool(str(tiny_assets["model"]), tokenizer.pad_token_id, [tokenizer.eos_token_id],
                               num_generators=2, max_restarts=1)
    yield generators
    generators.shutdown()
    import ray

    ray.shutdown()   # the rest of the suite runs without Ray's background processes


@pytest.fixture(scope="module")
def prompts(tiny_assets):
    return load_from_disk(str(tiny_assets["prompt_train"]))


def _workflow(tokenizer) -> RLVRWorkflow:
    return RLVRWorkflow(Scorer(tokenizer, WeightedReward.from_specs(["math_answer", "answer_format"])), SAMPLING, GENERATIONS)


def _perturbed(pool_model_dir, scale: float):
    """The tiny model's weights, shifted so that each published version differs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pool_model_dir)
    return {k: v + scale for k, v in model.state_dict().items()}


def test_executor_keeps_its_concurrency_and_staleness_bounds(pool, tokenizer, prompts, tiny_assets):
    batch, concurrency, staleness = 4, 3, 1
    executor = WorkflowExecutor(pool, _workflow(tokenizer), batch, concurrency, staleness)
    stream = PromptStream(prompts, seed=0)
    try:
        for version in range(6):
            trajectories = executor.prepare_batch(stream.next)
            assert len(trajectories) == batch
            for t in trajectories:
                assert version - t.version <= staleness
                assert len(t) == GENERATIONS and t.rewards.shape == (GENERATIONS,)
            pool.publish(_perturbed(tiny_assets["model"], 1e-4 * (version + 1)), version + 1)
            executor.set_version(version + 1)
    finally:
        executor.shutdown()
    events = list(executor.events)
    starts = [e for e in events if e.kind == "start"]
    assert starts and all(e.in_flight <= concurrency for e in starts)
    assert all(e.accepted <= (staleness + e.trainer_version + 1) * batch for e in starts)
    taken = [e for e in events if e.kind == "take"]
    assert len(taken) == 6 * batch
    assert all(e.trainer_version - e.generated_by <= staleness for e in taken)
    assert {e.generated_by for e in taken} > {0}   # later batches came from published weights
    assert max(e.in_flight for e in starts) == concurrency   # the bound was reached, not just respected


def test_rollout_batch_runs_exactly_the_given_samples(pool, tokenizer, prompts):
    workflow = _workflow(tokenizer)
    executor = WorkflowExecutor(pool, workflow, batch_size=1, max_concurrent_rollouts=2, max_staleness=0)
    try:
        rows = [prompts[i] for i in range(5)]
        trajectories = executor.rollout_batch(rows)
    finally:
        executor.shutdown()
    assert len(trajectories) == 5
    for row, t in zip(rows, trajectories):
        assert [s.prompt_ids for s in t.samples] == [list(row["input_ids"])] * GENERATIONS
        expected, _ = workflow.scorer.reward_fn(t.prompts, t.completions, gt_answer=[row["gt_answer"]] * GENERATIONS)
        assert t.rewards.tolist() == pytest.approx(expected)


def test_a_rollout_in_flight_during_an_update_finishes_on_its_weights(pool, tokenizer, prompts, tiny_assets):
    import ray

    actor = pool.actors[0]
    prompt = list(prompts[0]["input_ids"])
    before = actor.generate.remote(prompt, SamplingConfig(max_new_tokens=48), 8)
    loaded = pool.publish(_perturbed(tiny_assets["model"], 0.0), 41)
    after = actor.generate.remote(prompt, SAMPLING, 2)
    assert ray.get(before).version < 41 and ray.get(after).version == 41
    assert len(loaded.result(timeout=120)) == len(pool.actors)   # the publish's future: every actor has loaded


def test_a_publish_future_completes_when_every_copy_has_loaded():
    from concurrent.futures import CancelledError, Future

    from coati.rollout import all_of

    local = LocalPool(engine=None)
    assert local.publish({}, 3).result(timeout=0) is None and local.version == 3   # the trainer's own weights
    first, second = Future(), Future()
    both = all_of([first, second])
    second.set_result("b")
    assert not both.done()
    first.set_result("a")
    assert both.result(timeout=0) == ["a", "b"]
    failing = [Future(), Future()]
    combined = all_of(failing)
    failing[0].set_exception(RuntimeError("server 0 died"))
    failing[1].set_result("ok")
    with pytest.raises(RuntimeError, match="server 0 died"):
        combined.result(timeout=0)
    queued = [Future(), Future()]   # a pool shut down with a load queued cancels it
    combined = all_of(queued)
    queued[0].set_result("ok")
    assert queued[1].cancel() and queued[1].set_running_or_notify_cancel() is False
    with pytest.raises(CancelledError):
        combined.result(timeout=0)


def test_a_trajectory_too_stale_when_taken_is_dropped(pool, tokenizer, prompts, tiny_assets):
    executor = WorkflowExecutor(pool, _workflow(tokenizer), batch_size=2, max_concurrent_rollouts=4, max_staleness=1)
    stream = PromptStream(prompts, seed=1)
    try:
        pool.publish(_perturbed(tiny_assets["model"], 0.0), 50)
        executor.set_version(50)
        first = executor.prepare_batch(stream.next)          # returns 2; at least 2 more were started
        pool.publish(_perturbed(tiny_assets["model"], 0.0), 52)
        executor.set_version(52)                             # two updates later those are too old
        second = executor.prepare_batch(stream.next)
        pending = [sample.prompt_id for sample in executor.pending_samples()]
    finally:
        executor.shutdown()
    same_order = PromptStream(prompts, seed=1)
    handed_out = [same_order.next().prompt_id for _ in range(stream.index)]
    trained = [t.prompt_id for t in first + second]
    assert sorted(trained + pending) == sorted(handed_out)   # a dropped prompt is not lost: it runs again
    assert all(t.version == 50 for t in first) and all(t.version == 52 for t in second)
    drops = [e for e in executor.events if e.kind == "drop"]
    assert executor.dropped == len(drops) >= 2 and all(e.generated_by == 50 for e in drops)
    stale_on_arrival = {e.rollout for e in executor.events
                        if e.kind == "finish" and e.trainer_version == 52 and e.generated_by == 50}
    assert stale_on_arrival <= {e.rollout for e in drops}


def test_a_killed_generator_is_replaced_and_the_rollout_retried(tiny_assets, tokenizer, prompts):
    one = GeneratorPool(str(tiny_assets["model"]), tokenizer.pad_token_id, [tokenizer.eos_token_id], 1, max_restarts=1)
    executor = WorkflowExecutor(one, _workflow(tokenizer), batch_size=1, max_concurrent_rollouts=1, max_staleness=0)
    try:
        one.publish(_perturbed(tiny_assets["model"], 0.0), 7)
        os.kill(one.pids()[0], signal.SIGKILL)
        trajectories = executor.rollout_batch([prompts[0], prompts[1]])
        assert len(trajectories) == 2 and one.restarts == 1
        assert all(t.version == 7 for t in trajectories)   # the new actor got the newest weights
        os.kill(one.pids()[0], signal.SIGKILL)
        with pytest.raises(GeneratorError, match="used its 1 restarts .*--generator_max_restarts"):
            executor.rollout_batch([prompts[2]])
    finally:
        executor.shutdown()
        one.shutdown()


def test_generators_run_at_normal_cpu_priority(pool):
    """Ray nices its workers by 15; a generator sharing cores with the trainer would then starve."""
    assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pool.pids()] == [0, 0]


def test_stack_trajectories_left_pads_prompts_and_aligns_completions():
    def trajectory(prompt, completions, version):
        return scored([RolloutSample(prompt, c, [True] * len(c), [-0.5] * len(c), [version] * len(c)) for c in completions],
                      ["p"] * len(completions), ["c"] * len(completions),
                      ([1.0] * len(completions), {"math_answer": [1.0] * len(completions)}), version)

    out = stack_trajectories(
        [trajectory([5, 6, 7], [[8], [9, 10]], 0), trajectory([11], [[12, 13, 14], [15]], 1)], torch.device("cpu"))
    assert out.prompt_length == 3
    assert out.sequences.tolist() == [[5, 6, 7, 8, 0, 0], [5, 6, 7, 9, 10, 0], [0, 0, 11, 12, 13, 14],
                                      [0, 0, 11, 15, 0, 0]]
    assert out.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1],
                                           [0, 0, 1, 1, 0, 0]]
    assert out.action_mask.sum(-1).tolist() == [1, 2, 3, 1]
    assert out.behaviour_log_probs.sum().item() == pytest.approx(-0.5 * 7)
    assert out.rewards.tolist() == [1.0] * 4 and out.reward_components["math_answer"] == [1.0] * 4
    assert out.versions.tolist() == [0, 0, 1, 1] and out.prompts == ["p"] * 4


@pytest.mark.parametrize("engine", ["generators", "local"])
def test_the_example_two_turn_workflow_masks_the_follow_up_question(engine, request, tokenizer, prompts, tiny_assets,
                                                                    monkeypatch):
    """The same workflow on Ray generators (asynchronous) and on the training model in-process (synchronous)."""
    monkeypatch.syspath_prepend(str(REPO / "examples" / "rollout_workflows"))
    from self_check_workflow import SelfCheckWorkflow

    workflow = SelfCheckWorkflow(tokenizer, SAMPLING, GENERATIONS)
    if engine == "local":
        model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
        local = LocalPool(HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
        trajectory, = run_episodes(workflow, local, [prompts[0]])
        assert all(s.logprobs is None for s in trajectory.samples) and local.seconds > 0
    else:
        executor = WorkflowExecutor(request.getfixturevalue("pool"), workflow, batch_size=1, max_concurrent_rollouts=2,
                                    max_staleness=0)
        try:
            trajectory, = executor.rollout_batch([prompts[0]])
        finally:
            executor.shutdown()
    follow_up = workflow.follow_up
    packed = stack_trajectories([trajectory], torch.device("cpu"))
    spans = packed.attention_mask[:, packed.prompt_length:]
    for i, s in enumerate(trajectory.samples):
        tokens, mask = s.completion_ids, torch.tensor(s.completion_mask)
        masked = (~mask).nonzero().flatten().tolist()
        start = next(j for j in range(len(tokens)) if tokens[j:j + len(follow_up)] == follow_up)
        assert masked[:len(follow_up)] == list(range(start, start + len(follow_up)))   # the question is not trained on
        assert mask[:start].all() and mask[start + len(follow_up):].any()                # both answers are
        assert spans[i, :start + len(follow_up) + 1].all()                               # and attended to throughout


def test_a_request_cancelled_before_its_dispatch_began_does_not_block_later_ones(pool, prompts):
    """An executor shut down right after queuing a request cancels the pool's dispatcher task before that
    task has run a step; the pool must still dispatch what is queued afterwards (from any event loop)."""
    import asyncio

    prompt = list(prompts[0]["input_ids"])

    async def queue_then_cancel():
        request = asyncio.ensure_future(pool.agenerate(prompt, SAMPLING, 1))
        await asyncio.sleep(0)   # the request is queued and its dispatcher created, not yet started
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        return request.cancelled()

    async def one_per_generator():
        return await asyncio.gather(*(pool.agenerate(prompt, SAMPLING, 2) for _ in pool.actors))

    assert asyncio.run(queue_then_cancel())
    done = asyncio.run(asyncio.wait_for(one_per_generator(), timeout=120))
    assert [len(c.rows) for c in done] == [2] * len(pool.actors)


def test_the_prompt_stream_resumes_after_the_prompts_pending_at_its_checkpoint():
    rows = [{"input_ids": [i], "gt_answer": str(i)} for i in range(5)]
    stream = PromptStream(rows, seed=3)
    drawn = [stream.next() for _ in range(7)]                   # a pass of 5, then 2 of the next
    assert [r.prompt_id[0] for r in drawn] == [0] * 5 + [1] * 2
    assert sorted(r.prompt_id[1] for r in drawn[:5]) == list(range(5))
    assert all(dict(r) == rows[r.prompt_id[1]] for r in drawn)   # the id is not a column a reward would get
    resumed = PromptStream(rows, seed=3)
    resumed.restore(stream.state())
    resumed.replay([list(drawn[3].prompt_id), list(drawn[6].prompt_id)])   # as a checkpoint's JSON holds them
    assert [resumed.next().prompt_id for _ in range(3)] == [drawn[3].prompt_id, drawn[6].prompt_id,
                                                            stream.next().prompt_id]


def test_partial_rollouts_continue_a_completion_on_the_weights_published_meanwhile(pool, tokenizer, prompts,
                                                                                    tiny_assets):
    """With `chunk_tokens`, a completion is generated a chunk at a time: without an update it is the same greedy
    completion (and log-probs) as in one piece; with an update published while its first chunk runs, the rest is
    generated on the new weights, each token tagged with its version, and equals the new weights' own greedy
    continuation of the first chunk."""
    import asyncio
    from dataclasses import replace

    from coati.rollout.pool import generate_requests

    greedy, chunk = SamplingConfig(max_new_tokens=8, do_sample=False), 3
    prompt = list(prompts[0]["input_ids"])
    old, new = _perturbed(tiny_assets["model"], 0.0), _perturbed(tiny_assets["model"], 0.02)

    async def update_after_the_first_chunk_is_sent():
        task = asyncio.ensure_future(pool.agenerate(prompt, greedy, 1, session="partial"))
        for _ in range(3):   # the request is queued, then its dispatcher sends the first chunk to the generator
            await asyncio.sleep(0)
        loaded = pool.publish(new, 61)   # each generator loads it after what it already holds
        return await task, loaded

    pool.publish(old, 60).result(timeout=120)
    whole = asyncio.run(pool.agenerate(prompt, greedy, 1, session="partial"))
    pool.chunk_tokens = chunk
    try:
        chunked = asyncio.run(pool.agenerate(prompt, greedy, 1, session="partial"))
        updated, loaded = asyncio.run(update_after_the_first_chunk_is_sent())
        loaded.result(timeout=120)
    finally:
        pool.chunk_tokens = 0
    assert len(_tokens(whole)) > chunk
    assert _tokens(chunked) == _tokens(whole) and set(chunked.rows[0].versions) == {60}
    assert torch.allclose(torch.tensor(chunked.rows[0].logprobs), torch.tensor(whole.rows[0].logprobs), atol=1e-5)
    tokens, versions = _tokens(updated), updated.rows[0].versions
    assert tokens[:chunk] == _tokens(whole)[:chunk] and versions == [60] * chunk + [61] * (len(tokens) - chunk)
    assert updated.version == 60   # a completion's version is its oldest tokens'

    def continued(weights):
        model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
        model.load_state_dict(weights)
        engine = HFEngine(model.eval(), tokenizer.pad_token_id, [tokenizer.eos_token_id])
        out = generate_requests(engine, [(prompt + tokens[:chunk], 1)], replace(greedy, max_new_tokens=8 - chunk), 0)[0]
        return _tokens(out)

    assert tokens[chunk:] == continued(new) != continued(old)
