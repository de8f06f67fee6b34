"""train_rm.py under two torchrun processes: metrics, evaluation results, checkpoint and HF export."""
import json

import pytest
from transformers import AutoModelForSequenceClassification

from conftest import SCRIPTS, torchrun


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
