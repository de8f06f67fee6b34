"""coati against a hand-written PyTorch loop and TRL on SFT, reward modelling, DPO and GRPO, with and without --packing.

    python benchmarks/bench_training.py --out output/bench_training                    # `base` model, its own vocabulary
    python benchmarks/bench_training.py --out output/bench_training_32k --vocab 32000  # a realistic vocabulary
    make trl-env && python benchmarks/bench_training.py --out output/bench_trl --with_trl  # TRL beside them

Every run is a fresh `torchrun` launch (plugin ddp, `--nproc` processes) on the same built model and data: rows of
mixed lengths, as real data has (conversations of 1 to 5 arithmetic problems, 50 to 250 tokens; GRPO prompts with
1 to 6 solved problems before the question, `WORKED_EXAMPLES`, several times longer than the completions), the
same batch size and seed. SFT, RM and DPO runs train one epoch over `--rows` rows; GRPO runs `--episodes`
episodes. coati runs are the real training scripts as a user starts them: as they are, with `--packing`, and
(SFT, RM, DPO) with `--packing --max_tokens_per_batch` set to `--batch_size` times the mean row length
(micro-batches of equal tokens instead of equal rows). `plain` is the same math in a hand-written DDP loop (full
logits, padded batches, a live reference for DPO, HF `generate` for GRPO). `trl` (with `--with_trl`) is TRL 1.16
in its own environment (`make trl-env`), at its best correct setting per task (benchmarks/trl_worker.py).
Launches are interleaved `--repeats` times. Reported per (task, variant), medians over the repeats: the epoch's
seconds (the steps after the first, scaled to all of them; GRPO: seconds per episode), seconds per step, tokens/s
over all ranks (real tokens, padding not counted), time from launch to the end of the first step, and the
largest peak RSS of any process; then each variant's epoch time over `plain`'s, unpacked coati's and TRL's
(below 1: faster). Results go to `--out/results.json` and a markdown table on stdout.
"""
import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve()
SCRIPTS = HERE.parents[1] / "examples" / "training_scripts"
TRL_WORKER = HERE.parent / "trl_worker.py"
PACKED = ("coati --packing", "coati --packing --max_tokens_per_batch")
VARIANTS = {"sft": ("plain", "coati", *PACKED), "rm": ("plain", "coati", *PACKED), "dpo": ("plain", "coati", *PACKED),
            "grpo": ("plain", "coati", "coati --packing")}
SCRIPT = {"sft": "train_sft.py", "rm": "train_rm.py", "dpo": "train_dpo.py", "grpo": "train_grpo.py"}
TOKENS_PER_S = re.compile(r"learn/tokens_per_s=([0-9.]+)")
PEAK = re.compile(r"^PEAK_RSS_KB (\d+)$", re.M)
GRPO_FLAGS = {"num_generations": 4, "max_new_tokens": 32, "prompts": 2}
WORKED_EXAMPLES = (1, 1, 2, 2, 3, 4, 6)
"""Solved problems before a GRPO prompt's question (drawn per prompt): few-shot prompts, most short, some long."""


# ---- inputs -------------------------------------------------------------------------------------------------------
def _conversation(problems) -> List[Dict[str, str]]:
    messages = []
    for p in problems:
        messages += [{"role": "user", "content": p.question}, {"role": "assistant", "content": p.solution}]
    return messages


