"""coati's trainer on one GPU at the shapes the peers publish: tokens/s, MFU, peak GPU and CPU memory, and the memory
estimate (`coati.distributed.memory`) beside each measured row.

    python benchmarks/bench_gpu.py --out $OUT/bench                      # on a GPU machine: tests/gpu/bench.sh
    python benchmarks/bench_gpu.py --group large --out $OUT/bench        # 4B LoRA, 7B SFT (large_grpo: 7B GRPO)
    python benchmarks/bench_gpu.py --group cpu_check --out /tmp/bench    # this script's own check, on a CPU
    python benchmarks/bench_gpu.py --group cpu_memory --seq_len 4096     # the memory estimate against a CPU run
    python benchmarks/bench_gpu.py --group estimate --estimate_only      # the estimates alone, up to 14B, no run

Each model is built from its config alone (Qwen3-0.6B's and Qwen3-4B's shapes, Qwen2.5-7B's; no download):
initialised on the meta device, materialised and randomly initialised on the GPU in bf16, then saved, so that
the runs load it as a user's would. Each row is a fresh launch of the real training script on one process
(`torchrun --nproc_per_node 1`, as `coati sft` runs it): SFT on conversations of about `--seq_len` tokens, packed
into micro-batches of `--seq_len` tokens (`--packing --max_tokens_per_batch`), and the same rows padded; GRPO with
the `hf` engine, a reference model (`--kl_coef`), packed learning; TRL's SFT (padding-free) and GRPO on the same model
and rows when `--trl_python` has TRL. Reported per row, over the steps after the first:
- tokens/s: SFT, the trainer's own count (`learn/tokens_per_s`); GRPO learning, the tokens learned on over the
  learning, old-policy and reference forwards' seconds; the whole GRPO step, over the episode's seconds; generation,
  the completion tokens over the generation seconds;
- MFU: model FLOPs per token (6N for a trained model, 4N with LoRA's frozen weights, 2N for each forward without
  gradients; N the matrix parameters, the output head included) plus causal attention's (6·L·Q·l for a row of l
  tokens, Q the query width), over `--peak_tflops` (the H100's and H200's dense bf16, 989) and over `--matmul_tflops`
  (what a bf16 matrix product measured on the lent card, 798);
- peak GPU memory (`nvidia-smi`, the whole card, sampled every 0.2 s) and peak CPU memory (the launch's largest RSS);
- the estimate of the memory the run needs, on the GPU and in CPU memory, for that row's flags.
Results go to `--out/results.json` and `--out/table.md`. A benchmark, not a test.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
SCRIPTS = REPO / "examples" / "training_scripts"
TRL_WORKER = HERE.parent / "trl_worker.py"
TOKENS_PER_S = re.compile(r"learn/tokens_per_s=([0-9.e+]+)")
PEAK_RSS = re.compile(r"^PEAK_RSS_KB (\d+)$", re.M)

SHAPES: Dict[str, Dict[str, Any]] = {
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True),
    "qwen3-4b": dict(model_type="qwen3", hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "qwen2.5-14b": dict(model_type="qwen2", hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False),
    "llama-100m": dict(model_type="llama", hidden_size=768, intermediate_size=2304, num_hidden_layers=14,
                       num_attention_heads=12, num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False),
    "tiny": dict(model_type="llama", hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=False),
}
"""Model shapes by name: the published models' configs (Qwen3-0.6B, Qwen3-4B, Qwen2.5-7B and -14B), the demo's `100m`
size at a 32k vocabulary (the memory estimate's check on a CPU), and a tiny one for the script's check on a CPU."""


@dataclass(frozen=True)
class Case:
    """One measured row: `runner` (sft, grpo, trl_sft, trl_grpo) on the model of `shape` with `plugin` and `flags`."""

    shape: str
    runner: str
    plugin: str = "ddp"
    flags: Tuple[str, ...] = ()
    padded: bool = False


CASES: Dict[str, Case] = {
    "sft 0.6B ddp": Case("qwen3-0.6b", "sft", "ddp"),
    "sft 0.6B zero2": Case("qwen3-0.6b", "sft", "zero2"),
    "sft 0.6B gemini": Case("qwen3-0.6b", "sft", "gemini"),
    "sft 0.6B zero2, padded rows": Case("qwen3-0.6b", "sft", "zero2", padded=True),
    "grpo 0.6B zero2": Case("qwen3-0.6b", "grpo", "zero2"),
    "trl sft 0.6B": Case("qwen3-0.6b", "trl_sft"),
    "trl grpo 0.6B": Case("qwen3-0.6b", "trl_grpo"),
    "sft 4B LoRA 16 zero2": Case("qwen3-4b", "sft", "zero2", ("--lora_rank", "16", "--grad_checkpoint")),
    "sft 7B gemini": Case("qwen2.5-7b", "sft", "gemini", ("--grad_checkpoint",)),
    "sft 7B gemini_auto": Case("qwen2.5-7b", "sft", "gemini_auto", ("--grad_checkpoint",)),
    "sft 7B zero2_cpu": Case("qwen2.5-7b", "sft", "zero2_cpu", ("--grad_checkpoint",)),
    "sft 7B LoRA 16 zero2": Case("qwen2.5-7b", "sft", "zero2", ("--lora_rank", "16", "--grad_checkpoint")),
    "grpo 7B zero2_cpu": Case("qwen2.5-7b", "grpo", "zero2_cpu", ("--grad_checkpoint",)),
    "grpo 7B LoRA 16 zero2": Case("qwen2.5-7b", "grpo", "zero2", ("--lora_rank", "16", "--grad_checkpoint")),
    "sft 14B gemini_auto": Case("qwen2.5-14b", "sft", "gemini_auto", ("--grad_checkpoint",)),
    "sft 14B zero2_cpu": Case("qwen2.5-14b", "sft", "zero2_cpu", ("--grad_checkpoint",)),
    "sft 14B LoRA 16 zero2": Case("qwen2.5-14b", "sft", "zero2", ("--lora_rank", "16", "--grad_checkpoint")),
    "sft tiny ddp": Case("tiny", "sft"),
    "sft tiny ddp, padded rows": Case("tiny", "sft", padded=True),
    "grpo tiny ddp": Case("tiny", "grpo"),
    "trl sft tiny": Case("tiny", "trl_sft"),
    "sft 100M ddp": Case("llama-100m", "sft"),
    "sft 100M ddp, grad checkpoint": Case("llama-100m", "sft", flags=("--grad_checkpoint",)),
}
GROUPS = {
    "anchors": ["sft 0.6B ddp", "sft 0.6B zero2", "sft 0.6B gemini", "sft 0.6B zero2, padded rows", "grpo 0.6B zero2",
                "trl sft 0.6B", "trl grpo 0.6B"],
    "large": ["sft 4B LoRA 16 zero2", "sft 7B gemini", "sft 7B gemini_auto", "sft 7B zero2_cpu"],
    "large_grpo": ["sft 7B LoRA 16 zero2", "grpo 7B zero2_cpu", "grpo 7B LoRA 16 zero2"],
    "cpu_check": ["sft tiny ddp", "sft tiny ddp, padded rows", "grpo tiny ddp"],
    "cpu_memory": ["sft 100M ddp", "sft 100M ddp, grad checkpoint"],
    "estimate": ["sft 0.6B ddp", "sft 0.6B zero2", "sft 0.6B gemini", "grpo 0.6B zero2", "sft 4B LoRA 16 zero2",
                 "sft 7B gemini", "sft 7B gemini_auto", "sft 7B zero2_cpu", "sft 7B LoRA 16 zero2", "grpo 7B zero2_cpu",
                 "grpo 7B LoRA 16 zero2", "sft 14B gemini_auto", "sft 14B zero2_cpu", "sft 14B LoRA 16 zero2"],
}
GRPO = {"batch_size": 8, "num_generations": 8, "train_batch_size": 16, "kl_coef": 0.04}
"""GRPO rows: prompts per step, completions per prompt, completions per learning micro-batch, the KL weight (a
reference model in memory and its forward timed)."""


# ---- inputs ----------------------------------------------------------------------------------------------------
def build_model(shape: str, folder: Path, tokenizer: Any, device: str) -> Path:
    """The model of `shape`, initialised on the meta device and materialised on `device` in bf16 (fp32 on a CPU)
    with random weights, saved with `tokenizer` into `folder`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (folder / "config.json").is_file():
        return folder
    widths = dict(SHAPES[shape])
    dtype = "bfloat16" if device == "cuda" else "float32"
    config = AutoConfig.for_model(widths.pop("model_type"), **widths, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  max_position_embeddings=32768, torch_dtype=dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype))
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_data(out: Path, seq_len: int, rows: int) -> Dict[str, Any]:
    """A tokenizer, `rows` SFT conversations of `seq_len` / 8 to `seq_len` / 2 tokens (solved arithmetic problems, one
    a turn), prepared, so that packing fills micro-batches of `seq_len` tokens with a few rows each; GRPO prompts; and
    each SFT row's length."""
    import random

    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from coati.dataset.demo_data import generate_problems, prompt_records, tokenizer_corpus, write_jsonl
    from coati.dataset.prepare import prepare_dataset, prepare_sft
    from coati.dataset.sampler import row_tokens
    from coati.models.tiny import train_tokenizer

    if (out / "data.json").is_file():
        return json.loads((out / "data.json").read_text())
    tokenizer_dir = out / "tokenizer"
    train_tokenizer(tokenizer_corpus(), 384).save_pretrained(tokenizer_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    problems = generate_problems(4000, "train")
    per_problem = statistics.mean(len(tokenizer(p.question + p.solution)["input_ids"]) + 8 for p in problems[:50])
    rng = random.Random(0)
    conversations = []
    for _ in range(rows):
        count = max(1, round(rng.uniform(seq_len / 8, seq_len / 2) / per_problem))
        turns = [problems[rng.randrange(len(problems))] for _ in range(count)]
        conversations.append({"messages": [message for p in turns for message in (
            {"role": "user", "content": p.question}, {"role": "assistant", "content": p.solution})]})
    prepare_sft([write_jsonl(conversations, out / "raw" / "sft.jsonl")], tokenizer, seq_len, out / "sft")
    prepare_dataset([write_jsonl(prompt_records(problems[:256]), out / "raw" / "prompt.jsonl")], "prompt", tokenizer,
                    256, out / "prompt")
    data = {"tokenizer": str(tokenizer_dir), "sft": str(out / "sft"), "prompt": str(out / "prompt"),
            "sft_lengths": list(row_tokens(load_from_disk(str(out / "sft"))))}
    (out / "data.json").write_text(json.dumps(data))
    return data


# ---- the launches ----------------------------------------------------------------------------------------------
class GpuMemoryPeak:
    """The largest memory in use on GPU 0 while the context is open, sampled with `nvidia-smi` (None without one)."""

    def __enter__(self) -> "GpuMemoryPeak":
        self.peak_mib: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip():
                self.peak_mib = max(self.peak_mib or 0.0, float(done.stdout.split()[0]))
            self._stop.wait(0.2)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def rows_per_batch(args: argparse.Namespace, data: Dict[str, Any]) -> int:
    """SFT rows that hold about `--seq_len` tokens: the padded rows' and TRL's batch size."""
    return max(1, round(args.seq_len / statistics.mean(data["sft_lengths"])))


def _sft_flags(case: Case, args: argparse.Namespace, data: Dict[str, Any]) -> List[str]:
    batching = (["--batch_size", str(rows_per_batch(args, data))] if case.padded else
                ["--packing", "--max_tokens_per_batch", str(args.seq_len), "--batch_size", "1024"])
    return ["--dataset", data["sft"], "--max_length", str(args.seq_len), "--max_steps", str(args.steps), *batching]


def _grpo_flags(args: argparse.Namespace, data: Dict[str, Any]) -> List[str]:
    return ["--prompt_dataset", data["prompt"], "--max_length", "256", "--reward_fn", "math_answer", "--num_episodes",
            str(args.steps), "--batch_size", str(GRPO["batch_size"]), "--num_generations", str(GRPO["num_generations"]),
            "--train_batch_size", str(GRPO["train_batch_size"]), "--kl_coef", str(GRPO["kl_coef"]),
            "--max_new_tokens", str(args.max_new_tokens), "--packing", "--sample_log_interval", "0"]


def coati_flags(case: Case, model: Path, run_dir: Path, args: argparse.Namespace, data: Dict[str, Any]) -> List[str]:
    """The training script's flags for `case`."""
    common = ["--pretrain", str(model), "--plugin", case.plugin, "--mixed_precision", "bf16", "--seed", "0", "--lr",
              "1e-5", "--log_interval", "1", "--log_dir", str(run_dir / "logs"), *case.flags]
    return common + (_sft_flags(case, args, data) if case.runner == "sft" else _grpo_flags(args, data))


def coati_command(case: Case, model: Path, run_dir: Path, args: argparse.Namespace, data: Dict[str, Any]) -> List[str]:
    """The training script's command line for `case`, on one process."""
    script = "train_sft.py" if case.runner == "sft" else "train_grpo.py"
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(SCRIPTS / script),
            *coati_flags(case, model, run_dir, args, data)]


