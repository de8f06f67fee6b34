"""The LLM judge reward under torchrun: GRPO with a judge behind a URL or served by coati on every rank, and its bad
inputs in one line."""
import json
import re

from conftest import SCRIPTS, torchrun


def _grpo_with_judge(tiny_assets, out, *judge, **env):
    return torchrun(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(tiny_assets["model"]), "--prompt_dataset",
                    str(tiny_assets["prompt_train"]), "--plugin", "ddp", "--batch_size", "2", "--num_generations", "3",
                    "--max_new_tokens", "8", "--num_episodes", "2", "--sample_log_interval", "1",
                    "--log_dir", str(out / "logs"), "--reward_fn", "judge", *judge, **env)


def test_grpo_trains_with_a_judge_behind_a_url(tiny_assets, endpoint, tmp_path):
    grader, url = endpoint(token="judge-token")
    result = _grpo_with_judge(tiny_assets, tmp_path, "--judge_url", url, "--judge_api", "completions",
                              "--judge_batch_size", "4", COATI_JUDGE_TOKEN="judge-token")
    assert result.returncode == 0, result.stderr[-3000:]
    asked = [rubric for request in grader.requests for rubric in request["prompt"]]
    assert len(asked) == len(set(asked)) and len(grader.requests) >= 2 * 2 * 2   # episodes x ranks x >= 2 batches
    assert all(len(request["prompt"]) <= 4 for request in grader.requests)
    metrics = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "train/rewards/judge/mean" in m]
    assert len(trained) == 2 and all(m["train/rewards/judge/parsed/mean"] == 1.0 for m in trained)
    table = json.loads(sorted((tmp_path / "logs").rglob("*_step_*.json"))[-1].read_text())
    column = table["columns"].index("judge/answer")
    assert {row[column] for row in table["data"]} <= {"Score: 0", "Score: 10"}


def test_grpo_serves_its_own_judge_per_rank_and_unparseable_verdicts_end_in_one_line(tiny_assets, tmp_path):
    result = _grpo_with_judge(tiny_assets, tmp_path, "--judge_model", str(tiny_assets["model"]), "--judge_parser",
                              "verdict", "--judge_max_tokens", "6")
    assert result.returncode != 0
    assert sorted(p.name for p in (tmp_path / "logs").glob("judge_rank*.log")) == ["judge_rank0.log", "judge_rank1.log"]
    assert "serving judge" in (tmp_path / "logs" / "judge_rank1.log").read_text()
    errors = {line for line in result.stderr.splitlines() if line.startswith("error: ")}
    assert len(errors) == 1 and re.fullmatch(r"error: judge http://127\.0\.0\.1:\d+/v1: none of the 6 answers could be "
                                             r"parsed as a verdict \(--judge_parser\); the first was .*", errors.pop())
    assert re.search(r"exitcode\s*: 2", result.stderr), result.stderr[-3000:]
