"""Multi-turn, tool-using GRPO under torchrun: the episodes logged and evaluated through the same workflow, and an
OpenAI-client agent (examples/agents) trained unchanged."""
import json
from pathlib import Path

import pytest

from conftest import AGENTS, HISTORY_REWRITING


def _episode_records(log_dir: Path, episodes: int):
    """Every logged record, and the `episodes` training ones, each of 1 to 3 turns that sampled tokens."""
    records = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/reward" in r]
    assert len(train) == episodes
    for record in train:
        assert 1 <= record["train/rollout/turns"] <= 3 and record["train/rollout/sampled_tokens"] > 0
    return records, train


@pytest.mark.slow
def test_multi_turn_grpo_under_torchrun_logs_the_episodes_and_evaluates_through_the_same_workflow(tiny_assets, tmp_path):
    """With a model whose own template rewrites history, fixed by `--chat_template` (the documented way out)."""
    import shutil

    from coati.models.tiny import CHAT_TEMPLATE
    from conftest import SCRIPTS, torchrun

    model = Path(shutil.copytree(tiny_assets["model"], tmp_path / "model"))
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": HISTORY_REWRITING}))
    (tmp_path / "appending.jinja").write_text(CHAT_TEMPLATE)
    result = torchrun(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(model), "--chat_template",
                      str(tmp_path / "appending.jinja"), "--prompt_dataset",
                      str(tiny_assets["prompt_train"]), "--eval_dataset", str(tiny_assets["prompt_eval"]),
                      "--batch_size", "2", "--num_generations", "2", "--max_new_tokens", "12", "--num_episodes", "2",
                      "--tools", "calculator", "python", "--max_turns", "3", "--max_total_tokens", "48",
                      "--reward_fn", "math_answer", "--eval_n_samples", "2", "--sample_log_interval", "1", "--log_dir",
                      str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr[-3000:]
    records, train = _episode_records(tmp_path / "logs", 2)
    for record in train:
        ended = sum(record[f"train/rollout/ended/{how}"] for how in ("answer", "max_turns", "max_total_tokens", "truncated"))
        assert ended == pytest.approx(1.0)
        assert {"train/rollout/tool_calls", "train/rollout/tool_errors/malformed", "train/rollout/environment_tokens",
                "train/rewards/environment/mean"} <= record.keys()
    assert sum("eval/reward" in r and "eval/reward/pass@2" in r for r in records) == 2   # before and after
    table = json.loads((tmp_path / "logs" / "rich_completions" / "completions_step_000001.json").read_text())
    assert table["data"][0][1][0]["role"] == "assistant"                                  # the conversation


@pytest.mark.slow
def test_grpo_trains_an_openai_client_agent_under_torchrun(tiny_assets, tmp_path):
    """The multi-turn guide's command (docs/guides/multi-turn.md): the example agent, unchanged, as every rollout and every held-out episode."""
    import subprocess

    from conftest import REPO, SCRIPTS, child_env, torchrun_cmd

    cmd = torchrun_cmd(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(tiny_assets["model"]), "--prompt_dataset",
                       str(tiny_assets["prompt_train"]), "--eval_dataset", str(tiny_assets["prompt_eval"]),
                       "--batch_size", "2", "--num_generations", "2", "--max_new_tokens", "12", "--num_episodes", "2",
                       "--reward_fn", "math_answer", "--agent", "calculator_agent:solve", "--eval_n_samples", "1",
                       "--sample_log_interval", "1", "--log_dir", str(tmp_path / "logs"))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                            env=child_env(PYTHONPATH=str(AGENTS)))
    assert result.returncode == 0, result.stderr[-3000:]
    records, train = _episode_records(tmp_path / "logs", 2)
    for record in train:
        ended = sum(record[f"train/rollout/ended/{how}"] for how in ("answer", "truncated", "agent_error", "agent_timeout"))
        assert ended == pytest.approx(1.0) and record["train/rollout/ended/agent_error"] == 0
        assert record["train/rollout/agent/restarts"] == 0
    assert sum("eval/reward" in r for r in records) == 2
