"""Rewards over HTTP under torchrun: GRPO trains on examples/reward_server.py serving a reward model, and a server that
is down ends the run with one line and exit status 2."""
import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, REWARD_SERVER_TOKEN as TOKEN, SCRIPTS, child_env, torchrun
from coati.rewards.remote import TOKEN_ENV


def test_grpo_trains_on_a_served_reward_model(tiny_assets, reward_model_dir, served, tmp_path):
    from transformers import AutoTokenizer

    from coati.models.reward_model import load_reward_model, sequence_rewards

    url, log = served
    log.write_text("")
    result = torchrun(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(tiny_assets["model"]), "--prompt_dataset",
                      str(tiny_assets["prompt_train"]), "--plugin", "ddp", "--batch_size", "2", "--num_generations",
                      "4", "--max_new_tokens", "8", "--num_episodes", "2", "--reward_fn", url, "answer_format=0.5",
                      "--log_dir", str(tmp_path / "logs"), "--save_dir", str(tmp_path / "ckpt"), **{TOKEN_ENV: TOKEN})
    assert result.returncode == 0, result.stderr[-3000:]
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(requests) == 2 * 2 * 2 * 4   # episodes x ranks x prompts per rank x completions
    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    model = load_reward_model(str(reward_model_dir), tokenizer.pad_token_id).eval()
    for record in requests[:8]:
        ids = torch.tensor([record["input_ids"]])
        with torch.no_grad():
            assert sequence_rewards(model, ids, torch.ones_like(ids)).item() == pytest.approx(record["reward"], abs=1e-5)
    metrics = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert all("train/rewards/reward_server/mean" in m for m in metrics if "train/loss" in m)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_that_is_down_ends_the_run_with_one_line_and_status_2(tiny_assets, tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/score"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPTS / "train_grpo.py"),
         "--pretrain", str(tiny_assets["model"]), "--prompt_dataset", str(tiny_assets["prompt_train"]), "--plugin", "ddp",
         "--batch_size", "2", "--num_generations", "2", "--max_new_tokens", "4", "--num_episodes", "1",
         "--reward_fn", url, "--reward_server_retries", "1", "--log_dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
    assert result.returncode != 0
    assert not re.search(r'File ".*/(coati|examples)/', result.stderr), result.stderr[-3000:]   # torchrun's own report follows
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and re.fullmatch(
        rf"error: reward server {re.escape(url)} did not answer after 2 attempts in \d+ s \(Connection refused\); "
        r"is it running\? Start one with examples/reward_server.py, or check the URL", lines[0]), lines
    assert re.search(r"exitcode\s*: 2", result.stderr), result.stderr[-3000:]
