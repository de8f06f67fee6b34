"""train_rm.py under two torchrun processes: metrics, evaluation results, checkpoint and HF export."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from coati.dataset.demo_data import generate_problems, preference_records, write_jsonl
from coati.dataset.prepare import prepare_preference
from coati.utils.ckpt_io import latest_checkpoint
from conftest import REPO, SCRIPTS, child_env, torchrun, train_records


@pytest.mark.slow
@pytest.mark.parametrize("loss_fn", ["log_sig", "log_exp"])
def test_reward_model_script_trains_and_exports(tiny_assets, tmp_path, loss_fn):
    result = torchrun(SCRIPTS / "train_rm.py", 2, "--pretrain", str(tiny_assets["model"]),
                      "--dataset", str(tiny_assets["pref_train"]), "--eval_dataset", str(tiny_assets["pref_eval"]),
                      "--plugin", "ddp", "--batch_size", "8", "--lr", "1e-3", "--log_interval", "2",
                      "--loss_fn", loss_fn, *(["--grad_checkpoint"] if loss_fn == "log_exp" else []), "--save_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path),
                      "--log_dir", str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == [2, 4, 6]               # 96 pairs / (2 ranks x 8) = 6 optimizer steps
    for r in train:
        assert 0 <= r["train/accuracy"] <= 1
        assert r["train/margin"] == pytest.approx(r["train/chosen_rewards"] - r["train/rejected_rewards"], abs=1e-6)
    results = json.loads((tmp_path / "eval_result_epoch0.json").read_text())
    assert {"loss", "accuracy", "chosen_rewards", "rejected_rewards", "margin"} <= results.keys()
    assert (tmp_path / "eval_result_epoch0.txt").is_file()
    assert (tmp_path / "ckpt" / "epoch-1_step-6" / "COMPLETE").is_file()
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")
    assert model.config.num_labels == 1


def _rm_args(assets, out: Path) -> list:
    # 96 pairs over 2 ranks, micro-batch 4: 12 optimizer steps an epoch, 72 in all
    return ["--pretrain", str(assets["model"]), "--dataset", str(assets["pref_train"]), "--plugin", "ddp",
            "--batch_size", "4", "--max_epochs", "6", "--lr", "1e-3", "--log_interval", "1", "--save_interval", "3",
            "--save_dir", str(out / "ckpt"), "--log_dir", str(out / "logs")]


@pytest.mark.slow
def test_interrupted_reward_model_run_resumes_with_the_same_metrics(tiny_assets, tmp_path):
    """SIGTERM to the `coati rm --nproc_per_node 2` process alone (a scheduler's, or `kill PID`; a Ctrl-C takes the
    same way) ends the run with one line saying how to resume and no traceback, none of its processes left; resumed
    from its last checkpoint, it logs what the uninterrupted run logged (a killed run's resume: test_rl_e2e.py)."""
    full = tmp_path / "full"
    assert torchrun(SCRIPTS / "train_rm.py", 2, *_rm_args(tiny_assets, full)).returncode == 0
    expected = train_records(full / "logs")
    assert [r["step"] for r in expected] == list(range(1, 73))

    run = tmp_path / "interrupted"
    run.mkdir()
    with open(run / "out.log", "w") as out, open(run / "err.log", "w") as err:   # `coati rm --nproc_per_node 2`,
        proc = subprocess.Popen([str(Path(sys.executable).parent / "coati"), "rm", "--nproc_per_node", "2",  # as typed
                                 *_rm_args(tiny_assets, run)], stdout=out, stderr=err, env=child_env(), cwd=REPO,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    while latest_checkpoint(run / "ckpt") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run_processes = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, "the run finished before it could be interrupted"
    assert not psutil.wait_procs(run_processes, timeout=30)[1]
    said = (run / "err.log").read_text()
    assert said.strip().splitlines()[-1] == ("error: interrupted; the complete checkpoints in --save_dir, if any, are "
                                             "kept (resume with --checkpoint_path latest)") and "Traceback" not in said
    killed_at = latest_checkpoint(run / "ckpt")
    assert killed_at is not None and killed_at.name != "epoch-6_step-72"

    result = torchrun(SCRIPTS / "train_rm.py", 2, *_rm_args(tiny_assets, run), "--checkpoint_path", "latest")
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"resumed from {killed_at}" in result.stdout + result.stderr
    resumed = train_records(run / "logs")
    assert [r["step"] for r in resumed] == list(range(1, 73))     # steps logged after the checkpoint by the killed run are gone
    for got, want in zip(resumed, expected):
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (got["step"], name)


@pytest.mark.slow
def test_reward_model_learns_held_out_preferences(tiny_assets, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    for split, n in (("train", 2048), ("eval", 256)):
        raw = write_jsonl(preference_records(generate_problems(n, split), seed=len(split)), tmp_path / f"{split}.jsonl")
        prepare_preference([raw], tokenizer, 128, tmp_path / split)
    result = torchrun(SCRIPTS / "train_rm.py", 2, "--pretrain", str(tiny_assets["model"]), "--dataset", str(tmp_path / "train"),
                      "--eval_dataset", str(tmp_path / "eval"), "--plugin", "ddp", "--batch_size", "16", "--lr", "1e-3",
                      "--warmup_steps", "5", "--log_interval", "8", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((tmp_path / "out" / "eval_result_epoch0.json").read_text())
    assert results["accuracy"] >= 0.9 and results["margin"] > 1.0