def build_inputs(out: Path, size: str, vocab: int, rows: int) -> Dict[str, Any]:
    """The model (its embeddings grown to `vocab` rows when larger), mixed-length SFT, preference and prompt data, and
    each dataset's mean tokens per row."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.dataset.demo_data import (generate_problems, preference_records, prompt_records, tokenizer_corpus,
                                         write_jsonl)
    from coati.dataset.prepare import prepare_dataset, prepare_preference, prepare_sft
    from coati.models.tiny import write_tiny_model

    model_dir = write_tiny_model(out / "model", tokenizer_corpus(), size=size)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if vocab > model.config.vocab_size:
        model.resize_token_embeddings(vocab, mean_resizing=False)
        model.save_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    problems = generate_problems(rows * 7, "train")
    turns = [problems[i * 5:i * 5 + rng.randint(1, 5)] for i in range(rows)]
    sft = [{"messages": _conversation(t)} for t in turns]
    pref = [{**record, "context": _conversation(t[:-1]) + record["context"]}
            for t, record in zip(turns, preference_records([t[-1] for t in turns]))]
    prepare_sft([write_jsonl(sft, out / "raw" / "sft.jsonl")], tokenizer, 320, out / "sft")
    prepare_preference([write_jsonl(pref, out / "raw" / "pref.jsonl")], tokenizer, 320, out / "pref")
    prompts = [{**record, "messages": _conversation(problems[rows + i * 6:rows + i * 6 + rng.choice(WORKED_EXAMPLES)])
                + record["messages"]} for i, record in enumerate(prompt_records(problems[:rows]))]
    prepare_dataset([write_jsonl(prompts, out / "raw" / "prompt.jsonl")], "prompt", tokenizer, 384, out / "prompt")
    from datasets import load_from_disk

    from coati.dataset.sampler import row_tokens

    mean_tokens = {name: statistics.mean(row_tokens(load_from_disk(str(out / name)))) for name in ("sft", "pref")}
    return {"model": str(model_dir), "sft": str(out / "sft"), "rm": str(out / "pref"), "dpo": str(out / "pref"),
            "grpo": str(out / "prompt"), "mean_tokens": {"sft": mean_tokens["sft"], "rm": mean_tokens["pref"],
                                                         "dpo": mean_tokens["pref"]}}


# ---- the hand-written loops (run as torchrun workers of this script) ---------------------------------------------
def run_plain(args: argparse.Namespace) -> None:
    """The same math in a plain DDP loop: each rank's summed loss over the global item count per world size."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.dataset.collators import COLLATORS
    from coati.dataset.prepare import load_prepared
    from coati.models.reward_model import load_reward_model

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    data_type = {"sft": "sft", "rm": "preference", "dpo": "preference", "grpo": "prompt"}[args.task]
    dataset = load_prepared([args.data], data_type)
    batch_size = GRPO_FLAGS["prompts"] if args.task == "grpo" else args.batch_size
    loader = DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset, shuffle=True, seed=0),
                        collate_fn=COLLATORS[data_type](tokenizer.pad_token_id))
    model = (load_reward_model(args.model, tokenizer.pad_token_id) if args.task == "rm"
             else AutoModelForCausalLM.from_pretrained(args.model))
    reference = AutoModelForCausalLM.from_pretrained(args.model).eval() if args.task == "dpo" else None
    model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    step = {"sft": _plain_sft, "rm": _plain_rm, "dpo": _plain_dpo, "grpo": _plain_grpo}[args.task]
    times, tokens = [], []
    model.train()
    for batch in loader:
        if args.steps and len(times) == args.steps:
            break
        loss, items, batch_tokens = step(model, batch, reference=reference, tokenizer=tokenizer)
        total = torch.tensor([items], dtype=torch.float64)
        dist.all_reduce(total)
        (loss / (total.item() / dist.get_world_size())).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.time())
        tokens.append(batch_tokens)
    rank = dist.get_rank()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (Path(args.worker_out) / f"rank{rank}.json").write_text(json.dumps({"times": times, "tokens": tokens,
                                                                          "peak_rss_mb": peak_mb}))
    dist.destroy_process_group()


def _label_logps(model, ids, mask, labels):
    """Full logits, log-softmax, gather: summed label log-probs and label-token counts per row."""
    import torch

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    counted = targets != -100
    logps = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * counted
    return logps.sum(-1), counted.sum(-1)


def _plain_sft(model, batch, **_):
    logps, counts = _label_logps(model, batch["input_ids"], batch["attention_mask"], batch["labels"])
    return -logps.sum(), float(counts.sum()), int(batch["attention_mask"].sum())


def _plain_rm(model, batch, **_):
    import torch.nn.functional as F

    from coati.dataset.collators import both_sides

    pairs = batch["chosen_input_ids"].size(0)
    mask = both_sides(batch, "attention_mask")
    rewards = model(input_ids=both_sides(batch, "input_ids"), attention_mask=mask).logits.squeeze(-1)
    return -F.logsigmoid(rewards[:pairs] - rewards[pairs:]).sum(), float(pairs), int(mask.sum())


def _plain_dpo(model, batch, reference, beta: float = 0.1, **_):
    import torch
    import torch.nn.functional as F

    from coati.dataset.collators import both_sides

    pairs = batch["chosen_input_ids"].size(0)
    inputs = tuple(both_sides(batch, field) for field in ("input_ids", "attention_mask", "labels"))
    policy, _ = _label_logps(model, *inputs)
    with torch.no_grad():
        ref, _ = _label_logps(reference, *inputs)
    margin = (policy[:pairs] - ref[:pairs]) - (policy[pairs:] - ref[pairs:])
    return -F.logsigmoid(beta * margin).sum(), float(pairs), int(inputs[1].sum())


