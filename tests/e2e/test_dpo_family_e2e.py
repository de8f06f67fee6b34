"""DPO, SimPO, ORPO and KTO scripts under two torchrun processes, from an SFT model, on generated data."""
import json
from pathlib import Path

import pytest
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.dataset import PreferenceCollator
from coati.dataset.demo_data import generate_problems, kto_records, preference_records, sft_records, write_jsonl
from coati.dataset.prepare import prepare_dataset
from coati.models.reference import pair_logps
from conftest import SCRIPTS, torchrun


@pytest.fixture(scope="module")
def sft_and_data(tiny_assets, tmp_path_factory):
    """An SFT model trained from the tiny model, and prepared preference and KTO train/eval sets."""
    root = tmp_path_factory.mktemp("dpo")
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    raw = {"sft": sft_records(generate_problems(1024, "train"))}
    for split, n in (("train", 1024), ("eval", 128)):
        raw[f"pref_{split}"] = preference_records(generate_problems(n, split), seed=n)
        raw[f"kto_{split}"] = kto_records(generate_problems(n, split), seed=n)
    paths = {}
    for name, records in raw.items():
        data_type = {"sft": "sft", "pref": "preference", "kto": "kto"}[name.split("_")[0]]
        prepare_dataset([write_jsonl(records, root / f"{name}.jsonl")], data_type, tokenizer, 128, root / name)
        paths[name] = root / name
    result = torchrun(SCRIPTS / "train_sft.py", 2, "--pretrain", str(tiny_assets["model"]), "--dataset", str(paths["sft"]),
                      "--plugin", "ddp", "--batch_size", "16", "--lr", "3e-3", "--warmup_steps", "3",
                      "--output_dir", str(root / "sft"))
    assert result.returncode == 0, result.stderr[-4000:]
    return {"sft_model": root / "sft" / "model", **paths}


def _run(script: str, assets, out: Path, data: str = "pref", *extra: str):
    # 1024 rows over 2 ranks, micro-batch 16: 32 optimizer steps
    result = torchrun(SCRIPTS / script, 2, "--pretrain", str(assets["sft_model"]), "--dataset", str(assets[f"{data}_train"]),
                      "--eval_dataset", str(assets[f"{data}_eval"]), "--plugin", "ddp", "--batch_size", "16",
                      "--lr", "1e-3", "--warmup_steps", "3", "--log_interval", "4", "--log_dir", str(out / "logs"),
                      "--save_dir", str(out / "ckpt"),
                      "--output_dir", str(out), *extra)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "train/loss" in r], json.loads((out / "eval_result_epoch0.json").read_text())


def _held_out_logp_margin(model_dir: Path, data: Path) -> float:
    """Mean log p(chosen) - log p(rejected) of a model on a prepared preference set."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    scores = pair_logps(model, PreferenceCollator(tokenizer.pad_token_id)(list(load_from_disk(str(data)))))
    return (scores["chosen_ref_logps"] - scores["rejected_ref_logps"]).mean().item()


@pytest.mark.slow
@pytest.mark.extended
def test_dpo_raises_held_out_reward_accuracy_and_log_prob_margin(sft_and_data, tmp_path):
    train, held_out = _run("train_dpo.py", sft_and_data, tmp_path)
    assert held_out["rewards/accuracies"] > 0.9 and held_out["rewards/margins"] > 0
    assert train[-1]["train/rewards/margins"] > train[0]["train/rewards/margins"]
    before = _held_out_logp_margin(sft_and_data["sft_model"], sft_and_data["pref_eval"])
    after = _held_out_logp_margin(tmp_path / "model", sft_and_data["pref_eval"])
    assert after > before + 5.0


def _by_step(records):
    return {r["step"]: {k: v for k, v in r.items() if k != "time"} for r in records}


@pytest.mark.slow
def test_precomputed_reference_matches_the_live_reference_and_resumes_exactly(sft_and_data, tmp_path):
    steps = ["--max_steps", "8", "--log_interval", "1", "--save_interval", "4"]
    live, _ = _run("train_dpo.py", sft_and_data, tmp_path / "live", "pref", *steps)
    stored, _ = _run("train_dpo.py", sft_and_data, tmp_path / "stored", "pref", *steps, "--precompute_ref_logps",
                     "--precompute_ref_batch_size", "3")   # TRL's name; the rows scored 3 at a time give the same
    assert list((sft_and_data["pref_train"] / "reference_logps").glob("*/info.json"))
    resumed, _ = _run("train_dpo.py", sft_and_data, tmp_path / "resumed", "pref", *steps, "--precompute_ref_logps",
                      "--checkpoint_path", str(tmp_path / "live" / "ckpt" / "epoch-0_step-4"))
    live, stored, resumed = _by_step(live), _by_step(stored), _by_step(resumed)
    assert sorted(live) == sorted(stored) == list(range(1, 9)) and sorted(resumed) == [5, 6, 7, 8]
    for step, record in live.items():
        for other in (stored, resumed):
            if step in other:
                for name, value in record.items():
                    if name.endswith("accuracies") and abs(record["train/rewards/margins"]) < 1e-4:
                        continue   # margins ~0 (the policy is the reference): their sign is rounding, layout by layout
                    assert other[step][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, name)


@pytest.mark.slow
@pytest.mark.extended
def test_simpo_orpo_and_kto_move_their_metrics_the_right_way(sft_and_data, tmp_path):
    simpo, _ = _run("train_dpo.py", sft_and_data, tmp_path / "simpo", "pref", "--loss_type", "simpo")
    assert simpo[-1]["train/rewards/margins"] > simpo[0]["train/rewards/margins"] + 1.0
    orpo, orpo_eval = _run("train_orpo.py", sft_and_data, tmp_path / "orpo")
    assert orpo[-1]["train/log_odds_ratio"] > orpo[0]["train/log_odds_ratio"] and orpo_eval["rewards/margins"] > 0
    assert orpo[-1]["train/nll_loss"] < orpo[0]["train/nll_loss"]
    kto, kto_eval = _run("train_kto.py", sft_and_data, tmp_path / "kto", "kto")
    gap = [r["train/rewards/chosen"] - r["train/rewards/rejected"] for r in kto]
    assert gap[-1] > gap[0] and kto_eval["rewards/chosen"] > kto_eval["rewards/rejected"]
    assert all(r["train/kl"] >= 0 for r in kto)
