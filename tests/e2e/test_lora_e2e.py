"""LoRA under two torchrun processes: only adapters train, the export is merged, and a resumed run matches."""
import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from coati.models.reward_model import load_reward_model, sequence_rewards
from conftest import SCRIPTS, torchrun

ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _train(script: str, assets, dataset: str, out: Path, *extra: str):
    # 96 rows over 2 ranks, micro-batch 8: 6 optimizer steps
    result = torchrun(SCRIPTS / script, 2, "--pretrain", str(assets["model"]), "--dataset", str(assets[dataset]),
                      "--plugin", "ddp", "--batch_size", "8", "--lr", "1e-2", "--lora_rank", "4", "--lora_alpha", "8",
                      "--log_interval", "1", "--save_interval", "3", "--save_dir", str(out / "ckpt"),
                      "--log_dir", str(out / "logs"), "--output_dir", str(out), *extra)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.mark.slow
def test_lora_sft_trains_adapters_only_exports_merged_and_resumes_exactly(tiny_assets, tmp_path):
    full = tmp_path / "full"
    _train("train_sft.py", tiny_assets, "sft_train", full)
    assert json.loads((full / "adapter" / "adapter_config.json").read_text())["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(full / "model").state_dict()
    assert merged.keys() == base.keys()
    changed = {name for name in base if not torch.equal(base[name], merged[name])}
    assert changed and all(name.split(".")[-2] in ADAPTED for name in changed)     # embeddings, norms, head untouched
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_assets["model"]), full / "adapter")
    for name, tensor in with_adapter.merge_and_unload().state_dict().items():
        assert torch.allclose(tensor, merged[name], atol=1e-6), name

    resumed = tmp_path / "resumed"
    _train("train_sft.py", tiny_assets, "sft_train", resumed, "--checkpoint_path", str(full / "ckpt" / "epoch-0_step-3"))
    again = AutoModelForCausalLM.from_pretrained(resumed / "model").state_dict()
    for name, tensor in merged.items():
        assert torch.allclose(tensor, again[name], atol=1e-6), name


@pytest.mark.slow
def test_lora_reward_model_keeps_its_trained_score_head(tiny_assets, tmp_path):
    _train("train_rm.py", tiny_assets, "pref_train", tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model").eval()
    rebuilt = PeftModel.from_pretrained(load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id),
                                        tmp_path / "adapter").merge_and_unload().eval()
    ids = torch.tensor([tokenizer.encode("Ann has 3 pens. 3 + 1 = 4. #### 4")])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.allclose(sequence_rewards(exported, ids, mask), sequence_rewards(rebuilt, ids, mask), atol=1e-5)
