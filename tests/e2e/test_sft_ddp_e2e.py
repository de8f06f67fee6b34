"""Two torchrun processes train the tiny model through SLTrainer; a resumed run matches an uninterrupted one."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from datasets import load_from_disk
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.dataset import SupervisedCollator
from coati.dataset.demo_data import generate_problems, sft_records, write_jsonl
from coati.dataset.prepare import prepare_sft
from conftest import SCRIPTS, checkpoint_names, torchrun


def _sft(assets, out: Path, *extra: str):
    # 96 rows over 2 ranks, micro-batch 8, accumulation 2: 6 micro-batches a rank -> 3 optimizer steps an epoch
    args = ["--pretrain", str(assets["model"]), "--dataset", str(assets["sft_train"]), "--plugin", "ddp",
            "--batch_size", "8", "--accumulation_steps", "2", "--max_epochs", "2", "--lr", "1e-3",
            "--log_interval", "1", "--save_interval", "2", "--save_dir", str(out / "ckpt"),
            "--log_dir", str(out / "logs"), "--output_dir", str(out / "final"), *extra]
    result = torchrun(SCRIPTS / "train_sft.py", 2, *args)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _held_out_loss(model_dir: Path, data: Path) -> float:
    """Token-mean next-token loss of `model_dir` on a prepared SFT set, computed here, outside coati's trainer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    batch = SupervisedCollator(tokenizer.pad_token_id)(list(load_from_disk(str(data))))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100).item()


def _jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _weights(model_dir: Path):
    shards = sorted(model_dir.glob("*.safetensors"))
    state = {}
    for shard in shards:
        state.update(load_file(shard))
    return state


@pytest.mark.slow
def test_two_process_run_logs_checkpoints_and_resumes_exactly(tiny_assets, tmp_path):
    full = tmp_path / "full"
    _sft(tiny_assets, full, "--eval_dataset", str(tiny_assets["sft_eval"]))
    records = [r for r in _jsonl(full / "logs" / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    evaluated = json.loads((full / "final" / "eval_result_epoch1.json").read_text())["loss"]
    assert evaluated == pytest.approx(_held_out_loss(full / "final" / "model", tiny_assets["sft_eval"]), rel=1e-4)
    assert records[-1]["train/loss"] < records[0]["train/loss"]
    assert list((full / "logs" / "tensorboard").glob("events.out.tfevents.*"))
    checkpoints = checkpoint_names(full / "ckpt")
    assert checkpoints == ["epoch-0_step-2", "epoch-1_step-4", "epoch-2_step-6"]
    mid = full / "ckpt" / "epoch-0_step-2"
    assert (mid / "COMPLETE").is_file() and (mid / "rng_state_rank1.pt").is_file()
    assert json.loads((mid / "running_states.json").read_text())["sample_start_index"] == 32   # 4 micro-batches of 8

    resumed = tmp_path / "resumed"
    result = _sft(tiny_assets, resumed, "--checkpoint_path", str(mid))
    assert "resumed from" in result.stdout + result.stderr
    resumed_records = _jsonl(resumed / "logs" / "metrics.jsonl")
    assert [r["step"] for r in resumed_records] == [3, 4, 5, 6]
    for a, b in zip(records[2:], resumed_records):
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-6)   # the same next unseen batches

    final_full, final_resumed = _weights(full / "final" / "model"), _weights(resumed / "final" / "model")
    assert final_full.keys() == final_resumed.keys()
    for name, tensor in final_full.items():
        assert torch.allclose(tensor, final_resumed[name], atol=1e-6), name
    model = AutoModelForCausalLM.from_pretrained(full / "final" / "model")
    assert torch.equal(model.state_dict()["lm_head.weight"], final_full["lm_head.weight"])


@pytest.mark.slow
def test_sft_lowers_held_out_loss_well_below_its_start(tiny_assets, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    raw = write_jsonl(sft_records(generate_problems(1024, "train")), tmp_path / "train.jsonl")
    prepare_sft([raw], tokenizer, 128, tmp_path / "train")
    result = torchrun(SCRIPTS / "train_sft.py", 2, "--pretrain", str(tiny_assets["model"]), "--dataset", str(tmp_path / "train"),
                      "--eval_dataset", str(tiny_assets["sft_eval"]), "--plugin", "ddp", "--batch_size", "16",
                      "--lr", "3e-3", "--warmup_steps", "3", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-4000:]
    before = _held_out_loss(tiny_assets["model"], tiny_assets["sft_eval"])
    after = json.loads((tmp_path / "out" / "eval_result_epoch0.json").read_text())["loss"]
    assert after < 0.5 * before
