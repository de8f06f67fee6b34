"""Where a GRPO step's time goes: generation share, tokens/s and peak RSS, on a given model directory.

    python benchmarks/bench_grpo.py --out output/bench_grpo                 # builds a small model and prompts
    python benchmarks/bench_grpo.py --model SFT_MODEL --prompts PROMPT_DATA --nproc 2

Runs the real `train_grpo.py` under torchrun (plugin ddp) for `--episodes` episodes and reads back the
per-episode metrics it logs: the phase timings (`time/generation`, `time/actor_forward`,
`time/reference_forward`, `time/reward`, `time/learning`, and with `--async_rollout` the trainer's
`time/rollout_wait`), wall time per episode (from the log records, the first episode excluded),
`num_tokens`, and the mean training reward of the first and last fifth of the episodes. Peak RSS is the
largest of any process of the launch that torchrun waited for (not Ray's generator actors). Results go
to `--out/results.json` and a markdown table on stdout. Compare `--async_rollout` with the synchronous
run at the same flags: the same samples per episode, generation in a Ray actor overlapping training.
`--rollout_backend vllm` generates on vLLM servers instead (`make vllm-env`); their start-up, printed by the
run, is reported apart from the episodes (`engine_start_s`), and `time/weight_sync` is among the phases.
`--lora_rank R` trains adapters; with vLLM, `--vllm_lora_sync adapter` sends them alone after each update, `merged`
the whole weights with them folded in.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict

REPO = Path(__file__).resolve().parents[1]
PHASES = ("generation", "actor_forward", "reference_forward", "reward", "learning", "rollout_wait", "weight_sync")
ENGINE_READY = re.compile(r"vLLM rollout engine ready in ([0-9.]+) s")


def build_inputs(out: Path, size: str) -> Dict[str, str]:
    """A small random model and prepared prompt data of the generated task."""
    from transformers import AutoTokenizer

    from coati.dataset.demo_data import generate_problems, prompt_records, tokenizer_corpus, write_jsonl
    from coati.dataset.prepare import prepare_dataset
    from coati.models.tiny import write_tiny_model

    model = write_tiny_model(out / "model", tokenizer_corpus(), size=size)
    raw = write_jsonl(prompt_records(generate_problems(2048, "train")), out / "raw" / "prompts.jsonl")
    prepare_dataset([raw], "prompt", AutoTokenizer.from_pretrained(model), 128, out / "prompts")
    return {"model": str(model), "prompts": str(out / "prompts")}


def run(args: argparse.Namespace, model: str, prompts: str) -> Path:
    log_dir = Path(args.out) / "logs"
    if (log_dir / "metrics.jsonl").exists():
        (log_dir / "metrics.jsonl").unlink()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           str(REPO / "examples" / "training_scripts" / "train_grpo.py"), "--pretrain", model, "--prompt_dataset", prompts,
           "--plugin", "ddp", "--batch_size", str(args.batch_size), "--num_generations", str(args.num_generations),
           "--max_new_tokens", str(args.max_new_tokens), "--num_episodes", str(args.episodes), "--kl_coef", str(args.kl_coef),
           "--lr", str(args.lr), "--warmup_steps", str(args.warmup_steps), "--sample_log_interval", "0",
           "--reward_fn", "math_answer", "--log_dir", str(log_dir), "--seed", str(args.seed)]
    if args.async_rollout:
        cmd += ["--async_rollout", "--max_staleness", str(args.max_staleness)]
    cmd += ["--rollout_backend", args.rollout_backend, "--vllm_threads", str(args.vllm_threads)]
    if args.lora_rank:
        cmd += ["--lora_rank", str(args.lora_rank), "--lora_alpha", str(2 * args.lora_rank),
                "--vllm_lora_sync", args.vllm_lora_sync]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "run.log", "w") as log:
        subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    return log_dir / "metrics.jsonl"


def summarize(metrics_file: Path) -> Dict[str, float]:
    """Medians over episodes 2..N of the phase seconds, the generation share of the phases, episode wall
    time and tokens/s (prompt and completion tokens over all ranks); the vLLM engine's start-up, if any."""
    started = ENGINE_READY.search((metrics_file.parent / "run.log").read_text(errors="replace"))
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()][1:]
    walls = [b["time"] - a["time"] for a, b in zip(records, records[1:])]
    tokens = records[-1]["train/num_tokens"] - records[0]["train/num_tokens"]
    phases = {p: statistics.median(r.get(f"train/time/{p}", 0.0) for r in records) for p in PHASES}
    fifth = max(len(records) // 5, 1)
    rewards = [r["train/reward"] for r in records]
    return {"episodes_timed": len(walls), "median_episode_s": statistics.median(walls),
            "reward_first_fifth": statistics.mean(rewards[:fifth]), "reward_last_fifth": statistics.mean(rewards[-fifth:]),
            "generation_share": phases["generation"] / sum(phases.values()),
            "tokens_per_s": tokens / sum(walls), **{f"median_{p}_s": v for p, v in phases.items()},
            "engine_start_s": float(started.group(1)) if started else 0.0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/bench_grpo", help="results, logs and built inputs")
    parser.add_argument("--model", default=None, help="model directory (default: build one in --out)")
    parser.add_argument("--model_size", default="small", help="size of the built model when --model is not given")
    parser.add_argument("--prompts", default=None, help="prepared prompt data (default: built)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=8, help="prompts per rank per episode")
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--kl_coef", type=float, default=0.04, help="0 drops the reference forward")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--warmup_steps", type=int, default=0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--async_rollout", action="store_true", help="generate in a Ray actor while training")
    parser.add_argument("--max_staleness", type=int, default=1)
    parser.add_argument("--rollout_backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--vllm_threads", type=int, default=0, help="CPU threads per vLLM server (0: the trainer's)")
    parser.add_argument("--lora_rank", type=int, default=0, help="train LoRA adapters of this rank (alpha twice it)")
    parser.add_argument("--vllm_lora_sync", choices=("auto", "adapter", "merged"), default="auto",
                        help="with --lora_rank and vllm: send the adapters alone, or the merged weights")
    args = parser.parse_args()
    inputs = {"model": args.model, "prompts": args.prompts}
    if not all(inputs.values()):
        inputs = {**build_inputs(Path(args.out) / "inputs", args.model_size), **{k: v for k, v in inputs.items() if v}}
    result = summarize(run(args, inputs["model"], inputs["prompts"]))
    (Path(args.out) / "results.json").write_text(json.dumps(result, indent=2))
    print("| median s/episode | generation share | " + " | ".join(f"{p} s" for p in PHASES)
          + " | tokens/s | reward first/last fifth | peak RSS MB | engine start s |\n|" + "---|" * (len(PHASES) + 6))
    print(f"| {result['median_episode_s']:.3f} | {result['generation_share']:.1%} | "
          + " | ".join(f"{result[f'median_{p}_s']:.3f}" for p in PHASES)
          + f" | {result['tokens_per_s']:.0f} | {result['reward_first_fifth']:.3f} / {result['reward_last_fifth']:.3f}"
          + f" | {result['peak_rss_mb']:.0f} | {result['engine_start_s']:.1f} |")


if __name__ == "__main__":
    main()
