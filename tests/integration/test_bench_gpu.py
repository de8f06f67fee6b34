"""The GPU benchmark's preparation, checked where there is no GPU: `benchmarks/bench_gpu.py` runs its CPU rows end to
end through the real training scripts and writes its table; its model shapes are the published models'; its FLOP
count is the formula it states; `tests/gpu/wheels.sh` gathers what `tests/gpu/bench.sh` installs."""
import importlib.util
import json
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO, child_env

BENCH = REPO / "benchmarks" / "bench_gpu.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shape, total", [("qwen3-0.6b", 596_049_920), ("qwen3-4b", 4_022_468_096),
                                          ("qwen2.5-7b", 7_615_616_512)])
def test_shapes_are_the_published_models(shape, total):
    """Each shape, built on the meta device, has its model's published parameter count (Qwen3-0.6B and -4B from their
    safetensors index, Qwen2.5-7B's 7.61B), and `matrix_params` counts its linear layers and output head."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    bench = _bench()
    widths = dict(bench.SHAPES[shape])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(widths.pop("model_type"), **widths))
    assert sum(p.numel() for p in model.parameters()) == total
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert bench.matrix_params(shape) == linear


def test_flops_per_token_is_the_stated_formula():
    bench = _bench()
    n = bench.matrix_params("qwen3-0.6b")
    attention = 28 * 16 * 128 * 3000.0
    sft = bench.Case("qwen3-0.6b", "sft")
    assert bench.flops_per_token(sft, 3000.0) == 6 * n + 6 * attention
    lora = bench.Case("qwen3-0.6b", "sft", flags=("--lora_rank", "16"))
    assert bench.flops_per_token(lora, 3000.0) == 4 * n + 6 * attention
    assert bench.flops_per_token(bench.Case("qwen3-0.6b", "grpo"), 3000.0, forwards=1) == 8 * n + 8 * attention


def test_the_table_shows_failed_rows_and_grpos_phases():
    bench = _bench()
    args = type("Args", (), {"peak_tflops": 989.0, "matmul_tflops": 798.0})()
    results = {"sft 0.6B ddp": {"tokens_per_s": 20000.0, "mfu_peak": 0.2, "mfu_matmul": 0.25, "peak_gpu_gib": 41.0,
                                "peak_cpu_gib": 3.2, "estimate": [39.5, 0.0]},
               "grpo 0.6B zero2": {"tokens_per_s": 9000.0, "step_tokens_per_s": 3000.0, "generation_tokens_per_s": 800.0,
                                   "s_per_episode": 12.5, "mfu_peak": 0.1, "mfu_matmul": 0.12, "peak_gpu_gib": 30.0,
                                   "peak_cpu_gib": 4.0, "estimate": [28.0, 0.0]},
               "trl sft 0.6B": {"error": "ModuleNotFoundError: No module named 'trl'"}}
    lines = bench.table(results, args)
    assert lines[2] == "| sft 0.6B ddp | 20,000 | 20.0% / 25.0% | 41.0 | 3.2 | 39.5 / 0.0 |"
    assert lines[3] == "| grpo 0.6B zero2, learning | 9,000 | 10.0% / 12.0% | 30.0 | 4.0 | 28.0 / 0.0 |"
    assert lines[4].startswith("| grpo 0.6B zero2, whole step (12.5 s/episode) | 3,000 |")
    assert lines[5].startswith("| grpo 0.6B zero2, generation (`hf` engine, completion tokens) | 800 |")
    assert lines[6].startswith("| trl sft 0.6B | failed: ModuleNotFoundError")


def test_the_estimates_alone_say_what_one_80_gb_gpu_takes(tmp_path):
    """`--estimate_only` from the configs alone: full fine-tuning of the 7B shape on gemini's static placement is
    refused on one 80 GB card (16 bytes a parameter), gemini_auto takes it with CPU memory, zero2_cpu and LoRA fit."""
    done = subprocess.run([sys.executable, str(BENCH), "--estimate_only", "--out", str(tmp_path), "--cases",
                           "sft 7B gemini", "sft 7B gemini_auto", "sft 7B zero2_cpu", "sft 7B LoRA 16 zero2"],
                          capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in done.stdout.splitlines()[2:]}
    params = 7_615_616_512
    assert rows["sft 7B gemini"][1].startswith(f"{(16 * params + 0.75 * 2**30) / 2**30:.1f} / 0.0")
    assert rows["sft 7B gemini"][3] == "refused |"
    assert rows["sft 7B gemini_auto"][3].startswith("with ") and rows["sft 7B zero2_cpu"][3] == "fits |"
    assert rows["sft 7B LoRA 16 zero2"][3] == "fits |"


def test_a_failed_row_says_why_in_one_line():
    bench = _bench()
    torchrun_report = ("error: this run cannot fit: ...\nTraceback (most recent call last):\n  File x\n"
                       "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n  traceback : error: this "
                       "run cannot fit: ...\n=====\n")
    assert bench.failure_line(torchrun_report) == "error: this run cannot fit: ..."
    assert bench.failure_line("Traceback\n  File y\nValueError: bad thing\n====\n") == "ValueError: bad thing"
    assert bench.failure_line("killed\n") == "killed"


@pytest.mark.slow
@pytest.mark.extended
def test_the_cpu_rows_run_the_training_scripts_and_write_the_table(tmp_path):
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, str(BENCH), "--group", "cpu_check", "--out", str(out), "--seq_len", "512",
                           "--steps", "2", "--max_new_tokens", "16"], capture_output=True, text=True, env=child_env(),
                          cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((out / "results.json").read_text())
    assert saved["versions"]["device"] == "cpu" and set(saved["results"]) == {
        "sft tiny ddp", "sft tiny ddp, padded rows", "grpo tiny ddp"}
    for name, row in saved["results"].items():
        assert "error" not in row, (name, row)
        assert row["tokens_per_s"] > 0 and row["peak_cpu_gib"] > 0 and row["peak_gpu_gib"] is None
        assert row["estimate"][0] > 0 and row["estimate"][1] == 0
    grpo = saved["results"]["grpo tiny ddp"]
    assert grpo["generation_tokens_per_s"] > 0 and grpo["step_tokens_per_s"] < grpo["tokens_per_s"]
    assert (out / "runs" / "sft-tiny-ddp-padded-rows" / "run.log").is_file()
    table = (out / "table.md").read_text().splitlines()
    assert table[0].startswith("cpu, torch ") and "`python benchmarks/bench_gpu.py --group cpu_check" in table[0]
    assert table[2].startswith("| row | tokens/s | MFU (of 989 / 798 TFLOP/s) |") and len(table) == 9


@pytest.mark.extended
def test_wheels_gathers_coati_and_trl_for_the_gpu_machine(tmp_path):
    """What check.sh and bench.sh install, for Python 3.12: coati's stack at the top, TRL with datasets in trl/, all
    of it under the 64 MiB one device call carries."""
    folder = tmp_path / "whl"
    done = subprocess.run(["bash", str(REPO / "tests" / "gpu" / "wheels.sh"), str(folder)], capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    top = {path.name.split("-")[0] for path in folder.glob("*.whl")}
    assert {"transformers", "colossalai", "datasets", "peft", "bitsandbytes"} <= top
    assert {path.name.split("-")[0] for path in (folder / "trl").glob("*.whl")} >= {"trl", "datasets", "math_verify"}
    assert sum(path.stat().st_size for path in folder.rglob("*.whl")) < 64 * 2**20
    for wheel in folder.rglob("*.whl"):
        assert zipfile.ZipFile(wheel).testzip() is None
