"""The algorithm registries across real ranks: REINFORCE++'s statistics and the KL controller see every rank, and an
objective written outside the package (`tests/online_dpo_objective.py`) trains under torchrun."""
import math

import pytest

from conftest import dist_script_result


def test_reinforce_pp_statistics_span_every_rank():
    result = dist_script_result("advantages_reduce.py")
    # rank 0 holds rewards [0, 2], rank 1 [4, 6]: global mean 3, population std sqrt(5)
    assert result["rank0"] == pytest.approx([-3 / math.sqrt(5), -1 / math.sqrt(5)], rel=1e-5)
    # the KL controller saw every rank's 4 completions, mean KL 4 against target 5: e = -0.2, beta = 0.1 * (1 - 0.2 * 4 / 100)
    assert result["kl_values"] == pytest.approx([0.0992, 0.0992])


@pytest.mark.slow
def test_online_dpo_from_outside_the_package_trains_as_one_objective(tiny_assets, tmp_path):
    """Two torchrun processes train `tests/online_dpo_objective.py`'s OnlineDPO: the reference is loaded for it
    (policy and reference agree at the first step: margin 0, loss ln 2), and the policy then moves away from it."""
    import json
    import subprocess

    from conftest import REPO, SCRIPTS, child_env, torchrun_cmd

    args = ["--pretrain", str(tiny_assets["model"]), "--prompt_dataset", str(tiny_assets["prompt_train"]),
            "--plugin", "ddp", "--batch_size", "4", "--num_generations", "2", "--max_new_tokens", "8",
            "--num_episodes", "4", "--lr", "1e-2", "--log_dir", str(tmp_path / "logs"),
            "--reward_fn", "online_dpo_objective:distinct_characters",
            "--objective", "online_dpo_objective:OnlineDPO", "--objective_option", "beta=0.5"]
    result = subprocess.run(torchrun_cmd(SCRIPTS / "train_grpo.py", 2, *args), capture_output=True, text=True,
                            timeout=600, env=child_env(PYTHONPATH=str(REPO / "tests")), cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4] and "train/loss/policy" not in train[0]
    assert train[0]["train/dpo/margin"] == pytest.approx(0.0, abs=1e-5)
    assert train[0]["train/loss/dpo"] == pytest.approx(math.log(2), abs=1e-5)
    assert all(r["train/grad_norm"] > 0 for r in train)
    assert any(abs(r.get("train/dpo/margin", 0.0)) > 1e-3 for r in train[1:])
