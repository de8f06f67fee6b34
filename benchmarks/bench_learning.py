"""Does RL help, and how reliably: the demo's pipeline over several seeds, held-out accuracy per algorithm.

    python benchmarks/bench_learning.py --out output/bench_learning --seeds 1 2 3
    python benchmarks/bench_learning.py --seeds 1 2 3 --estimators grpo rloo reinforce_pp --steps 100
    python benchmarks/bench_learning.py --seeds 42 1 2 3 --matched_ppo   # PPO at GRPO's completions too

For each seed, `applications/demo/run_demo.py --seed S` builds the model (initialised from S) and the task's data
and runs SFT -> reward model -> PPO and GRPO; each further `--estimators` entry is one more GRPO stage from the same
SFT model with `--adv_estimator NAME` (folder `grpo-NAME`), and with `--matched_ppo` PPO sampling as many
completions as GRPO (folder `ppo-matched`: the demo's PPO samples a third of them). Every model is scored by
greedy held-out accuracy (exact final answer). Prints, per algorithm, the mean and the spread (sample standard
deviation, min and max) over the seeds, each seed's value, how often it ended at or above SFT, the completions it
sampled and the stage's mean wall time; the same goes to `--out/results.json`. Rerun into the same `--out`, a seed's
finished stages are kept (`seed-S/timings.json`).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "applications" / "demo"))
import run_demo  # noqa: E402
from report import read_metrics  # noqa: E402

from coati.rollout.evaluation import evaluate_model  # noqa: E402


def run_seed(out: Path, seed: int, steps: int, nproc: int, estimators: List[str],
             matched_ppo: bool) -> Dict[str, Dict[str, float]]:
    """The demo's stages for one seed, then each extra GRPO estimator and, with `matched_ppo`, PPO sampling as many
    completions as GRPO (`ppo-matched`); {algorithm: {accuracy, seconds, completions}}. A stage that finished in an
    earlier run into the same folder (`timings.json` has it) is not run again."""
    timings_file = out / "timings.json"
    timings: Dict[str, float] = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    if "sft" not in timings:
        run_demo.build_assets(out, "small", run_demo.data_sizes(steps, nproc), seed)
        run_demo.prepare(out)
    stages = [(name, name, []) for name in run_demo.STAGES]
    stages += [(f"grpo-{e}", "grpo", ["--adv_estimator", e]) for e in estimators if e != "grpo"]
    stages += [("ppo-matched", "ppo", run_demo.grpo_sampling(steps))] if matched_ppo else []
    for folder, name, extra in stages:
        if folder in timings:
            continue
        started = time.perf_counter()
        run_demo.run_stage(name, out, steps, nproc, seed, extra, folder)
        timings[folder] = time.perf_counter() - started
        timings_file.write_text(json.dumps(timings, indent=2))
    results = {}
    for folder in ["sft"] + [f for f, name, _ in stages if name in ("ppo", "grpo")]:
        accuracy = evaluate_model(str(out / folder / "model"), [str(out / "data" / "prompt_eval")], ["math_answer"],
                                  run_demo.MAX_NEW_TOKENS).components["math_answer"]
        results[folder] = {"accuracy": accuracy, "seconds": timings[folder], "completions": completions(out / folder)}
        print(f"[bench] seed {seed}: {folder} held-out accuracy {accuracy:.3f} ({timings[folder]:.0f} s)", flush=True)
    return results


def completions(stage: Path) -> float:
    """Completions an RL stage sampled over its run (`train/num_completions` at its last logged step; 0 for SFT)."""
    records = read_metrics(stage / "logs" / "metrics.jsonl")
    return max((r["train/num_completions"] for r in records if "train/num_completions" in r), default=0.0)


def summary(per_seed: Dict[int, Dict[str, Dict[str, float]]]) -> List[Dict[str, object]]:
    """Per algorithm: mean, standard deviation, min and max of held-out accuracy over the seeds, each seed's value,
    the seeds where it ended at or above SFT, and its mean wall time."""
    rows = []
    for algorithm in next(iter(per_seed.values())):
        values = [r[algorithm]["accuracy"] for r in per_seed.values()]
        rows.append({"algorithm": algorithm, "mean": statistics.fmean(values),
                     "std": statistics.stdev(values) if len(values) > 1 else 0.0, "min": min(values), "max": max(values),
                     "per_seed": dict(zip(per_seed, values)),
                     "at_or_above_sft": sum(r[algorithm]["accuracy"] >= r["sft"]["accuracy"] for r in per_seed.values()),
                     "seconds": statistics.fmean(r[algorithm]["seconds"] for r in per_seed.values()),
                     "completions": statistics.fmean(r[algorithm]["completions"] for r in per_seed.values())})
    return rows


def table(rows: List[Dict[str, object]], seeds: int) -> str:
    lines = [f"| algorithm | held-out accuracy, mean ± std ({seeds} seeds) | min – max | per seed | >= SFT | "
             "completions sampled | s/run |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        per_seed = ", ".join(f"{v:.3f}" for v in row["per_seed"].values())
        lines.append(f"| {row['algorithm']} | {row['mean']:.3f} ± {row['std']:.3f} | {row['min']:.3f} – {row['max']:.3f} "
                     f"| {per_seed} | {row['at_or_above_sft']}/{seeds} | {row['completions']:,.0f} | {row['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/bench_learning")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=200, help="the demo's --steps (SFT steps; the others scale with it)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--estimators", nargs="*", default=["grpo"],
                        help="GRPO advantage estimators to run (the registry's: grpo, rloo, reinforce_pp, maxent)")
    parser.add_argument("--matched_ppo", action="store_true",
                        help="also run PPO sampling as many completions as GRPO (its prompts, group size and episodes)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    run_demo.use_portable_cpu_kernels()
    per_seed = {seed: run_seed(out / f"seed-{seed}", seed, args.steps, args.nproc, args.estimators, args.matched_ppo)
                for seed in args.seeds}
    rows = summary(per_seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "per_seed": per_seed, "summary": rows}, indent=2))
    print(table(rows, len(args.seeds)))


if __name__ == "__main__":
    main()