def _plain_grpo(model, batch, tokenizer, **_):
    """Sample `num_generations` completions per prompt, reward them, normalise within each group, one policy-gradient
    step on the token-mean loss (one update per batch: the importance ratio is 1)."""
    import torch

    from coati.rewards import math_answer

    groups, width = GRPO_FLAGS["num_generations"], batch["input_ids"].size(1)
    with torch.no_grad():
        sequences = model.module.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                          do_sample=True, num_return_sequences=groups,
                                          max_new_tokens=GRPO_FLAGS["max_new_tokens"], eos_token_id=tokenizer.eos_token_id,
                                          pad_token_id=tokenizer.pad_token_id)
    completions = sequences[:, width:]
    ended = (completions == tokenizer.eos_token_id).int().cumsum(-1)
    action_mask = (ended - (completions == tokenizer.eos_token_id).int()) == 0
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    prompts = [p for p in tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True) for _ in range(groups)]
    answers = [a for a in batch["gt_answer"] for _ in range(groups)]
    rewards = torch.tensor(math_answer(prompts, texts, answers).values, dtype=torch.float32).view(-1, groups)
    advantages = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-4)).view(-1, 1)
    attention = torch.cat([batch["attention_mask"].repeat_interleave(groups, 0), action_mask.long()], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=sequences, attention_mask=attention, position_ids=positions).logits[:, width - 1:-1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logps - logps.detach())
    loss = -(ratio * advantages * action_mask).sum() / action_mask.sum().clamp(min=1)
    return loss, 1.0, int(attention.sum())


# ---- launching and reading back -----------------------------------------------------------------------------------
def _coati_command(task: str, variant: str, inputs: Dict[str, Any], log_dir: Path, args: argparse.Namespace) -> List[str]:
    common = ["--pretrain", inputs["model"], "--plugin", "ddp", "--seed", "0", "--lr", "1e-5", "--log_interval", "1",
              "--log_dir", str(log_dir)]
    if task == "grpo":
        return common + ["--prompt_dataset", inputs["grpo"], "--batch_size", str(GRPO_FLAGS["prompts"]),
                         "--num_generations", str(GRPO_FLAGS["num_generations"]), "--max_new_tokens",
                         str(GRPO_FLAGS["max_new_tokens"]), "--num_episodes", str(args.episodes), "--sample_log_interval", "0",
                         "--reward_fn", "math_answer", *(["--packing"] if "--packing" in variant else [])]
    flags = common + ["--dataset", inputs[task], "--batch_size", str(args.batch_size), "--max_epochs", "1",
                      "--lr_scheduler", "constant_with_warmup"]
    if "--packing" in variant:
        flags.append("--packing")
    if "--max_tokens_per_batch" in variant:
        flags += ["--max_tokens_per_batch", str(round(args.batch_size * inputs["mean_tokens"][task]))]
    return flags


def launch(task: str, variant: str, inputs: Dict[str, Any], args: argparse.Namespace, repeat: int) -> Dict[str, float]:
    """One torchrun launch of `variant` on `task`, in a wrapper process that reports its children's peak RSS."""
    run_dir = Path(args.out) / "runs" / f"{task}-{variant.replace(' --', '-').replace('_', '-')}-{repeat}"
    run_dir.mkdir(parents=True, exist_ok=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}"]
    steps = str(args.episodes if task == "grpo" else 0)
    if variant == "plain":
        cmd = torchrun + [str(HERE), "--worker", "--task", task, "--model", inputs["model"], "--data", inputs[task],
                          "--worker_out", str(run_dir), "--steps", steps, "--batch_size", str(args.batch_size)]
    elif variant == "trl":
        trl_torchrun = [args.trl_python, "-m", "torch.distributed.run", *torchrun[3:]]
        cmd = trl_torchrun + [str(TRL_WORKER), "--task", task, "--model", inputs["model"], "--data", inputs[task],
                              "--worker_out", str(run_dir), "--steps", steps, "--batch_size", str(args.batch_size),
                              "--prompts", str(GRPO_FLAGS["prompts"]), "--num_generations",
                              str(GRPO_FLAGS["num_generations"]), "--max_new_tokens", str(GRPO_FLAGS["max_new_tokens"])]
    else:
        cmd = torchrun + [str(SCRIPTS / SCRIPT[task])] + _coati_command(task, variant, inputs, run_dir / "logs", args)
    wrapper = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
               "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    started = time.time()
    done = subprocess.run([sys.executable, "-c", wrapper, *cmd], env=env, capture_output=True, text=True)
    (run_dir / "run.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{task} / {variant} failed; see {run_dir / 'run.log'}")
    peak_mb = int(PEAK.search(done.stdout).group(1)) / 1024
    if variant in ("plain", "trl"):
        return _read_plain(run_dir, started, peak_mb)
    return _read_coati(task, run_dir, done.stdout + done.stderr, started, peak_mb)


