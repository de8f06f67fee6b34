"""When periodic work is due: LogCadence, Frequency (steps, epochs, seconds), Saver, Evaluator, and
StatsLogger.commit writing one step's stats with its position."""
import json

import pytest

from coati.utils import cadence
from coati.utils.cadence import Evaluator, Frequency, LogCadence, Saver
from coati.utils.metrics_logger import MetricsLogger, StatsLogger


def test_log_cadence_steps_first_step_and_off():
    assert [s for s in range(1, 8) if LogCadence("steps", 3).due(s)] == [3, 6]
    assert [s for s in range(1, 8) if LogCadence("steps", 3, first_step=True).due(s)] == [1, 3, 6]
    assert not any(LogCadence("no", 1).due(s) for s in range(1, 8))
    with pytest.raises(ValueError, match="unknown logging strategy 'epoch'"):
        LogCadence("epoch")


def test_frequency_by_steps_epochs_and_seconds(monkeypatch):
    assert [s for s in range(1, 10) if Frequency(freq_steps=4).due(s)] == [4, 8]
    by_epoch = Frequency(freq_epochs=2)
    assert [by_epoch.due(s, epoch=e, epoch_ended=end) for s, e, end in
            [(1, 0, False), (2, 1, True), (3, 1, False), (4, 2, True)]] == [False, False, False, True]
    now = [100.0]
    monkeypatch.setattr(cadence.time, "monotonic", lambda: now[0])
    by_time = Frequency(freq_secs=30)
    seen = []
    for step, elapsed in enumerate([10, 10, 15, 5, 31], start=1):
        now[0] += elapsed
        seen.append(by_time.due(step))
    assert seen == [False, False, True, False, True]          # 35 s after the start, then 36 s after that
    assert not Frequency().due(5) and not Frequency(0, 0, 0).due(5)
    with pytest.raises(ValueError, match="freq_secs must be >= 0"):
        Frequency(freq_secs=-1)


def test_saver_and_evaluator_run_their_function_when_due_or_last():
    calls = []
    saver = Saver(freq_steps=2)
    results = [saver.save(lambda s=s: calls.append(s) or s, epoch=0, step=s, last=s == 5) for s in range(1, 6)]
    assert calls == [2, 4, 5] and results == [None, 2, None, 4, 5]
    evaluator = Evaluator(freq_epochs=1)
    assert evaluator.evaluate(lambda: "done", epoch=1, step=3, epoch_ended=True) == "done"
    assert evaluator.evaluate(lambda: "done", epoch=1, step=4) is None


def test_stats_logger_commits_one_step_with_its_position(tmp_path):
    logger = MetricsLogger(str(tmp_path))
    record = StatsLogger(logger).commit(1.5, 7, 21, [{"train/loss": 2.0}, {"train/reward": 0.5, "train/loss": 1.0}])
    logger.close()
    assert record == {"train/loss": 1.0, "train/reward": 0.5, "train/epoch": 1.5, "train/global_step": 21.0}
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert line["step"] == 7 and line["train/global_step"] == 21.0 and line["train/loss"] == 1.0
