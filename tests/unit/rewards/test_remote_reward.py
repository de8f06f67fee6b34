"""Rewards over HTTP: examples/reward_server.py serving a reward model gives the in-process model's rewards; it
requires its bearer token when it has one and will not listen beyond loopback without one; a slow one is timed out;
retries work. In GRPO, and a server that is down, under torchrun: e2e/test_remote_reward_e2e.py."""
import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from conftest import REPO, REWARD_SERVER as SERVER, REWARD_SERVER_TOKEN as TOKEN, child_env
from coati.rewards import RewardFunctionError, WeightedReward
from coati.rewards.remote import TOKEN_ENV, RemoteReward, RemoteRewardError


def _rollout(tiny_assets):
    """The tiny policy's sampled completions to a batch of its prompts, as rollout samples."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.dataset.collators import PromptCollator
    from coati.dataset.prepare import load_prepared
    from coati.experience.scorer import Scorer
    from coati.models.generation import HFEngine
    from coati.config import SamplingConfig
    from coati.rollout import LocalPool, RLVRWorkflow
    from coati.dataset.collators import prompt_rows
    from coati.rollout.evaluation import complete

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    policy = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    rows = load_prepared([str(tiny_assets["prompt_eval"])], "prompt")
    batch = PromptCollator(tokenizer.pad_token_id)([rows[i] for i in range(6)])
    sampling = SamplingConfig(max_new_tokens=12)
    pool = LocalPool(HFEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
    torch.manual_seed(0)
    trajectories = complete(pool, RLVRWorkflow(Scorer(tokenizer), sampling, 1), prompt_rows(batch), sampling)
    return tokenizer, [s for t in trajectories for s in t.samples]


def test_served_rewards_equal_the_in_process_reward_model(tiny_assets, reward_model_dir, served, monkeypatch):
    from coati.experience.scorer import Scorer
    from coati.models.reward_model import load_reward_model

    url, _ = served
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    tokenizer, samples = _rollout(tiny_assets)
    model = load_reward_model(str(reward_model_dir), tokenizer.pad_token_id).eval()
    texts = [s.prompt for s in samples], [s.completion for s in samples]
    local, _ = Scorer(tokenizer, reward_model=model).score_texts(*texts, {}, samples)
    remote, components = Scorer(tokenizer, WeightedReward.from_specs([url])).score_texts(*texts, {}, samples)
    assert remote == pytest.approx(local, abs=1e-5)
    assert components["reward_server"] == remote
    assert len(set(round(r, 4) for r in remote)) > 1   # real, distinct scores


@pytest.mark.parametrize("token", [None, "wrong"], ids=["no_token", "wrong_token"])
def test_a_request_without_the_servers_token_is_refused_in_one_line(served, token, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    url, _ = served
    with pytest.raises(RemoteRewardError, match=rf"refused the request \(HTTP 401: .*\); it requires its token: set "
                                                rf"{TOKEN_ENV} to it"):
        RemoteReward(url, retries=2, backoff_s=0.05, token=token)(["p"], ["c"])


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_the_server_will_not_listen_beyond_loopback_without_a_token(reward_model_dir, host):
    env = {k: v for k, v in child_env().items() if k != TOKEN_ENV}
    done = subprocess.run([sys.executable, str(SERVER), "--model", str(reward_model_dir), "--host", host],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: --host {host} listens beyond loopback without a token: give one (--token, or "
                                   f"{TOKEN_ENV}), or pass --allow_unauthenticated")


def test_the_server_refuses_a_vision_language_reward_model_in_one_line(vision_assets):
    """Requests carry token ids only: a reward model that reads images would score their placeholders as text."""
    model = vision_assets["qwen2_5_vl"]
    done = subprocess.run([sys.executable, str(SERVER), "--model", str(model)], capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: --model {model} is a vision-language reward model: requests carry token "
                                   "ids, not the images it reads; give it to the trainer as --rm_pretrain instead")


class _Handler(BaseHTTPRequestHandler):
    """Answers as the class attributes say: `delay_s` first, then `statuses` in turn (the last one repeats), with
    `extra` added to a 200 answer."""
    delay_s, statuses, seen, extra, authorization = 0.0, [200], [], {}, []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        type(self).authorization.append(self.headers.get("Authorization"))
        time.sleep(self.delay_s)
        status = self.statuses[min(len(self.seen) - 1, len(self.statuses) - 1)]
        data = json.dumps({"rewards": [len(c) for c in body["completions"]], **self.extra} if status == 200
                          else {"error": "no"})
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *_):
        pass


@pytest.fixture
def fake_server():
    _Handler.delay_s, _Handler.statuses, _Handler.seen, _Handler.extra, _Handler.authorization = 0.0, [200], [], {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score"
    server.shutdown()
    server.server_close()


def test_the_token_in_the_environment_is_sent_and_none_without_it(fake_server, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    RemoteReward(fake_server, retries=0)(["p"], ["c"])
    monkeypatch.delenv(TOKEN_ENV)
    RemoteReward(fake_server, retries=0)(["p"], ["c"])
    assert _Handler.authorization == ["Bearer from-env", None]
    assert "from-env" not in repr(RemoteReward(fake_server, token="from-env"))


def test_a_slow_server_is_timed_out(fake_server):
    _Handler.delay_s = 3.0
    started = time.monotonic()
    with pytest.raises(RemoteRewardError, match=r"did not answer after 2 attempts .* \(timed out after 0.5 s\)"):
        RemoteReward(fake_server, timeout_s=0.5, retries=1, backoff_s=0.1)(["p"], ["c"])
    assert time.monotonic() - started < 2.5


def test_failed_requests_are_retried_and_refusals_are_not(fake_server):
    _Handler.statuses = [503, 503, 200]
    out = RemoteReward(fake_server, retries=2, backoff_s=0.05)(["p", "q"], ["ab", "abc"], gt_answer=["1", "2"], n=[3, 4])
    assert out.values == [2, 3] and len(_Handler.seen) == 3
    assert _Handler.seen[0]["labels"] == ["1", "2"] and _Handler.seen[0]["fields"]["n"] == [3, 4]
    assert _Handler.seen[0]["query"] == ["pab", "qabc"]
    _Handler.statuses, _Handler.seen = [400], []
    with pytest.raises(RemoteRewardError, match="refused the request"):
        RemoteReward(fake_server, retries=3, backoff_s=0.05)(["p"], ["c"])
    assert len(_Handler.seen) == 1


@pytest.mark.parametrize("diagnostics", ["all fine", ["a", "b"], {"pass_rate": "high"}, {"pass_rate": [1.0]}])
def test_malformed_diagnostics_end_the_run_in_one_line(fake_server, diagnostics):
    _Handler.extra = {"diagnostics": diagnostics}
    reward = WeightedReward.from_specs([fake_server], builtins={fake_server: RemoteReward(fake_server, retries=0)})
    with pytest.raises(RewardFunctionError, match=f"reward function {re.escape(fake_server)}"):
        reward(["p", "q"], ["ab", "abc"])


def test_reward_specs_with_urls():
    reward = WeightedReward.from_specs(["math_answer", "http://a:1/score?x=1", "http://b:2/score=0.5"])
    assert [(label, weight) for label, _, weight in reward.parts] == [
        ("math_answer", 1.0), ("reward_server", 1.0), ("reward_server_2", 0.5)]
    assert [fn.url for _, fn, _ in reward.parts[1:]] == ["http://a:1/score?x=1", "http://b:2/score"]
