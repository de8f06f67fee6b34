"""Failing safe: non-finite steps stop (or are skipped within a budget) and never reach a checkpoint or export;
reward functions that hang are timed out; logs of two runs never mix; half-written checkpoints are cleaned;
secrets are matched by name; the demo report says when a learned reward rises while accuracy falls."""
import json
import math
import sys
import time

import pytest
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from colossalai.cluster import DistCoordinator

from coati.rewards import RewardFunctionError, RewardTimeoutError, WeightedReward
from coati.utils.errors import NonFiniteError
from coati.utils import MetricsLogger, save_checkpoint, save_hf_model
from coati.utils.ckpt_io import NonFiniteWeightsError, list_checkpoints
from coati.utils.metrics_logger import PREVIOUS_RUNS_DIR, public_config
from conftest import REPO
from support import linear_trainer, regression_rows

sys.path.insert(0, str(REPO / "applications" / "demo"))
from report import alarm_lines, reward_vs_accuracy  # noqa: E402


def _rows_with_nan_at(n, bad_rows):
    rows, x, y = regression_rows(n)
    for i in bad_rows:
        rows[i] = {"x": rows[i]["x"], "y": torch.tensor(float("nan"))}
    return rows


def test_a_nan_loss_stops_the_run_naming_the_step_and_nothing_is_saved_after_it(world_of_one, tmp_path):
    rows = _rows_with_nan_at(8, [4])      # batches of 2: the third optimizer step sees the NaN
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, save_interval=1,
                                         save_dir=str(tmp_path))
    with pytest.raises(NonFiniteError, match=r"^step 3: the loss is NaN or infinite; .*--skip_nonfinite"):
        trainer.fit(loader)
    assert [p.name for p in list_checkpoints(tmp_path, complete_only=False)] == ["epoch-0_step-1", "epoch-0_step-2"]
    assert torch.isfinite(trainer.model.unwrap().weight).all()


def test_skip_nonfinite_skips_and_counts_at_most_n_steps(world_of_one, tmp_path):
    rows = _rows_with_nan_at(12, [2, 6])
    trainer, loader, w0 = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, skip_nonfinite=2)
    trainer.fit(loader, log_dir=str(tmp_path))
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert trainer.step == 6 and trainer.nonfinite.skipped == 2
    assert [r["train/skipped_nonfinite_steps"] for r in logged] == [0, 1, 1, 2, 2, 2]
    assert all(math.isfinite(r.get("train/loss", 0.0)) for r in logged)
    assert torch.isfinite(trainer.model.unwrap().weight).all()

    rows = _rows_with_nan_at(12, [2, 6])
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, skip_nonfinite=1)
    with pytest.raises(NonFiniteError, match=r"^step 4: .*after skipping 1 such steps \(--skip_nonfinite 1\)"):
        trainer.fit(loader)


def test_a_nan_gradient_with_a_finite_loss_is_caught_too(world_of_one):
    rows, _, _ = regression_rows(4)
    trainer, loader, _ = linear_trainer(rows, batch_size=2, accumulation_steps=1, lr=0.1, grad_clip=1.0)
    trainer.model.unwrap().weight.register_hook(lambda grad: grad * float("nan"))
    with pytest.raises(NonFiniteError, match=r"^step 1: the gradient norm is NaN or infinite"):
        trainer.fit(loader)
    assert torch.isfinite(trainer.model.unwrap().weight).all()


def _boosted_linear():
    model = torch.nn.Linear(3, 2)
    booster = Booster(plugin=TorchDDPPlugin())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return booster, model, optimizer


def test_nan_weights_are_never_written_to_a_checkpoint_or_an_export(world_of_one, tmp_path):
    booster, model, optimizer = _boosted_linear()
    with torch.no_grad():
        model.unwrap().weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match="NaN or infinite weights \\(first: .*weight\\)"):
        save_checkpoint(tmp_path / "ckpt", booster, model, optimizer, None, 0, 1, 4, DistCoordinator())
    with pytest.raises(NonFiniteWeightsError):
        save_hf_model(tmp_path / "export", booster, model, None, DistCoordinator())
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "export").exists()


def test_a_rewrite_of_an_interrupted_checkpoint_leaves_none_of_its_files(world_of_one, tmp_path):
    booster, model, optimizer = _boosted_linear()
    interrupted = tmp_path / "epoch-0_step-2"
    (interrupted / "modeling").mkdir(parents=True)
    (interrupted / "modeling" / ".tmp_model-00001.safetensors").write_bytes(b"\0" * 1000)
    older = tmp_path / "epoch-0_step-1"
    older.mkdir()
    (older / "optimizer.bin.tmp").write_bytes(b"\0" * 1000)
    path = save_checkpoint(tmp_path, booster, model, optimizer, None, 0, 2, 4, DistCoordinator())
    assert not list(path.rglob("*tmp*"))
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["epoch-0_step-2"]   # the older incomplete one too


