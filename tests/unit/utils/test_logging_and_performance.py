"""The metrics logger's sinks, and the performance callback's counting."""
import json

import pytest
import torch
import wandb

from coati.trainer.callbacks import PerformanceEvaluator, count_samples_and_tokens
from coati.utils import MetricsLogger


def test_jsonl_and_tensorboard_full_precision(tmp_path):
    logger = MetricsLogger(log_dir=str(tmp_path))
    logger.log({"train/loss": 0.123456789012345, "train/bad": float("nan")}, step=3)
    logger.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["step"] == 3 and record["train/loss"] == 0.123456789012345 and record["train/bad"] == "nan"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_wandb_offline_run_is_written_without_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = MetricsLogger(log_dir=str(tmp_path), use_wandb=True, config={"plugin_choice": "ddp", "wandb_api_key": "s3cret"})
    logger.log({"train/loss": 1.5}, step=1)
    logger.close()
    wandb.teardown()      # run.finish() only informs W&B's service; its shutdown is what closes the run file
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs, "an offline W&B run directory is written under log_dir"
    run_file = next(runs[0].glob("run-*.wandb")).read_bytes()
    assert b"train/loss" in run_file and b"plugin_choice" in run_file and b"wandb_api_key" not in run_file
    assert not any(b"s3cret" in f.read_bytes() for f in (tmp_path / "wandb").rglob("*") if f.is_file())


def test_a_runs_wandb_run_is_named_by_its_run_name(tmp_path, monkeypatch):
    """HF's `run_name` (--run_name) names the W&B run the runner opens (without it, the trainer's class)."""
    import argparse

    from coati.cli.runner import open_logger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = argparse.Namespace(log_dir=str(tmp_path), use_wandb=True, wandb_project="coati", run_name="sft-lr3e-3",
                              wandb_table_rows=4)
    logger = open_logger(args, MetricsLogger, None)
    assert logger._wandb_run.name == "sft-lr3e-3"
    logger.close()
    wandb.teardown()


def test_counts_samples_and_tokens_of_dict_and_preference_batches():
    batch = {"input_ids": torch.zeros(2, 4), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])}
    assert count_samples_and_tokens(batch) == (2, 5)
    pair = {"chosen_attention_mask": torch.ones(3, 2), "rejected_attention_mask": torch.ones(3, 4)}
    assert count_samples_and_tokens([batch, pair]) == (5, 5 + 6 + 12)


def test_performance_evaluator_reports_rates_after_warmup():
    evaluator = PerformanceEvaluator(ignore_steps=1)
    batch = {"attention_mask": torch.ones(4, 8)}
    evaluator.on_fit_start()
    for _ in range(3):
        evaluator.on_learn_batch_start()
        evaluator.on_learn_batch_end(batch)
    evaluator.on_fit_end()
    summary = evaluator.summary()
    assert evaluator.learn.samples == 8 and evaluator.learn.tokens == 64      # the first call is warm-up
    assert summary["learn/tokens_per_s"] == summary["learn/samples_per_s"] * 8
    assert "make_experience/seconds" not in summary
    one_step = PerformanceEvaluator(ignore_steps=1)
    one_step.on_learn_batch_start()
    one_step.on_learn_batch_end(batch)
    assert "learn/seconds" not in one_step.summary()          # its one step was the warm-up: no zero rates


def test_sample_tables_as_json_sidecars_and_at_most_n_rows_to_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = [{"prompt": f"q{i}", "completion": f"a{i}", "reward": float(i)} for i in range(10)]
    logger = MetricsLogger(log_dir=str(tmp_path), use_wandb=True, wandb_table_rows=4)
    path = logger.log_table("completions", rows, step=7)
    logger.close()
    assert path == tmp_path / "rich_completions" / "completions_step_000007.json"
    assert json.loads(path.read_text()) == {"columns": ["prompt", "completion", "reward"],
                                            "data": [[f"q{i}", f"a{i}", float(i)] for i in range(10)]}
    sent = list((tmp_path / "wandb").rglob("completions_*.table.json"))
    assert len(sent) == 1 and json.loads(sent[0].read_text())["data"] == [[f"q{i}", f"a{i}", float(i)] for i in range(4)]


def test_a_run_logging_to_wandb_without_a_login_is_refused_before_anything_loads(monkeypatch, tmp_path):
    """W&B logging needs WANDB_API_KEY, `wandb login`'s ~/.netrc entry for the W&B host, or WANDB_MODE=offline;
    without any, one line says so at the flags' check (W&B would stop rank 0 with a traceback once it starts)."""
    import argparse

    from coati.cli.preflight import check_wandb_login
    from coati.utils.errors import CoatiUsageError

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    args = argparse.Namespace(use_wandb=True)
    with pytest.raises(CoatiUsageError, match=r"logging to W&B .* needs an API key for api.wandb.ai: log in"):
        check_wandb_login(args)
    check_wandb_login(argparse.Namespace(use_wandb=False))
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password 0123456789\n")
    (tmp_path / "netrc").chmod(0o600)
    check_wandb_login(args)
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_wandb_login(args)
