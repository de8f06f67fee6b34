"""The LLM judge reward: parsing scores and verdicts, rubrics, batching, the concurrency cap, retries, the cache and
timeouts against a local OpenAI-compatible endpoint; coati's own judge server (loopback, token, batched answers equal
single ones, gone with a killed trainer). GRPO with a judge under torchrun: e2e/test_judge_e2e.py."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, child_env
from coati.rewards import WeightedReward
from coati.rewards.judge import DEFAULT_RUBRIC, JudgeError, LLMJudge, check_rubric, parse_score, parse_verdict
from coati.rewards.registry import table_columns
from coati.rewards.remote import RemoteRewardError

QUESTIONS = ["What is 2 + 3?", "What is 7 - 4?", "What is 6 * 2?"]
ANSWERS = ["2 + 3 = 5, so 5.", "It is 4.", "12"]
REFERENCES = ["5", "3", "12"]


@pytest.mark.parametrize("answer, expected", [
    ("The response is right.\nScore: 7", 0.7), ("Score: 3/4", 0.75), ("score of 12", 1.0), ("Score: -2", 0.0),
    ("I'd give 4 first... Final score: 9.5", 0.95), ("8", 0.8), (" 6/10 ", 0.6), ("**Score**: 5", 0.5),
    ("no number here", None), ("Scored well, 7 points", None)])
def test_score_parser(answer, expected):
    assert parse_score(answer, 10.0) == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("answer, expected", [
    ("Verdict: correct", 1.0), ("Verdict: INCORRECT", 0.0), ("The answer looks right, but it is wrong.", 0.0),
    ("Yes", 1.0), ("Verdict: pass (the response is wrong at first but fixes it)", 1.0), ("maybe", None)])
def test_verdict_parser(answer, expected):
    assert parse_verdict(answer) == expected


def test_rubrics_are_checked_in_one_line():
    assert check_rubric(DEFAULT_RUBRIC) == DEFAULT_RUBRIC
    for rubric, message in (("Grade {answer}: {completion}", r"unknown field\(s\) \{answer\}"),
                            ("Grade the task {prompt}", r"never shows the judge the completion"),
                            ("{completion} {", "not a valid template")):
        with pytest.raises(JudgeError, match=message):
            check_rubric(rubric)


def _judge(url, **options):
    return LLMJudge(url, backoff_s=0.01, **options)


@pytest.mark.parametrize("api, requests", [("chat", 3), ("completions", 2)])
def test_scores_come_from_the_judges_answers_and_raw_answers_go_to_the_sample_table(endpoint, api, requests):
    grader, url = endpoint()
    reward = WeightedReward.from_specs(["judge"], builtins={"judge": _judge(url, api=api, batch_size=2)})
    total, components = reward(QUESTIONS, ANSWERS, gt_answer=REFERENCES)
    assert total == [1.0, 0.0, 1.0]
    assert len(grader.requests) == requests
    assert components["judge/parsed"] == [1.0, 1.0, 1.0]
    assert table_columns(components, 1)["judge/answer"] == "Score: 0"
    rubrics = [r["messages"][0]["content"] if api == "chat" else r["prompt"][0] for r in grader.requests]
    assert DEFAULT_RUBRIC.format(prompt=QUESTIONS[0], completion=ANSWERS[0], reference=REFERENCES[0]) in rubrics
    assert grader.requests[0]["temperature"] == 0.0 and grader.requests[0]["model"] == "judge"


def test_completions_are_batched_and_requests_capped_at_the_concurrency(endpoint):
    grader, url = endpoint(delay_s=0.3)
    completions = [f"answer {i}" for i in range(10)]
    _judge(url, api="completions", batch_size=3, concurrency=2)(["q"] * 10, completions)
    assert sorted(len(r["prompt"]) for r in grader.requests) == [1, 3, 3, 3]
    assert grader.max_in_flight == 2
    grader, url = endpoint(delay_s=0.3)
    _judge(url, concurrency=3)(["q"] * 7, completions[:7])
    assert len(grader.requests) == 7 and grader.max_in_flight == 3


def test_identical_requests_are_asked_once(endpoint):
    grader, url = endpoint()
    judge = _judge(url, cache_size=4)
    first = judge(["q", "q", "r"], ["a", "a", "b"], gt_answer=["a", "a", "b"])
    assert len(grader.requests) == 2 and first.diagnostics["cached"] == [0.0, 0.0, 0.0]
    again = judge(["q", "s"], ["a", "c"], gt_answer=["a", "c"])
    assert len(grader.requests) == 3 and again.diagnostics["cached"] == [1.0, 0.0]
    assert list(again.values) == [1.0, 1.0]
    judge(["t1", "t2", "t3", "t4"], ["x"] * 4)   # past cache_size the oldest answers are forgotten
    judge(["q"], ["a"], gt_answer=["a"])
    assert len(grader.requests) == 8


def test_failed_requests_are_retried_with_backoff_then_end_in_one_line(endpoint):
    grader, url = endpoint(fail_first=2)
    assert list(_judge(url, retries=2)(["q"], ["5"], gt_answer=["5"]).values) == [1.0]
    assert len(grader.requests) == 3
    grader, url = endpoint(fail_first=5)
    with pytest.raises(RemoteRewardError, match=rf"judge {re.escape(url)} did not answer after 2 attempts in \d+ s "
                                                r"\(HTTP 503: .*\); is the judge running\?"):
        _judge(url, retries=1)(["q"], ["5"])


def test_a_slow_judge_is_timed_out(endpoint):
    _, url = endpoint(delay_s=2.0)
    started = time.monotonic()
    with pytest.raises(RemoteRewardError, match=r"\(timed out after 0.3 s\)"):
        _judge(url, timeout_s=0.3, retries=1)(["q"], ["a"])
    assert time.monotonic() - started < 1.8


def test_the_token_comes_from_the_environment_and_a_refusal_names_it(endpoint, monkeypatch):
    _, url = endpoint(token="s3cret")
    monkeypatch.delenv("COATI_JUDGE_TOKEN", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(RemoteRewardError, match="refused the request \\(HTTP 401.*set COATI_JUDGE_TOKEN or "
                                                "OPENAI_API_KEY to it"):
        _judge(url)(["q"], ["a"])
    monkeypatch.setenv("OPENAI_API_KEY", "s3cret")
    assert list(_judge(url)(["q"], ["a"], gt_answer=["a"]).values) == [1.0]


def test_a_call_none_of_whose_answers_parse_stops_in_one_line(endpoint):
    _, url = endpoint(answer="I cannot grade this.")
    with pytest.raises(JudgeError, match=r"none of the 2 answers could be parsed as a score \(--judge_parser\); the "
                                         r"first was 'I cannot grade this.'"):
        _judge(url)(["q", "r"], ["a", "b"])


def test_an_answer_that_does_not_parse_leaves_its_row_unscored(endpoint, monkeypatch):
    grader, url = endpoint()
    answers = iter(["Score: 8", "no idea", "Score: 2"])
    monkeypatch.setattr(grader, "grade", lambda rubric: next(answers))
    output = _judge(url, concurrency=1)(["q1", "q2", "q3"], ["a", "b", "c"])
    assert list(output.values) == [0.8, None, 0.2]
    assert output.diagnostics["parsed"] == [1.0, 0.0, 1.0]


def _get(url, token=None):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


def test_coati_serves_its_judge_on_loopback_with_a_token_and_batched_answers_equal_single_ones(tiny_assets):
    from coati.inference.local_judge import JudgeServerConfig, LocalJudge

    local = LocalJudge(JudgeServerConfig(str(tiny_assets["model"]))).start()
    try:
        assert local.url.startswith("http://127.0.0.1:") and local.url.endswith("/v1")
        assert _get(f"{local.url}/models")[0] == 401
        assert _get(f"{local.url}/models", "wrong")[0] == 401
        assert _get(f"{local.url}/models", local.token) == (200, {"object": "list", "data": [{"id": "judge",
                                                                                              "object": "model"}]})
        rubrics = ["What is 2 + 3? 5", "A much longer question about 7 - 4, answered with 3", "6 * 2 = 12"]
        batched = _judge(local.url, token=local.token, api="completions", batch_size=3, max_tokens=6)
        single = _judge(local.url, token=local.token, api="completions", batch_size=1, max_tokens=6, concurrency=1)
        assert batched.answers(rubrics)[0] == single.answers(rubrics)[0]
        assert all(isinstance(a, str) for a in _judge(local.url, token=local.token, max_tokens=4).answers(rubrics)[0])
    finally:
        local.close()
    assert not local.folder.exists()


def test_the_judge_server_asks_for_a_token_and_is_gone_with_a_killed_trainer(tiny_assets, tmp_path):
    env = {k: v for k, v in child_env().items() if k != "COATI_JUDGE_TOKEN"}
    refused = subprocess.run([sys.executable, "-m", "coati.inference.judge_server", "--model", str(tiny_assets["model"])],
                             capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        "error: set COATI_JUDGE_TOKEN to the token every request must carry, or pass --allow_unauthenticated")
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom coati.inference.local_judge import JudgeServerConfig, LocalJudge\n"
         f"j = LocalJudge(JudgeServerConfig({str(tiny_assets['model'])!r})).start()\n"
         "print(j.process.pid, j.folder, flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env=child_env(), cwd=REPO)
    pid, folder = trainer.stdout.readline().split()
    os.kill(int(pid), 0)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)):
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)
    assert not Path(folder).exists()


def _state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except OSError:
        return "Z"


def test_a_vllm_judge_sees_only_its_ranks_gpu():
    from coati.inference.local_judge import visible_device

    assert visible_device(None, "cuda:1") == "1"
    assert visible_device("4,5,6", "cuda:2") == "6"   # counted among the GPUs the trainer itself sees
