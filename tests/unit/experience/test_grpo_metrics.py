"""GRPO's metrics under the published logging module's names: the statistics against hand computations,
and a real train_grpo.py run under torchrun whose metrics.jsonl holds every name on the logging cadence."""
import json

import numpy as np
import pytest
import torch

from coati.experience.metrics import group_diversity, kl_stats, length_stats, reward_stats
from coati.trainer.metric_names import PUBLISHED_GRPO as PUBLISHED
from conftest import SCRIPTS, torchrun


def test_reward_quantiles_and_population_std_match_a_hand_computation():
    rewards = [0.0, 1.0, 3.0, 4.0, 10.0]
    stats = reward_stats(rewards, {"math": [1.0, 0.0, 0.0, 1.0, 1.0]})
    assert stats["reward"] == 3.6
    assert stats["reward_std"] == pytest.approx(np.sqrt(((np.array(rewards) - 3.6) ** 2).mean()))   # divides by n
    # linear interpolation between order statistics at (n - 1) q = 4 q
    assert stats["reward_p00"] == 0.0 and stats["reward_p100"] == 10.0 and stats["reward_p50"] == 3.0
    assert stats["reward_p25"] == 1.0 and stats["reward_p75"] == 4.0
    assert stats["reward_p05"] == pytest.approx(0.2 * 1.0)                # 4 * 0.05 = 0.2 of the way from 0 to 1
    assert stats["reward_p95"] == pytest.approx(4.0 + 0.8 * 6.0)          # 3.8: 0.8 of the way from 4 to 10
    assert stats["rewards/math/mean"] == 0.6 and stats["rewards/math/std"] == pytest.approx(np.sqrt(0.24))
    assert stats["rewards/math/p50"] == 1.0 and stats["rewards/math/p00"] == 0.0


def test_diversity_of_a_group_by_hand():
    same = group_diversity([[1, 2, 3], [1, 2, 3]])
    assert same == {"distinct_1": 3 / 6, "distinct_2": 2 / 4, "jaccard": 0.0}
    apart = group_diversity([[1, 2], [3, 4], [1, 5]])
    assert apart["distinct_1"] == 5 / 6 and apart["distinct_2"] == 1.0
    # distances: {1,2}-{3,4} 1, {1,2}-{1,5} 1 - 1/3, {3,4}-{1,5} 1
    assert apart["jaccard"] == pytest.approx((1 + 2 / 3 + 1) / 3)


def test_lengths_and_kl_per_sequence_and_per_token():
    lengths, terminated = np.array([4.0, 8.0, 2.0]), np.array([True, False, True])
    stats = length_stats(lengths, terminated)
    assert stats["avg_completion_tokens"] == pytest.approx(14 / 3)
    assert (stats["completions/min_length_sampled"], stats["completions/max_length_sampled"]) == (2.0, 8.0)
    assert stats["completions/mean_length_terminated"] == 3.0 and stats["completions/max_length_terminated"] == 4.0
    assert stats["completions/clipped_frac"] == pytest.approx(1 / 3)
    kl = torch.tensor([[0.1, 0.3, 9.0], [0.2, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    stats = kl_stats(kl, mask)
    assert stats["kl"] == pytest.approx((0.4 + 0.2) / 2) and stats["kl_per_completion_token"] == pytest.approx(0.6 / 3)


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