def _summary(times: List[float], tokens_after_first: float, started: float, peak_mb: float) -> Dict[str, float]:
    steps = [b - a for a, b in zip(times, times[1:])]
    return {"epoch_s": (times[-1] - times[0]) * len(times) / len(steps), "s_per_step": statistics.median(steps),
            "tokens_per_s": tokens_after_first / (times[-1] - times[0]), "first_step_s": times[0] - started,
            "peak_rss_mb": peak_mb}


def _read_plain(run_dir: Path, started: float, peak_mb: float) -> Dict[str, float]:
    ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank*.json"))]
    return _summary(ranks[0]["times"], sum(sum(r["tokens"][1:]) for r in ranks), started, peak_mb)


def _read_coati(task: str, run_dir: Path, output: str, started: float, peak_mb: float) -> Dict[str, float]:
    records = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "train/loss" in r or "train/reward" in r]
    times = [r["time"] for r in records]
    summary = _summary(times, 0.0, started, peak_mb)
    if task == "grpo":
        summary["tokens_per_s"] = (records[-1]["train/num_tokens"] - records[0]["train/num_tokens"]) / (times[-1] - times[0])
    else:
        summary["tokens_per_s"] = float(TOKENS_PER_S.search(output).group(1))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/bench_training", help="results, runs and built inputs")
    parser.add_argument("--model_size", default="base", help="size of the built model (coati.models.tiny.MODEL_SIZES)")
    parser.add_argument("--vocab", type=int, default=0, help="grow the model's vocabulary to this many rows (0: its own)")
    parser.add_argument("--rows", type=int, default=512, help="rows of each built dataset: one epoch's")
    parser.add_argument("--tasks", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=20, help="GRPO episodes per launch")
    parser.add_argument("--batch_size", type=int, default=8, help="rows per rank per step (GRPO: 2 prompts x 4)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved launches of every (task, variant)")
    parser.add_argument("--with_trl", action="store_true", help="run TRL on every task too (`make trl-env` first)")
    parser.add_argument("--trl_python", default=str(HERE.parents[1] / ".venv-trl" / "bin" / "python"),
                        help="the Python of TRL's environment")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--worker_out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_plain(args)
        return
    if args.with_trl and not os.access(args.trl_python, os.X_OK):
        raise SystemExit(f"--with_trl: no Python at {args.trl_python}; build TRL's environment with `make trl-env`")
    inputs_dir = Path(args.out) / "inputs"
    inputs = (json.loads((inputs_dir / "inputs.json").read_text()) if (inputs_dir / "inputs.json").is_file()
              else build_inputs(inputs_dir, args.model_size, args.vocab, args.rows))
    (inputs_dir / "inputs.json").write_text(json.dumps(inputs))
    runs: Dict[str, List[Dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for task in args.tasks:
            for variant in VARIANTS[task] + (("trl",) if args.with_trl else ()):
                runs.setdefault(f"{task}/{variant}", []).append(launch(task, variant, inputs, args, repeat))
    results = {key: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for key, rs in runs.items()}
    (Path(args.out) / "results.json").write_text(json.dumps({"args": vars(args), "results": results, "runs": runs},
                                                             indent=2))
    print_table(results)


def print_table(results: Dict[str, Dict[str, float]]) -> None:
    """The markdown table of `results`: each variant's numbers, and its time as a fraction of plain's, unpacked
    coati's and (where TRL ran) TRL's (below 1: faster)."""
    print("| task | variant | epoch s (GRPO: s/episode) | s/step | tokens/s | first step s | peak RSS MB | "
          "time / plain | / unpacked coati | / TRL |\n|---|---|---|---|---|---|---|---|---|---|")
    for key, r in results.items():
        task, variant = key.split("/")
        others = [results.get(f"{task}/{other}") for other in ("plain", "coati", "trl")]
        ratios = " | ".join(f"{r['epoch_s'] / o['epoch_s']:.2f}" if o else "–" for o in others)
        tokens = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "–"
        print(f"| {task} | {variant} | {r['epoch_s'] if task != 'grpo' else r['s_per_step']:.2f} | {r['s_per_step']:.3f} | "
              f"{tokens} | {r['first_step_s']:.1f} | {r['peak_rss_mb']:.0f} | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
