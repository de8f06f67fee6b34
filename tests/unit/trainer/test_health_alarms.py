"""Health alarms: quiet on the recorded traces of healthy demo runs, each one firing on a failure injected into
such a trace; `--stop_on_alarm` ends a real run with a checkpoint that resumes."""
import json
import re
from pathlib import Path

import pytest

from coati.experience.evaluation import k_values, pass_at_k, sampled_metrics
from coati.trainer.callbacks.best import BestModelKeeper
from coati.trainer.callbacks.health import ALARMS, AlarmThresholds, HealthMonitor
from coati.utils.errors import CoatiUsageError
from conftest import SCRIPTS, torchrun

TRACES = Path(__file__).parent / "data"
"""metrics.jsonl (the keys the alarms watch) of `make demo`'s PPO and GRPO stages, seed 1 of
benchmarks/bench_learning.py, and of its PPO stages with seeds 2 and 3: every one ended at or above SFT."""


def trace(stage: str) -> list:
    return [json.loads(line) for line in (TRACES / f"healthy_{stage}_metrics.jsonl").read_text().splitlines()]


def replay(rows: list, monitor: HealthMonitor) -> list:
    """Feed each record to `on_log` as a trainer would; the records as logged (alarms added)."""
    logged = []
    for row in rows:
        metrics = {k: v for k, v in row.items() if k != "step"}
        monitor.on_log(row["step"], metrics)
        logged.append(metrics)
    return logged


def late_train_rows(rows: list, count: int = 4) -> list:
    return [r for r in rows if "train/reward" in r][-count:]


def set_late(metric: str, value: float):
    def inject(rows):
        for row in late_train_rows(rows):
            row[metric] = value
    return inject


def scale_late(metric: str, factor: float):
    def inject(rows):
        for row in late_train_rows(rows):
            row[metric] *= factor
    return inject


def spike_grad_norm(rows):
    late_train_rows(rows, 1)[0]["train/grad_norm"] *= 50


