"""Every CUDA plugin trains, checkpoints, exports and resumes through the real script (needs a GPU).

Run on a GPU machine with `python -m pytest tests/test_cuda_plugins.py`; on a machine without CUDA
these tests are skipped and `test_plugins.py` checks the refusal instead.
"""
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import SCRIPTS, torchrun

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA plugins need a GPU")]

PLUGIN_FLAGS = {
    "ddp": ["--plugin", "ddp", "--mixed_precision", "bf16"],
    "zero2": ["--plugin", "zero2", "--mixed_precision", "bf16"],
    "zero2_cpu": ["--plugin", "zero2_cpu", "--mixed_precision", "bf16"],
    "gemini": ["--plugin", "gemini", "--mixed_precision", "bf16"],
    "gemini_auto": ["--plugin", "gemini_auto", "--mixed_precision", "bf16"],
    "3d": ["--plugin", "3d", "--mixed_precision", "bf16", "--zero_stage", "1"],
}


def _run(assets, out: Path, plugin: str, *extra: str):
    args = ["--pretrain", str(assets["model"]), "--dataset", str(assets["sft_train"]),
            "--eval_dataset", str(assets["sft_eval"]), "--batch_size", "8", "--accumulation_steps", "2",
            "--max_epochs", "1", "--lr", "1e-3", "--log_interval", "1", "--save_interval", "2",
            "--save_dir", str(out / "ckpt"), "--log_dir", str(out / "logs"), "--output_dir", str(out / "final"),
            *PLUGIN_FLAGS[plugin], *extra]
    result = torchrun(SCRIPTS / "train_sft.py", 1, *args)
    assert result.returncode == 0, result.stderr[-6000:]
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "train/loss" in r]


@pytest.mark.parametrize("plugin", sorted(PLUGIN_FLAGS))
def test_plugin_trains_checkpoints_exports_and_resumes(plugin, tiny_assets, tmp_path):
    records = _run(tiny_assets, tmp_path / "full", plugin)
    assert [r["step"] for r in records] == list(range(1, 7))       # 96 rows, batch 8, accumulation 2
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in records)
    assert records[-1]["train/loss"] < records[0]["train/loss"]
    mid = tmp_path / "full" / "ckpt" / "epoch-0_step-2"
    assert (mid / "COMPLETE").is_file()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "full" / "final" / "model")
    assert (tmp_path / "full" / "final" / "eval_result_epoch0.json").is_file()

    resumed = _run(tiny_assets, tmp_path / "resumed", plugin, "--checkpoint_path", str(mid))
    assert [r["step"] for r in resumed] == list(range(3, 7))
    assert resumed[0]["train/loss"] == pytest.approx(records[2]["train/loss"], rel=2e-2)
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "resumed" / "final" / "model")
    for (name, a), b in zip(exported.state_dict().items(), again.state_dict().values()):
        assert torch.allclose(a, b, atol=2e-2, rtol=0), name
