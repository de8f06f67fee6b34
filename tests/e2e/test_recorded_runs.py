"""The refactor guard: a fixed multi-turn GRPO command and a fixed PPO command (2 ranks, the `hf` engine, the demos'
CPU-kernel cap) sample the completions and log the metrics recorded from the code before the run-config refactor
(`tests/recorded/runs.json`), to a relative 1e-5. A change that moves a number fails here; one that should (a fixed
bug) records anew, saying why in its commit:

    PYTHONPATH=tests .venv/bin/python tests/e2e/test_recorded_runs.py   # rewrites tests/recorded/runs.json
"""
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from conftest import (REPO, SCRIPTS, assert_same_records, build_tiny_assets, build_turn_ender, torchrun,
                      train_records, unknown_metrics)

RECORD = REPO / "tests" / "recorded" / "runs.json"
KERNEL_CAP = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
"""The demos' cap (`applications/demo/run_demo.py`): the same numbers on CPUs with AVX-512 and without."""
EPISODES = 3


def run_args(algorithm: str, assets: Dict[str, Path], turn_ender: Path, out: Path) -> List[str]:
    """The fixed command's flags: GRPO with a KL to the reference, multi-turn with a tool every turn; PPO with a
    reward model, a function reward, two update passes and the ptx loss."""
    common = ["--prompt_dataset", str(assets["prompt_train"]), "--plugin", "ddp", "--batch_size", "2",
              "--max_new_tokens", "8", "--num_episodes", str(EPISODES), "--lr", "1e-3", "--seed", "7",
              "--sample_log_interval", "1", "--log_dir", str(out / "logs"), "--rollout_backend", "hf"]
    if algorithm == "grpo":
        return ["--pretrain", str(turn_ender), *common, "--num_generations", "4", "--kl_coef", "0.05", "--reward_fn",
                "math_answer", "answer_format", "--tools", "tool_timing:clock", "--tool_parser",
                "tool_timing:every_turn_a_call", "--max_turns", "3"]
    return ["--pretrain", str(assets["model"]), *common, "--rm_pretrain", str(assets["model"]), "--reward_fn",
            "answer_format", "--num_update_steps", "2", "--ptx_dataset", str(assets["sft_train"]), "--ptx_coef", "0.1"]


def sampled(log_dir: Path) -> List[Dict[str, Any]]:
    """Every sample table's rows (prompt, completion, rewards, advantage), by episode."""
    tables = sorted((log_dir / "rich_completions").glob("completions_step_*.json"))
    return [dict(zip(table["columns"], row)) for path in tables for table in [json.loads(path.read_text())]
            for row in table["data"]]


def run(algorithm: str, assets: Dict[str, Path], turn_ender: Path, out: Path) -> Dict[str, Any]:
    """The fixed command run now: its logged training metrics and its samples."""
    result = torchrun(SCRIPTS / f"train_{algorithm}.py", 2, *run_args(algorithm, assets, turn_ender, out),
                      PYTHONPATH=str(REPO / "tests"), **KERNEL_CAP)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"metrics": train_records(out / "logs"), "samples": sampled(out / "logs")}


def assert_same_samples(got: List[Dict[str, Any]], want: List[Dict[str, Any]]) -> None:
    """The same completions sampled, token for token, and their numbers within a relative 1e-5."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name, value in w.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert g[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
            else:
                assert g[name] == value, name


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_the_fixed_runs_sample_and_log_what_was_recorded_before_the_refactor(algorithm, tiny_assets, turn_ender,
                                                                             tmp_path):
    recorded = json.loads(RECORD.read_text())[algorithm]
    now = run(algorithm, tiny_assets, turn_ender, tmp_path)
    assert now["samples"] and any(row["completion"] for row in now["samples"])
    assert_same_samples(now["samples"], recorded["samples"])
    assert_same_records(now["metrics"], recorded["metrics"])
    assert not unknown_metrics(now["metrics"])


def record() -> None:
    """Run both fixed commands on freshly built assets and write what they sampled and logged to `RECORD`."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        assets = build_tiny_assets(root / "assets")
        turn_ender = build_turn_ender(assets, root / "turn_ender")
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
        runs = {"recorded_at": commit, **{name: run(name, assets, turn_ender, root / name) for name in ("grpo", "ppo")}}
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(runs, indent=1) + "\n")
    print(f"recorded {RECORD} at {commit}")


if __name__ == "__main__":
    sys.exit(record())
