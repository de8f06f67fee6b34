"""Generation tokens/s of the two rollout backends, and the vLLM backend's weight-sync seconds per update.

    python benchmarks/bench_generation.py --out output/bench_gen --sizes base 100m
    python benchmarks/bench_generation.py --out output/bench_gen --model MODEL_DIR

For each model (random ones of `coati.models.tiny.MODEL_SIZES` built with the demo's tokenizer, or `--model`),
`hf` (`HFEngine`: the training model's own KV-cached loop, in this process) and `vllm` (a vLLM server in
`.venv-vllm`, as `--rollout_backend vllm` starts it) sample the same prompts of the demo task: `--prompts` prompts
x `--num_generations` completions of up to `--max_new_tokens` tokens per round, `--repeats` rounds each,
interleaved, each backend on `--threads` CPU threads. Tokens/s is the generated tokens of a round over its
seconds (median over rounds). The server's start-up (import and load) is reported apart. Weight sync: the model's
state dict published `--repeats` times (copied into the memory the server maps, then reloaded in place by the
server), median seconds per update. A benchmark, not a test; results go to `--out/results.json` and a markdown table on stdout.
"""
import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch


def build_model(out: Path, size: str) -> str:
    from coati.dataset.demo_data import tokenizer_corpus
    from coati.models.tiny import write_tiny_model

    return str(write_tiny_model(out / f"model_{size}", tokenizer_corpus(), size=size))


def demo_prompts(tokenizer, count: int) -> List[List[int]]:
    """Chat-formatted prompts of the demo's arithmetic task, as token ids."""
    from coati.dataset.demo_data import generate_problems, prompt_records

    records = prompt_records(generate_problems(count, "train", seed=5))
    return [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True) for r in records]


def generated_tokens(completions) -> int:
    return int(sum(c.action_mask.sum() for c in completions))


def bench_model(model_dir: str, args: argparse.Namespace) -> Dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.inference.vllm import VLLMConfig, VLLMPool
    from coati.models.generation import HFEngine
    from coati.config import SamplingConfig
    from coati.rollout.pool import generate_requests

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    parameters = sum(p.numel() for p in model.parameters())
    prompts = demo_prompts(tokenizer, args.prompts)
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0)
    stops = [tokenizer.eos_token_id]
    start = time.perf_counter()
    pool = VLLMPool(VLLMConfig(model=model_dir, threads=args.threads, log_dir=str(Path(args.out) / "logs")), stops)
    start_s = time.perf_counter() - start
    hf = HFEngine(model, tokenizer.pad_token_id, stops)
    requests = [(prompt, args.num_generations) for prompt in prompts]

    async def vllm_round():
        return await asyncio.gather(*(pool.agenerate(prompt, config, n) for prompt, n in requests))

    rates: Dict[str, List[float]] = {"hf": [], "vllm": []}
    try:
        for _ in range(args.repeats):
            for backend in ("hf", "vllm"):
                begin = time.perf_counter()
                out = generate_requests(hf, requests, config, 0) if backend == "hf" else asyncio.run(vllm_round())
                rates[backend].append(generated_tokens(out) / (time.perf_counter() - begin))
        syncs = []
        for version in range(1, args.repeats + 1):
            begin = time.perf_counter()
            pool.publish(model.state_dict(), version).result()
            syncs.append(time.perf_counter() - begin)
    finally:
        pool.shutdown()
    return {"parameters_m": parameters / 1e6, "hf_tokens_per_s": statistics.median(rates["hf"]),
            "vllm_tokens_per_s": statistics.median(rates["vllm"]), "vllm_start_s": start_s,
            "weight_sync_s": statistics.median(syncs),
            "weights_mb": sum(p.numel() * p.element_size() for p in model.state_dict().values()) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/bench_generation", help="results, server logs and built models")
    parser.add_argument("--sizes", nargs="+", default=["base", "100m"], help="model sizes to build and measure")
    parser.add_argument("--model", default=None, help="measure this model directory instead")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = {"model": args.model} if args.model else {size: build_model(out, size) for size in args.sizes}
    results = {name: bench_model(path, args) for name, path in models.items()}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print("| model | parameters | hf tokens/s | vllm tokens/s | vllm / hf | vLLM start-up s | weight sync s/update |\n"
          "|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['parameters_m']:.1f}M | {r['hf_tokens_per_s']:.0f} | {r['vllm_tokens_per_s']:.0f} | "
              f"{r['vllm_tokens_per_s'] / r['hf_tokens_per_s']:.2f} | {r['vllm_start_s']:.1f} | {r['weight_sync_s']:.3f} |")


if __name__ == "__main__":
    main()
