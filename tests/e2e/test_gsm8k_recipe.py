"""The GSM8K-style RLVR recipe on a small generated file in GSM8K's format: save and evaluation cadence,
held-out accuracy printed, the run resumable."""
import json
import subprocess
import sys

import pytest

from coati.dataset.demo_data import generate_problems, gsm8k_records, write_jsonl
from conftest import REPO, checkpoint_names, child_env

RECIPE = REPO / "applications" / "gsm8k_rlvr" / "run_gsm8k.py"


@pytest.mark.slow
@pytest.mark.parametrize("rollout", [[], pytest.param(["--async_rollout", "1"], marks=pytest.mark.extended)],
                         ids=["sync", "async"])
def test_gsm8k_recipe_saves_and_evaluates_on_its_cadence(tiny_assets, tmp_path, rollout):
    train = write_jsonl(gsm8k_records(generate_problems(16, "train")), tmp_path / "train.jsonl")   # 4 episodes
    test = write_jsonl(gsm8k_records(generate_problems(16, "eval")), tmp_path / "test.jsonl")
    out = tmp_path / "run"
    cmd = [sys.executable, str(RECIPE), "--pretrain", str(tiny_assets["model"]), "--train_file", str(train),
           "--test_file", str(test), "--out", str(out), "--episodes", "6", "--save_every", "3", "--eval_every", "5",
           "--eval_every_epochs", "1",
           *rollout, "--", "--batch_size", "2", "--num_generations", "4", "--max_new_tokens", "8"]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert [name.split("_")[1] for name in checkpoint_names(out / "checkpoints")] == ["step-3", "step-6"]
    history = json.loads((out / "eval_results.json").read_text())
    assert list(history) == ["0", "4", "5", "6"]         # before, an epoch's end, the 5th, the last
    assert all(0 <= h["eval/rewards/math_answer"] <= 1 for h in history.values())
    for episode in history:
        assert f"[gsm8k] episode {episode}: held-out accuracy" in result.stdout
    assert "[gsm8k] train: 16 prompts" in result.stdout and (out / "model" / "config.json").is_file()
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert any("train/rollout/staleness@trained/max" in r for r in records) == bool(rollout)
