"""Health alarms: quiet on the recorded traces of healthy demo runs, each one firing on a failure injected into
such a trace (`--stop_on_alarm` in a real run: e2e/test_health_alarms_e2e.py)."""
import json
import re

import pytest

from coati.experience.evaluation import k_values, pass_at_k, sampled_metrics
from coati.trainer.callbacks.best import BestModelKeeper
from coati.trainer.callbacks.health import ALARMS, AlarmThresholds, HealthMonitor
from coati.utils.errors import CoatiUsageError
from conftest import REPO

TRACES = REPO / "tests" / "data"
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


def test_steps_without_a_gradient_do_not_make_the_first_real_one_a_spike():
    """GRPO's first steps, every group tied, have grad norm 0 (as the README's quickstart has): the median of the
    nonzero norms before is the scale, so the first norm after them is no spike, and a real one still is."""
    from coati.trainer.callbacks.health import TRAIN_ALARMS

    _, check, _ = TRAIN_ALARMS["grad_spike"]
    limits = AlarmThresholds()
    assert check("train/grad_norm", [0.0] * 9 + [0.17], limits) is None
    assert check("train/grad_norm", [0.0, 0.0, 0.1, 0.12, 0.0, 0.11, 0.09, 0.13], limits) is None
    fired = check("train/grad_norm", [0.0, 0.0, 0.1, 0.12, 0.0, 0.11, 0.09, 5.0], limits)
    assert fired is not None and fired[0] == 5.0


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