def trl_command(case: Case, model: Path, run_dir: Path, args: argparse.Namespace, data: Dict[str, Any]) -> List[str]:
    """benchmarks/trl_worker.py's command line for `case`, on the device the machine has."""
    batch = rows_per_batch(args, data) if case.runner == "trl_sft" else GRPO["batch_size"]
    task = {"trl_sft": ("sft", data["sft"]), "trl_grpo": ("grpo", data["prompt"])}[case.runner]
    return [args.trl_python, str(TRL_WORKER), "--task", task[0], "--model", str(model), "--data", task[1],
            "--worker_out", str(run_dir), "--steps", str(args.steps), "--batch_size", str(batch), "--prompts",
            str(GRPO["batch_size"]), "--num_generations", str(GRPO["num_generations"]), "--max_new_tokens",
            str(args.max_new_tokens), "--beta", str(GRPO["kl_coef"]), *(["--gpu"] if args.device == "cuda" else [])]


def launch(name: str, case: Case, model: Path, args: argparse.Namespace, data: Dict[str, Any]) -> Dict[str, Any]:
    """Run `case` once and read its numbers back."""
    run_dir = Path(args.out) / "runs" / re.sub(r"[^A-Za-z0-9.]+", "-", name)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = (trl_command if case.runner.startswith("trl") else coati_command)(case, model, run_dir, args, data)
    wrapper = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
               "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    path = ([args.trl_pythonpath] if case.runner.startswith("trl") and args.trl_pythonpath else
            [str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    with GpuMemoryPeak() as gpu:
        try:
            done = subprocess.run([sys.executable, "-c", wrapper, *command], capture_output=True, text=True, env=env,
                                  cwd=run_dir, timeout=args.timeout)
        except subprocess.TimeoutExpired as expired:
            said = f"{expired.stdout or ''}{expired.stderr or ''}"
            (run_dir / "run.log").write_text(" ".join(command) + "\n" + said)
            return {"error": f"timed out after {args.timeout} s"}
    output = done.stdout + done.stderr
    (run_dir / "run.log").write_text(" ".join(command) + "\n" + output)
    if done.returncode:
        return {"error": failure_line(output) or f"exit {done.returncode}"}
    numbers = {"peak_gpu_gib": gpu.peak_mib / 1024 if gpu.peak_mib is not None else None,
               "peak_cpu_gib": int(PEAK_RSS.search(done.stdout).group(1)) / 2**20}
    if case.runner == "sft":
        numbers["tokens_per_s"] = float(TOKENS_PER_S.findall(output)[-1])
    elif case.runner == "grpo":
        numbers.update(grpo_rates(run_dir / "logs" / "metrics.jsonl"))
    else:
        numbers["tokens_per_s"] = trl_rate(run_dir)
    return numbers


def failure_line(output: str) -> str:
    """The line that says why a launch failed: coati's `error:` line (torchrun's report repeats it), else the last
    exception's, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("error: ")]
    raised = [line for line in lines if re.match(r"^\w+(Error|Exception)\b", line)]
    return (ours or raised or lines or [""])[-1]


def grpo_rates(metrics: Path) -> Dict[str, float]:
    """Tokens/s of a GRPO run's learning (learning, and the old-policy and reference forwards where they ran), of
    whole episodes, and of generation (completion tokens), over its episodes after the first."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "train/num_tokens" in r]
    later = steps[1:]
    tokens = steps[-1]["train/num_tokens"] - steps[0]["train/num_tokens"]
    forwards = [phase for phase in ("actor_forward", "reference_forward")
                if any(r.get(f"train/time/{phase}") for r in later)]
    learning = sum(r.get(f"train/time/{phase}", 0.0) for r in later for phase in ("learning", *forwards))
    completions = GRPO["batch_size"] * GRPO["num_generations"]
    generated = sum(r["train/avg_completion_tokens"] * completions for r in later)
    return {"tokens_per_s": tokens / learning, "step_tokens_per_s": tokens / (steps[-1]["time"] - steps[0]["time"]),
            "generation_tokens_per_s": generated / sum(r["train/time/generation"] for r in later),
            "s_per_episode": (steps[-1]["time"] - steps[0]["time"]) / len(later),
            "tokens_per_episode": tokens / len(later), "forwards_without_gradients": len(forwards)}


def trl_rate(run_dir: Path) -> float:
    """TRL's tokens/s over its steps after the first (benchmarks/trl_worker.py's record)."""
    record = json.loads((run_dir / "rank0.json").read_text())
    return sum(record["tokens"][1:]) / (record["times"][-1] - record["times"][0])


# ---- FLOPs and the estimate ------------------------------------------------------------------------------------
def matrix_params(shape: str) -> int:
    """Parameters of the model's matrix products per token: every linear layer's, the output head's (tied or not)."""
    s = SHAPES[shape]
    head_dim = s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
    q, kv = s["num_attention_heads"] * head_dim, s["num_key_value_heads"] * head_dim
    layer = s["hidden_size"] * (2 * q + 2 * kv) + 3 * s["hidden_size"] * s["intermediate_size"]
    return s["num_hidden_layers"] * layer + s["vocab_size"] * s["hidden_size"]


def flops_per_token(case: Case, mean_context: float, forwards: int = 0) -> float:
    """Model FLOPs a token costs in `case`'s timed work: its matrices' 6N trained (4N with LoRA: no weight gradients of
    the frozen ones) and causal attention's 6·L·Q·l (l the token-weighted mean row length, `mean_context`), plus
    2N + 2·L·Q·l for each of `forwards` forwards without gradients (GRPO's reference and old policy)."""
    s = SHAPES[case.shape]
    q = s["num_attention_heads"] * (s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"])
    matrices, attention = matrix_params(case.shape), s["num_hidden_layers"] * q * mean_context
    trained = (4 if "--lora_rank" in case.flags else 6) * matrices + 6 * attention
    return trained + 2 * (matrices + attention) * forwards


def mean_context(case: Case, args: argparse.Namespace, data: Dict[str, Any]) -> float:
    """The token-weighted mean row length the rows attend over (sum l² / sum l)."""
    if case.runner.endswith("grpo"):
        return 100 + args.max_new_tokens
    lengths = data["sft_lengths"]
    return sum(n * n for n in lengths) / sum(lengths)


def estimate(case: Case, model: Path, args: argparse.Namespace, data: Dict[str, Any], half: int) -> Any:
    """`coati.distributed.memory`'s estimate for `case`'s run on one process, from the same flags, at `half` bytes a
    value (None for TRL's rows)."""
    if case.runner.startswith("trl"):
        return None
    from coati.cli.arguments import run_config_from
    from coati.cli.commands import command_parser
    from coati.distributed.memory import estimate_run, model_shape
    from coati.utils.file_checks import read_json

    parser = command_parser("sft" if case.runner == "sft" else "grpo")
    run = run_config_from(parser.parse_args(coati_flags(case, model, Path(args.out), args, data)), parser.run_config)
    shape = model_shape(str(model), read_json(model / "config.json", "config"), run.lora)
    return estimate_run(run, {str(model): shape}, half, 1)


def gib_totals(result: Any) -> Tuple[float, float]:
    """(GPU, CPU) GiB of an estimate."""
    from coati.distributed.memory import GIB

    return sum(result.device.values()) / GIB, sum(result.host.values()) / GIB


def estimates_only(names: List[str], args: argparse.Namespace) -> List[str]:
    """The estimate of each row in bf16 on one GPU of `args.gpu_gib` GiB free, from the shapes' configs alone (no
    weights, no run): what it holds before any activation and in all, and whether `coati` would refuse it there."""
    from coati.distributed.memory import STATE_PARTS, GIB

    data = {"sft": "SFT_DATA", "prompt": "PROMPTS", "sft_lengths": [args.seq_len]}
    lines = [f"| row | before activations, GPU / CPU GiB | in all, GPU / CPU GiB | on a GPU with {args.gpu_gib:g} GiB "
             "free |", "|---|---|---|---|"]
    for name in names:
        case = CASES[name]
        folder = Path(args.out) / "configs" / case.shape
        write_config(case.shape, folder)
        result = estimate(case, folder, args, data, half=2)
        states = [sum(part.get(p, 0.0) for p in STATE_PARTS) / GIB for part in (result.device, result.host)]
        gpu, cpu = gib_totals(result)
        if case.plugin == "gemini_auto":   # what the GPU cannot hold besides the activations goes to CPU memory
            verdict = f"with {gpu - args.gpu_gib:.0f} GiB of CPU memory" if gpu > args.gpu_gib else "fits"
        else:
            verdict = ("refused" if states[0] > args.gpu_gib else "may not fit (a warning)" if gpu > args.gpu_gib
                       else "fits")
        lines.append(f"| {name} | {states[0]:.1f} / {states[1]:.1f} | {gpu:.1f} / {cpu:.1f} | {verdict} |")
    return lines


def write_config(shape: str, folder: Path) -> None:
    """The config of `shape` alone in `folder`: what the estimate reads where there are no weights."""
    from transformers import AutoConfig

    widths = dict(SHAPES[shape])
    AutoConfig.for_model(widths.pop("model_type"), **widths).save_pretrained(folder)


# ---- the table -------------------------------------------------------------------------------------------------
def table(results: Dict[str, Dict[str, Any]], args: argparse.Namespace) -> List[str]:
    """The markdown table of `results`: a row per case, and for GRPO its whole step and generation too."""
    lines = [f"| row | tokens/s | MFU (of {args.peak_tflops:g} / {args.matmul_tflops:g} TFLOP/s) | peak GPU GiB | "
             "peak CPU GiB | estimate GPU / CPU GiB |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:120]} | | | | |")
            continue
        mfu = (f"{r['mfu_peak']:.1%} / {r['mfu_matmul']:.1%}" if r.get("mfu_peak") is not None else "–")
        gpu = f"{r['peak_gpu_gib']:.1f}" if r.get("peak_gpu_gib") is not None else "–"
        est = f"{r['estimate'][0]:.1f} / {r['estimate'][1]:.1f}" if r.get("estimate") else "–"
        label = f"{name}, learning" if "step_tokens_per_s" in r else name
        lines.append(f"| {label} | {r['tokens_per_s']:,.0f} | {mfu} | {gpu} | {r['peak_cpu_gib']:.1f} | {est} |")
        if "step_tokens_per_s" in r:
            lines.append(f"| {name}, whole step ({r['s_per_episode']:.1f} s/episode) | {r['step_tokens_per_s']:,.0f} | "
                         "| | | |")
            lines.append(f"| {name}, generation (`hf` engine, completion tokens) | {r['generation_tokens_per_s']:,.0f} "
                         "| | | | |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/bench_gpu", help="models, data, runs, results.json and table.md")
    parser.add_argument("--group", default="anchors", choices=list(GROUPS), help="which rows to run")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), help="these rows instead of --group's")
    parser.add_argument("--seq_len", type=int, default=16384, help="tokens per packed micro-batch (and longest row)")
    parser.add_argument("--rows", type=int, default=0,
                        help="SFT rows built (0: enough for --steps + 2 packed micro-batches)")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per SFT row; episodes per GRPO row")
    parser.add_argument("--max_new_tokens", type=int, default=512, help="GRPO completion length")
    parser.add_argument("--peak_tflops", type=float, default=989.0, help="the card's dense bf16 peak (H100/H200 SXM)")
    parser.add_argument("--matmul_tflops", type=float, default=798.0, help="a bf16 matrix product measured on the card")
    parser.add_argument("--timeout", type=int, default=600, help="seconds one launch may take")
    parser.add_argument("--estimate_only", action="store_true",
                        help="print the memory estimate of each row for one GPU (bf16), from the configs alone: no run")
    parser.add_argument("--gpu_gib", type=float, default=79.1, help="with --estimate_only: the GPU's free GiB (an "
                                                                   "80 GB H100 has about 79.1 free)")
    parser.add_argument("--trl_python", default=sys.executable, help="a Python with TRL (rows without it fail alone)")
    parser.add_argument("--trl_pythonpath", default="", help="PYTHONPATH of the TRL rows (a folder holding TRL beside "
                                                             "another transformers than coati's; default: coati's)")
    args = parser.parse_args()
    import torch

    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    names = args.cases or GROUPS[args.group]
    if args.estimate_only:
        print("\n".join(estimates_only(names, args)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = build_data(out / "data", args.seq_len, args.rows or 4 * (args.steps + 2))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(data["tokenizer"])
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                "date": time.strftime("%Y-%m-%d")}
    results: Dict[str, Dict[str, Any]] = {}
    for name in names:
        case = CASES[name]
        model = build_model(case.shape, out / "models" / case.shape, tokenizer, args.device)
        started = time.time()
        result = launch(name, case, model, args, data)
        result["seconds"] = time.time() - started
        if "error" not in result:
            flops = flops_per_token(case, mean_context(case, args, data), result.get("forwards_without_gradients", 0))
            tflops = result["tokens_per_s"] * flops / 1e12
            result.update(tflops=tflops, mfu_peak=tflops / args.peak_tflops, mfu_matmul=tflops / args.matmul_tflops)
            estimated = estimate(case, model, args, data, 2 if args.device == "cuda" else 4)
            result["estimate"] = gib_totals(estimated) if estimated is not None else None
        results[name] = result
        print(f"{name}: {json.dumps(result)}", flush=True)
        lines = write_results(out, versions, args, results)   # after every row: a deadline keeps the rows done
    print("\n".join(lines))


def write_results(out: Path, versions: Dict[str, Any], args: argparse.Namespace, results: Dict[str, Dict[str, Any]]
                  ) -> List[str]:
    """`results.json` and `table.md` in `out`; returns the table's lines."""
    lines = [f"{versions['device']}, torch {versions['torch']} (CUDA {versions['cuda']}), {versions['date']}; "
             f"`python benchmarks/bench_gpu.py {' '.join(sys.argv[1:])}`", "", *table(results, args)]
    (out / "results.json").write_text(json.dumps({"versions": versions, "args": vars(args), "results": results},
                                                 indent=2, default=str))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
