"""GRPO on a generated code task with the `code_tests` reward, end to end under torchrun: SFT teaches the format,
GRPO's completions are run against each row's asserts in the sandbox, and the pass rate is logged."""
import json

import pytest

from conftest import SCRIPTS, torchrun


@pytest.fixture(scope="module")
def code_assets(tmp_path_factory):
    from transformers import AutoTokenizer

    from coati.dataset.demo_data import code_prompt_records, code_sft_records, generate_code_problems, write_jsonl
    from coati.dataset.prepare import prepare_dataset, prepare_sft
    from coati.models.tiny import write_tiny_model

    root = tmp_path_factory.mktemp("code")
    problems = generate_code_problems(160)
    model = write_tiny_model(root / "model", [p.question + " " + p.solution for p in problems])
    tokenizer = AutoTokenizer.from_pretrained(model)
    prepare_sft([write_jsonl(code_sft_records(problems[:128]), root / "sft.jsonl")], tokenizer, 96, root / "sft")
    prepare_dataset([write_jsonl(code_prompt_records(problems[128:]), root / "prompts.jsonl")], "prompt", tokenizer,
                    64, root / "prompts")
    return root


@pytest.mark.slow
@pytest.mark.extended
def test_grpo_learns_from_code_tests_and_logs_the_pass_rate(code_assets, tmp_path):
    sft = torchrun(SCRIPTS / "train_sft.py", 2, "--pretrain", str(code_assets / "model"), "--dataset",
                   str(code_assets / "sft"), "--plugin", "ddp", "--batch_size", "8", "--max_epochs", "24", "--lr", "3e-3",
                   "--warmup_steps", "5", "--output_dir", str(tmp_path / "sft"), "--log_dir", str(tmp_path / "sft_logs"))
    assert sft.returncode == 0, sft.stderr[-3000:]
    grpo = torchrun(SCRIPTS / "train_grpo.py", 2, "--pretrain", str(tmp_path / "sft" / "model"), "--prompt_dataset",
                    str(code_assets / "prompts"), "--eval_dataset", str(code_assets / "prompts"), "--plugin", "ddp",
                    "--reward_fn", "code_tests", "--num_generations", "4", "--batch_size", "2", "--num_episodes", "3",
                    "--max_new_tokens", "32", "--temperature", "0.5", "--eval_interval", "3", "--sandbox_timeout", "2",
                    "--log_dir", str(tmp_path / "logs"))
    assert grpo.returncode == 0, grpo.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 3
    for name in ("code_tests", "code_tests/pass_rate", "code_tests/no_code", "code_tests/cpu_time"):
        assert all(0 <= r[f"train/rewards/{name}/mean"] <= 1 for r in train)
    assert any(r["train/rewards/code_tests/no_code/mean"] < 1 for r in train)   # code blocks were run
    held_out = [r["eval/rewards/code_tests"] for r in records if "eval/rewards/code_tests" in r]
    assert held_out and max(held_out) > 0   # some greedy completions pass their asserts
