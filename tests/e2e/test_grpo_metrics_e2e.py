"""GRPO's metrics in a real train_grpo.py run under torchrun: its metrics.jsonl holds every published name on the
logging cadence."""
import json

import pytest

from coati.trainer.metric_names import PUBLISHED_GRPO as PUBLISHED
from conftest import SCRIPTS, torchrun


def _grpo(assets, out, *extra, output=None):
    result = torchrun(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(assets["model"]), "--prompt_dataset",
                      str(assets["prompt_train"]), "--plugin", "ddp", "--batch_size", "2", "--num_generations", "4",
                      "--max_new_tokens", "8", "--num_episodes", "5", "--lr", "1e-3", "--kl_coef", "0.05",
                      "--reward_fn", "math_answer", "answer_format", "--sample_log_interval", "2",
                      "--log_dir", str(out / "logs"), *extra)
    assert result.returncode == 0, result.stderr[-4000:]
    if output is not None:
        output.append(result.stdout + result.stderr)
    path = out / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_grpo_run_logs_every_published_name_on_its_cadence(tiny_assets, tmp_path):
    records = _grpo(tiny_assets, tmp_path, "--logging_steps", "2", "--logging_first_step")
    assert [r["step"] for r in records] == [1, 2, 4, 5]                   # first step, every 2nd, and the last
    for record in records:
        missing = [name for name in PUBLISHED if name not in record]
        assert not missing, missing
        for component in ("math_answer", "answer_format"):
            assert {f"train/rewards/{component}/{s}" for s in ("mean", "std", "p00", "p50", "p100")} <= record.keys()
        assert record["train/reward_p00"] <= record["train/reward_p50"] <= record["train/reward_p100"]
        assert record["train/clip_ratio/low_min"] <= record["train/clip_ratio/low_mean"]
        assert record["train/clip_ratio/high_mean"] <= record["train/clip_ratio/high_max"]
        assert record["train/beta"] == record["train/kl_coeff"] == 0.05
        assert 0 <= record["train/completions/diversity/jaccard"] <= 1
    assert [r["train/global_step"] for r in records] == [1, 2, 4, 5]      # one actor update per episode
    assert records[-1]["train/num_tokens"] > records[0]["train/num_tokens"] > 0
    table = json.loads((tmp_path / "logs" / "rich_completions" / "completions_step_000002.json").read_text())
    assert set(table) == {"columns", "data"} and all(len(row) == len(table["columns"]) for row in table["data"])

    output = []
    quiet = _grpo(tiny_assets, tmp_path / "quiet", "--logging_strategy", "no", "--config_file",
                  str(tmp_path / "quiet" / "config.json"), "--use_flash_attn", output=output)
    assert quiet == []
    assert json.loads((tmp_path / "quiet" / "config.json").read_text())["logging_strategy"] == "no"   # ColossalChat's
    assert output[0].count("warning: --use_flash_attn: FlashAttention-2 needs CUDA") == 1
