"""Process reward models under torchrun: train_prm.py, then GRPO and PPO with its step scores."""
import json

import pytest

from conftest import SCRIPTS, torchrun


@pytest.fixture(scope="module")
def trained_prm(tiny_assets, tokenizer, tmp_path_factory):
    """train_prm.py under torchrun (2 ranks) on step-labelled demo solutions: (its output folder, its log folder)."""
    from coati.dataset.demo_data import generate_problems, prm_records, write_jsonl
    from coati.dataset.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("prm")
    for split, n in (("train", 64), ("eval", 16)):
        raw = write_jsonl(prm_records(generate_problems(n, split)), root / f"{split}.jsonl")
        prepare_dataset([raw], "prm", tokenizer, 128, root / split)
    result = torchrun(SCRIPTS / "train_prm.py", 2, "--pretrain", str(tiny_assets["model"]), "--dataset",
                      str(root / "train"), "--eval_dataset", str(root / "eval"), "--plugin", "ddp", "--batch_size", "8",
                      "--max_epochs", "2", "--lr", "1e-3", "--output_dir", str(root / "out"), "--log_dir",
                      str(root / "logs"))
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "out", root / "logs"


def test_train_prm_logs_step_metrics_and_exports_a_token_classifier_with_its_separator(trained_prm):
    out, logs = trained_prm
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForTokenClassification"] and config["step_separator"] == "\n"
    results = json.loads((out / "eval_result_epoch1.json").read_text())
    assert {"loss", "accuracy", "accuracy/step_1", "accuracy/step_2", "first_error_accuracy"} <= set(results)
    train = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train/loss"] for m in train if "train/loss" in m]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("script, extra", [("train_grpo.py", ["--adv_estimator", "process", "--num_generations", "3",
                                                              "--reward_fn", "math_answer"]),
                                           ("train_ppo.py", ["--critic_pretrain"])], ids=["grpo", "ppo"])
def test_rl_with_the_prms_step_scores_under_torchrun(tiny_assets, turn_ender, trained_prm, tmp_path, script, extra):
    if script == "train_ppo.py":
        extra = [*extra, str(tiny_assets["model"])]
    # the policy ends its turns early, so its completions end (a step cut off by the length limit is not scored)
    result = torchrun(SCRIPTS / script, 2, "--pretrain", str(turn_ender), "--prompt_dataset",
                      str(tiny_assets["prompt_train"]), "--plugin", "ddp", "--batch_size", "2", "--max_new_tokens", "8",
                      "--num_episodes", "2", "--prm_pretrain", str(trained_prm[0] / "model"), "--log_dir",
                      str(tmp_path / "logs"), *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    trained = [m for m in map(json.loads, (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines())
               if "train/loss" in m]
    assert len(trained) == 2
    assert all(m["train/rollout/prm_steps"] > 0 and 0 < m["train/rollout/prm_step_score"] < 1 for m in trained)
