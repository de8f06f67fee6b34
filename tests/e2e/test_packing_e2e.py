"""`--packing` and `--max_tokens_per_batch` as a user runs them: two torchrun processes give the losses of the unpacked
run, step for step; token-budget micro-batches resume exactly; a row over the budget is one error line naming it."""
import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from conftest import SCRIPTS, torchrun


def _run(script: str, data: Path, assets, out: Path, *extra: str):
    args = ["--pretrain", str(assets["model"]), "--dataset", str(data), "--plugin", "ddp", "--batch_size", "4",
            "--lr", "1e-3", "--log_interval", "1", "--log_dir", str(out / "logs"), "--seed", "3", *extra]
    return torchrun(SCRIPTS / script, 2, *args)


def _losses(out: Path):
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


@pytest.mark.slow
@pytest.mark.parametrize("script,data,extra", [
    ("train_sft.py", "sft_train", []),
    pytest.param("train_rm.py", "pref_train", [], marks=pytest.mark.extended),
    pytest.param("train_dpo.py", "pref_train", ["--precompute_ref_logps"], marks=pytest.mark.extended),
], ids=["sft", "rm", "dpo-precomputed-reference"])
def test_packed_run_logs_the_unpacked_losses(tiny_assets, tmp_path, script, data, extra):
    runs = {}
    own = shutil.copytree(tiny_assets[data], tmp_path / data)   # stored reference log-probs go beside the data
    for mode in ("packed", "padded"):   # packed first: it computes the stored reference log-probs, packed
        flags = ["--max_steps", "4", "--output_dir", str(tmp_path / mode / "final"), *extra]
        result = _run(script, own, tiny_assets, tmp_path / mode, *flags,
                      *(["--packing"] if mode == "packed" else []))
        assert result.returncode == 0, result.stderr[-3000:]
        runs[mode] = _losses(tmp_path / mode)
    assert list(runs["packed"]) == [1, 2, 3, 4]
    for step, loss in runs["padded"].items():
        assert runs["packed"][step] == pytest.approx(loss, rel=1e-5), step
    if script == "train_sft.py":   # an exported model does not pin eager attention
        assert AutoModelForCausalLM.from_pretrained(tmp_path / "packed" / "final" / "model").config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_token_budget_run_resumes_exactly(tiny_assets, tmp_path):
    budget = ["--packing", "--max_tokens_per_batch", "300", "--max_steps", "6"]
    whole = _run("train_sft.py", tiny_assets["sft_train"], tiny_assets, tmp_path / "whole", *budget,
                 "--save_dir", str(tmp_path / "ckpt"), "--save_interval", "3")
    assert whole.returncode == 0, whole.stderr[-3000:]
    middle = next((tmp_path / "ckpt").glob("*_step-3"))
    resumed = _run("train_sft.py", tiny_assets["sft_train"], tiny_assets, tmp_path / "resumed", *budget,
                   "--checkpoint_path", str(middle))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {middle}" in resumed.stdout + resumed.stderr
    expected, got = _losses(tmp_path / "whole"), _losses(tmp_path / "resumed")
    assert list(got) == [4, 5, 6]
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=1e-6), step


@pytest.mark.slow
def test_a_row_longer_than_the_budget_is_one_error_line(tiny_assets, tmp_path):
    result = _run("train_sft.py", tiny_assets["sft_train"], tiny_assets, tmp_path, "--packing",
                  "--max_tokens_per_batch", "10")
    assert result.returncode == 1 and "exitcode  : 2" in result.stderr, result.stderr[-2000:]
    errors = {line for line in result.stderr.splitlines() if line.startswith("error:")}
    assert len(errors) == 1, errors
    line = errors.pop()
    assert "tokens and fits no micro-batch; raise it, or cut rows with --max_length" in line
    assert f"traceback : {line}" in result.stderr and "To enable traceback" not in result.stderr