def test_a_reward_function_that_hangs_is_timed_out_naming_it():
    def stuck(prompts, completions, **fields):
        time.sleep(3600)

    reward = WeightedReward([("math_answer", lambda prompts, completions, **f: [1.0] * len(completions), 1.0),
                             ("stuck", stuck, 1.0)], timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(RewardTimeoutError, match="^reward function stuck did not return within --reward_timeout 0.5 s"):
        reward(["p"], ["c"])
    assert time.monotonic() - start < 5
    assert isinstance(RewardTimeoutError("x"), RewardFunctionError)


def test_a_reward_within_its_timeout_returns_its_values_and_errors_keep_their_names():
    reward = WeightedReward.from_specs(["math_answer"], timeout_s=30)
    total, components = reward(["q"], ["#### 4"], gt_answer=["4"])
    assert total == [1.0] and components == {"math_answer": [1.0], "math_answer/timeouts": [0.0],
                                             "math_answer/errors": [0.0]}

    def broken(prompts, completions, **fields):
        raise KeyError("gt")

    with pytest.raises(RewardFunctionError, match="reward function broken raised KeyError"):
        WeightedReward([("broken", broken, 1.0)], timeout_s=30)(["q"], ["c"])


def test_a_fresh_run_sets_an_earlier_runs_logs_aside_instead_of_mixing(tmp_path):
    first = MetricsLogger(log_dir=str(tmp_path))
    first.log({"train/loss": 1.0}, step=1)
    first.log({"train/loss": 0.9}, step=2)
    first.close()                                    # killed before its first checkpoint, then started again
    second = MetricsLogger(log_dir=str(tmp_path))
    second.log({"train/loss": 2.0}, step=1)
    second.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]
    moved = list((tmp_path / PREVIOUS_RUNS_DIR).iterdir())
    assert len(moved) == 1 and len((moved[0] / "metrics.jsonl").read_text().splitlines()) == 2
    assert list((moved[0] / "tensorboard").glob("events.out.tfevents.*"))

    resumed = MetricsLogger(log_dir=str(tmp_path), resume_step=1)   # a resume keeps its own run's records
    resumed.log({"train/loss": 1.9}, step=2)
    resumed.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and len(list((tmp_path / PREVIOUS_RUNS_DIR).iterdir())) == 1


def test_secrets_are_matched_by_name_not_by_substring():
    config = {"tokenizer_dir": "tok", "max_new_tokens": 64, "keep_last": 2, "api_key": "a", "wandb_key": "b",
              "hf_token": "c", "token": "d", "password": "e", "client_secret": "f", "secret": "g", "lora_alpha": 16}
    assert public_config(config) == {"tokenizer_dir": "tok", "max_new_tokens": 64, "keep_last": 2, "lora_alpha": 16}


def test_the_report_warns_when_a_learned_reward_rises_while_accuracy_falls():
    records = [{"step": i, "train/rewards/reward_model": 0.1 * i} for i in range(1, 21)]
    warning = reward_vs_accuracy("PPO", records, "train/rewards/reward_model", 0.617, 0.227)
    assert warning.startswith("WARNING: PPO lowered held-out accuracy: held-out accuracy 0.617 -> 0.227 (-0.390, "
                              "-63%); training reward (train/rewards/reward_model) 0.300 -> 1.800.")
    assert "reward over-optimisation" in warning
    fine = reward_vs_accuracy("PPO", records, "train/rewards/reward_model", 0.617, 0.650)
    assert fine == ("PPO raised held-out accuracy: held-out accuracy 0.617 -> 0.650 (+0.033, +5%); training reward "
                    "(train/rewards/reward_model) 0.300 -> 1.800.")
    assert reward_vs_accuracy("PPO", [], "train/reward", 0.5, 0.4) is None


def test_the_report_says_plainly_when_accuracy_fell_though_the_reward_fell_too():
    """The demo's PPO once lowered accuracy by a sixth while its reward model's score fell: no warning was given."""
    records = [{"step": i, "train/rewards/reward_model": 3.7 - 0.01 * i} for i in range(1, 21)]
    worse = reward_vs_accuracy("PPO", records, "train/rewards/reward_model", 0.625, 0.523)
    assert worse.startswith("WARNING: PPO lowered held-out accuracy: held-out accuracy 0.625 -> 0.523 (-0.102, -16%)")
    assert worse.endswith("This stage made the model worse on held-out questions; do not use its model.")
    assert alarm_lines("PPO", {"eval_drop": "alarm eval_drop at step 8: ..."}) == ["PPO alarm: alarm eval_drop at step 8: ..."]