def eval_falls(by: float, reward_rises: bool, base: float = 0.0):
    def inject(rows):
        evals = [r for r in rows if "eval/reward" in r]
        for row in evals:
            row["eval/reward"] += base
        for row in evals[len(evals) // 2:]:
            row["eval/reward"] = evals[0]["eval/reward"] - by
        if reward_rises:
            train = [r for r in rows if "train/reward" in r]
            for i, row in enumerate(train):
                row["train/reward"] = 0.1 * i
    return inject


INJECTED = {
    "entropy_collapse": ("grpo", scale_late("train/policy_entropy", 0.05)),
    "length_collapse": ("grpo", set_late("train/completions/mean_length_sampled", 2.0)),
    "length_at_limit": ("grpo", set_late("train/completions/clipped_frac", 1.0)),
    "zero_std_groups": ("grpo", set_late("train/frac_reward_zero_std", 1.0)),
    "kl_runaway": ("ppo", set_late("train/kl_per_completion_token", 3.0)),
    "engine_ratio_drift": ("grpo", set_late("train/behaviour_ratio", 1.6)),
    "grad_spike": ("grpo", spike_grad_norm),
    "eval_drop": ("ppo", eval_falls(0.3, reward_rises=False)),
    "eval_falls_reward_rises": ("grpo", eval_falls(0.06, reward_rises=True, base=1.0)),
}


@pytest.mark.parametrize("stage", ["ppo", "grpo", "ppo_seed2", "ppo_seed3"])
def test_healthy_demo_runs_raise_no_alarm(stage, capsys):
    """Seed 2's PPO had one gradient norm 12 x the median before it, and seed 3's PPO accuracy dipped 10 % for two
    evaluations before ending 20 % above SFT: neither is an alarm at the defaults."""
    monitor = HealthMonitor()
    logged = replay(trace(stage), monitor)
    assert monitor.fired == {} and not any(k.startswith("alarm/") for m in logged for k in m)
    assert "alarm" not in capsys.readouterr().err


@pytest.mark.parametrize("alarm", ALARMS)
def test_each_alarm_fires_once_on_its_injected_failure(alarm, capsys):
    stage, inject = INJECTED[alarm]
    rows = trace(stage)
    inject(rows)
    monitor = HealthMonitor()
    logged = replay(rows, monitor)
    assert list(monitor.fired) == [alarm]
    assert sum(m.get(f"alarm/{alarm}", 0.0) for m in logged) == 1.0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: alarm")]
    assert warnings == [f"warning: {monitor.fired[alarm]}"]
    assert re.fullmatch(rf"warning: alarm {alarm} at step \d+: (train|eval)/\S+ = -?[\d.e+-]+[ ,].+", warnings[0])
    assert not monitor.stop_training


def test_an_alarm_named_in_stop_on_stops_training_and_others_only_warn():
    rows = trace("grpo")
    INJECTED["entropy_collapse"][1](rows)
    spike_grad_norm(rows)
    monitor = HealthMonitor(stop_on=["grad_spike"])
    replay(rows, monitor)
    assert monitor.stop_training and monitor.stopped_by == "grad_spike" and set(monitor.fired) == {"entropy_collapse",
                                                                                                  "grad_spike"}
    assert "--stop_on_alarm" in monitor.fired["grad_spike"] and "--stop_on_alarm" not in monitor.fired["entropy_collapse"]


def test_patience_and_thresholds_are_the_user_s():
    rows = trace("grpo")
    for row in late_train_rows(rows, 2):   # two bad logs: fewer than the default patience of 3
        row["train/frac_reward_zero_std"] = 1.0
    quiet = HealthMonitor()
    replay(rows, quiet)
    assert quiet.fired == {}
    eager = HealthMonitor(AlarmThresholds(patience=2))
    replay(rows, eager)
    assert list(eager.fired) == ["zero_std_groups"]
    with pytest.raises(ValueError, match="unknown alarm entropy; choose from all, "):
        HealthMonitor(stop_on=["entropy"])


@pytest.mark.slow
def test_stop_on_alarm_ends_the_run_with_a_checkpoint_that_resumes(tiny_assets, tmp_path):
    args = ["--pretrain", str(tiny_assets["model"]), "--prompt_dataset", str(tiny_assets["prompt_train"]),
            "--plugin", "ddp", "--batch_size", "2", "--max_new_tokens", "8", "--num_episodes", "4",
            "--num_generations", "2", "--reward_fn", "answer_format", "--save_dir", str(tmp_path / "ckpt"),
            "--log_dir", str(tmp_path / "logs")]
    stopped = torchrun(SCRIPTS / "train_grpo.py", 1, *args, "--output_dir", str(tmp_path / "out"),
                       "--stop_on_alarm", "entropy_collapse", "--alarm_threshold", "entropy_floor=2", "patience=1")
    assert stopped.returncode != 0 and re.search(r"exitcode\s*: 4", stopped.stderr), stopped.stderr[-3000:]
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: stopped by alarm entropy_collapse (--stop_on_alarm); resume it from {tmp_path / 'ckpt'} "
                      "with --checkpoint_path latest"]
    assert "warning: alarm entropy_collapse at step 1: train/policy_entropy = " in stopped.stderr
    alarms = json.loads((tmp_path / "out" / "alarms.json").read_text())   # answer_format is 0 for all: no spread
    assert list(alarms) == ["entropy_collapse", "zero_std_groups"] and "--stop_on_alarm" in alarms["entropy_collapse"]
    assert (tmp_path / "ckpt" / "epoch-0_step-1").is_dir() and not (tmp_path / "out" / "model").exists()
    logged = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "alarm/entropy_collapse" in r] == [1]

    resumed = torchrun(SCRIPTS / "train_grpo.py", 1, *args, "--checkpoint_path", "latest",
                       "--eval_dataset", str(tiny_assets["prompt_train"]), "--eval_n_samples", "4",
                       "--save_best", "rewards/answer_format", "--output_dir", str(tmp_path / "final"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    best = json.loads((tmp_path / "final" / "best.json").read_text())
    evals = [r for r in map(json.loads, (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines())
             if "eval/rewards/answer_format" in r]
    assert best["value"] == max(r["eval/rewards/answer_format"] for r in evals) and best["metric"] == "eval/rewards/answer_format"
    assert (tmp_path / "final" / "best" / "config.json").is_file() and (tmp_path / "final" / "model" / "config.json").is_file()
    assert "resumed from" in resumed.stdout + resumed.stderr and (tmp_path / "ckpt" / "epoch-0_step-4").is_dir()
    final = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()][-1]
    sampled = {k: v for k, v in final.items() if k.startswith("eval/rewards/answer_format/")}
    assert set(sampled) == {f"eval/rewards/answer_format/{m}" for m in ("pass@1", "pass@2", "pass@4", "maj@4", "mean@4")}
    assert sampled["eval/rewards/answer_format/pass@1"] == pytest.approx(sampled["eval/rewards/answer_format/mean@4"])
    assert 0 <= sampled["eval/rewards/answer_format/pass@1"] <= sampled["eval/rewards/answer_format/pass@4"] <= 1


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 0, 1, 0.0), (5, 5, 3, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (4, 2, 2, 1 - 1 / 6), (10, 3, 5, 1 - 21 / 252),
    (3, 1, 3, 1.0), (6, 2, 4, 1 - 1 / 15)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    """1 - C(n-c, k) / C(n, k), worked by hand: 4 samples, 1 right, k=2 draws: 1 - C(3,2)/C(4,2) = 1 - 3/6."""
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_sampled_metrics_vote_on_final_answers_and_average():
    values = [1.0, 0.0, 0.0, 1.0]
    answers = ["7", "8", "8", "7"]   # a tie: the first answer to reach the most votes wins
    assert sampled_metrics(values, answers) == {"mean@4": 0.5, "pass@1": 0.5, "pass@2": pytest.approx(5 / 6),
                                                "pass@4": 1.0, "maj@4": 1.0}
    assert sampled_metrics([0.0, 1.0, 0.0], ["8", "7", "8"])["maj@3"] == 0.0
    assert sampled_metrics([0.0, 1.0, 0.0], [None, "7", None])["maj@3"] == 1.0   # no answer, no vote
    assert sampled_metrics([0.5, 2.0], ["1", "2"]) == {"mean@2": 1.25}   # not a pass/fail reward: the mean only
    assert k_values(8) == [1, 2, 4, 8] and k_values(6) == [1, 2, 4, 6] and k_values(1) == [1]
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_the_best_model_is_kept_only_when_the_metric_improves_and_survives_a_resume(tmp_path):
    exported = []
    keeper = BestModelKeeper("rewards/math_answer", tmp_path / "best", exported.append, is_master=True)
    for step, value in [(0, 0.2), (4, 0.5), (8, 0.4), (12, 0.5), (16, 0.6)]:
        keeper.on_evaluate(step, {"eval/reward": value, "eval/rewards/math_answer": value})
    assert len(exported) == 3 and json.loads((tmp_path / "best.json").read_text())["step"] == 16
    resumed = BestModelKeeper("eval/rewards/math_answer", tmp_path / "best", exported.append, is_master=True)
    resumed.on_evaluate(20, {"eval/rewards/math_answer": 0.55})
    assert len(exported) == 3 and resumed.best == 0.6
    with pytest.raises(CoatiUsageError, match=r"--save_best eval/accuracy: this run's evaluation does not log it; "
                                              r"it logs eval/reward, eval/rewards/math_answer"):
        BestModelKeeper("accuracy", tmp_path / "other", exported.append, True).on_evaluate(0, {
            "eval/reward": 1.0, "eval/rewards/math_answer": 1.0})
