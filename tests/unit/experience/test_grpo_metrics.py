"""GRPO's metrics under the published logging module's names: the statistics against hand computations (a real
run's metrics.jsonl: e2e/test_grpo_metrics_e2e.py)."""

import numpy as np
import pytest
import torch

from coati.experience.metrics import group_diversity, kl_stats, length_stats, reward_stats


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
