"""GRPO's metrics in a real train_grpo.py run under torchrun: its metrics.jsonl holds every published name on the
logging cadence."""
import json

import pytest

from coati.trainer.metric_names import PUBLISHED_GRPO as PUBLISHED
from conftest import REPO, SCRIPTS, torchrun


def _grpo(assets, out, *extra, output=None):
    result = torchrun(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(assets["model"]), "--prompt_dataset",
                      str(assets["prompt_train"]), "--plugin", "ddp", "--batch_size", "2", "--num_generations", "4",
                      "--max_new_tokens", "8", "--num_episodes", "5", "--lr", "1e-3", "--kl_coef", "0.05",
                      "--reward_fn", "math_answer", "answer_format", "--sample_log_interval", "2",
                      "--log_dir", str(out / "logs"), *extra)
    assert result.returncode == 0, result.stderr[-4000:]
    if output is not None:
        output.append(result.stdout + result.stderr)
    path = out / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_grpo_run_logs_every_published_name_on_its_cadence(tiny_assets, tmp_path):
    records = _grpo(tiny_assets, tmp_path, "--logging_steps", "2", "--logging_first_step")
    assert [r["step"] for r in records] == [1, 2, 4, 5]                   # first step, every 2nd, and the last
    for record in records:
        missing = [name for name in PUBLISHED if name not in record]
        assert not missing, missing
        for component in ("math_answer", "answer_format"):
            assert {f"train/rewards/{component}/{s}" for s in ("mean", "std", "p00", "p50", "p100")} <= record.keys()
        assert record["train/reward_p00"] <= record["train/reward_p50"] <= record["train/reward_p100"]
        assert record["train/clip_ratio/low_min"] <= record["train/clip_ratio/low_mean"]
        assert record["train/clip_ratio/high_mean"] <= record["train/clip_ratio/high_max"]
        assert record["train/beta"] == record["train/kl_coeff"] == 0.05
        assert 0 <= record["train/completions/diversity/jaccard"] <= 1
    assert [r["train/global_step"] for r in records] == [1, 2, 4, 5]      # one actor update per episode
    assert records[-1]["train/num_tokens"] > records[0]["train/num_tokens"] > 0
    table = json.loads((tmp_path / "logs" / "rich_completions" / "completions_step_000002.json").read_text())
    assert set(table) == {"columns", "data"} and all(len(row) == len(table["columns"]) for row in table["data"])

    output = []
    quiet = _grpo(tiny_assets, tmp_path / "quiet", "--logging_strategy", "no", "--config_file",
                  str(tmp_path / "quiet" / "config.json"), "--use_flash_attn", output=output)
    assert quiet == []
    assert json.loads((tmp_path / "quiet" / "config.json").read_text())["logging_strategy"] == "no"   # ColossalChat's
    assert output[0].count("warning: --use_flash_attn: FlashAttention-2 needs CUDA") == 1


@pytest.mark.slow
def test_ranks_sample_their_own_completions_and_a_held_out_row_counts_once(tiny_assets, tmp_path):
    """Two ranks given the same prompt sample different completions (each rank seeds its own sampling); a held-out
    set of 3 prompts on 2 ranks scores each prompt once (1 of 3 rewarded reads 1/3, not 2/4); reward functions get
    the trainer's state in evaluation too."""
    from datasets import load_from_disk

    prompts = load_from_disk(str(tiny_assets["prompt_eval"]))
    prompts.select([0] * 8).save_to_disk(str(tmp_path / "same_prompt"))
    prompts.select([0, 1, 2]).save_to_disk(str(tmp_path / "three_prompts"))
    log = tmp_path / "rewards.jsonl"
    result = torchrun(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(tiny_assets["model"]), "--prompt_dataset",
                      str(tmp_path / "same_prompt"), "--eval_dataset", str(tmp_path / "three_prompts"),
                      "--eval_batch_size", "2", "--plugin", "ddp", "--batch_size", "1", "--num_generations", "4",
                      "--max_new_tokens", "8", "--num_episodes", "2", "--eval_interval", "1", "--reward_fn",
                      "rank_rewards:first_prompt_only", "--output_dir", str(tmp_path / "out"),
                      PYTHONPATH=str(REPO / "tests"), REWARD_LOG=str(log),
                      FIRST_PROMPT=json.loads(prompts[0]["prompt"])[-1]["content"])
    assert result.returncode == 0, result.stderr[-4000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    first_training_call = {c["rank"]: c["completions"] for c in calls if c["step"] == 0 and len(c["completions"]) == 4}
    assert first_training_call[0] != first_training_call[1]
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert sorted(int(step) for step in results) == [0, 1, 2]
    for held_out in results.values():
        assert held_out["eval/rewards/first_prompt_only"] == held_out["eval/reward"] == pytest.approx(1 / 3)
    assert {c["step"] for c in calls} == {0, 1, 2}
