"""Seconds per optimizer step of coati's SFT and RM training against a hand-written PyTorch loop.

    python benchmarks/bench_supervised.py --out output/bench            # builds a model and data
    python benchmarks/bench_supervised.py --model MODEL --sft_data D1 --rm_data D2 --nproc 2

Each (task, implementation) pair runs in its own `torchrun` launch on the same model, prepared data,
batch size and seed, so both see the same batches. coati runs the real `run_supervised` path
(booster, plugin ddp, meter, logging cadence); the plain loop is DistributedDataParallel, AdamW and
the same loss normalisation written out by hand. Reported: median seconds per optimizer step (the
first step excluded, timed from one step's end to the next, data loading included) and the mean,
tokens/s over all ranks, and the largest peak RSS of any process. Results go to `--out/results.json` and a
markdown table on stdout.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve()
IMPLEMENTATIONS = ("coati", "plain")
TASKS = ("sft", "rm")


def _record(out: Path, times: List[float], tokens: List[int]) -> None:
    """Write this rank's step-end times, tokens per step and peak RSS."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (out / f"rank{rank}.json").write_text(json.dumps({"times": times, "tokens": tokens, "peak_rss_mb": peak_mb}))


def run_coati(args: argparse.Namespace) -> None:
    """The real training path, with a callback that stamps each optimizer step's end."""
    from coati.models.loss import LogSigLoss
    from coati.trainer.callbacks import Callback, count_samples_and_tokens
    from coati.trainer.rm import RewardModelTrainer
    from coati.trainer.runner import load_reward_model_from_args, run_supervised
    from coati.trainer.sft import SFTTrainer
    from coati.utils.arguments import training_parser

    times, tokens = [], []

    class StepClock(Callback):
        def on_learn_batch_end(self, batches) -> None:
            times.append(time.perf_counter())
            tokens.append(count_samples_and_tokens(batches)[1])

    flags = ["--pretrain", args.model, "--dataset", args.data, "--plugin", "ddp", "--batch_size", str(args.batch_size),
             "--max_steps", str(args.steps), "--lr", "1e-4", "--lr_scheduler", "constant_with_warmup", "--seed", "0"]
    train_args = training_parser("benchmark").parse_args(flags)
    if args.task == "sft":
        run_supervised(train_args, SFTTrainer, "sft", callbacks=[StepClock()])
    else:
        run_supervised(train_args, RewardModelTrainer, "preference", model_loader=load_reward_model_from_args,
                       trainer_kwargs={"loss_fn": LogSigLoss(reduction="none")}, callbacks=[StepClock()])
    _record(Path(args.worker_out), times, tokens)


def run_plain(args: argparse.Namespace) -> None:
    """The same math in a plain DDP loop: summed loss over the global item count per world size."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.dataset.collators import COLLATORS
    from coati.dataset.prepare import load_prepared
    from coati.models.loss import LogSigLoss
    from coati.models.reward_model import load_reward_model, sequence_rewards

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    data_type = "sft" if args.task == "sft" else "preference"
    dataset = load_prepared([args.data], data_type)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        collate_fn=COLLATORS[data_type](tokenizer.pad_token_id))
    model = (AutoModelForCausalLM.from_pretrained(args.model) if args.task == "sft"
             else load_reward_model(args.model, tokenizer.pad_token_id))
    model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pairwise = LogSigLoss(reduction="sum")

    def loss_and_items(batch):
        if args.task == "sft":
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = batch["labels"][:, 1:]
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100,
                                   reduction="sum")
            return loss, float((targets != -100).sum())
        pairs = batch["chosen_input_ids"].size(0)
        rewards = sequence_rewards(model, torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]]),
                                   torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]]))
        return pairwise(rewards[:pairs], rewards[pairs:]), float(pairs)

    times, tokens = [], []
    model.train()
    for batch in loader:
        loss, items = loss_and_items(batch)
        total = torch.tensor([items], dtype=torch.float64)
        dist.all_reduce(total)
        (loss / (total.item() / dist.get_world_size())).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter())
        tokens.append(int(sum(v.sum() for k, v in batch.items() if k.endswith("attention_mask"))))
        if len(times) == args.steps:
            break
    _record(Path(args.worker_out), times, tokens)
    dist.destroy_process_group()


def summarize(worker_out: Path) -> Dict[str, float]:
    """Median step time (first excluded) on rank 0, tokens/s over ranks, and the largest peak RSS."""
    ranks = [json.loads(p.read_text()) for p in sorted(worker_out.glob("rank*.json"))]
    steps = [b - a for a, b in zip(ranks[0]["times"], ranks[0]["times"][1:])]
    elapsed = ranks[0]["times"][-1] - ranks[0]["times"][0]
    tokens = sum(sum(r["tokens"][1:]) for r in ranks)
    return {"median_step_s": statistics.median(steps), "mean_step_s": statistics.mean(steps), "tokens_per_s": tokens / elapsed,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks), "steps_timed": len(steps)}


def build_inputs(out: Path, size: str) -> Dict[str, str]:
    """A tiny model and prepared SFT and preference data from the generated task."""
    from transformers import AutoTokenizer

    from coati.dataset.demo_data import generate_problems, preference_records, sft_records, tokenizer_corpus, write_jsonl
    from coati.dataset.prepare import prepare_preference, prepare_sft
    from coati.models.tiny import write_tiny_model

    model = write_tiny_model(out / "model", tokenizer_corpus(), size=size)
    tokenizer = AutoTokenizer.from_pretrained(model)
    problems = generate_problems(4096, "train")
    prepare_sft([write_jsonl(sft_records(problems), out / "raw" / "sft.jsonl")], tokenizer, 128, out / "sft")
    prepare_preference([write_jsonl(preference_records(problems), out / "raw" / "pref.jsonl")], tokenizer, 128, out / "rm")
    return {"model": str(model), "sft": str(out / "sft"), "rm": str(out / "rm")}


def launch(args: argparse.Namespace, task: str, impl: str, model: str, data: str) -> Dict[str, float]:
    worker_out = Path(args.out) / f"{task}-{impl}"
    worker_out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", str(HERE),
           "--worker", impl, "--task", task, "--model", model, "--data", data, "--worker_out", str(worker_out),
           "--steps", str(args.steps), "--batch_size", str(args.batch_size)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return summarize(worker_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/bench", help="results and built inputs")
    parser.add_argument("--model", default=None, help="model directory (default: build a tiny one in --out)")
    parser.add_argument("--model_size", default="base", help="size of the built model when --model is not given")
    parser.add_argument("--sft_data", default=None, help="prepared SFT data (default: built)")
    parser.add_argument("--rm_data", default=None, help="prepared preference data (default: built)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--task", choices=TASKS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--worker_out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        (run_coati if args.worker == "coati" else run_plain)(args)
        return
    inputs = {"model": args.model, "sft": args.sft_data, "rm": args.rm_data}
    if not all(inputs.values()):
        inputs = {**build_inputs(Path(args.out) / "inputs", args.model_size), **{k: v for k, v in inputs.items() if v}}
    results = {}
    print("| task | implementation | median s/step | mean s/step | tokens/s | peak RSS MB/process |\n|---|---|---|---|---|---|")
    for task in args.tasks:
        for impl in IMPLEMENTATIONS:
            r = launch(args, task, impl, inputs["model"], inputs[task])
            results[f"{task}/{impl}"] = r
            print(f"| {task} | {impl} | {r['median_step_s']:.4f} | {r['mean_step_s']:.4f} | {r['tokens_per_s']:.0f} | {r['peak_rss_mb']:.0f} |", flush=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
