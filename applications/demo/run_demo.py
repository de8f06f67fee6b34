"""The whole coati pipeline on tiny built-in defaults, with nothing downloaded:

    python applications/demo/run_demo.py --out output/demo

build a tokenizer, a small random Llama and the arithmetic task's data -> prepare datasets -> SFT ->
reward model -> PPO (that reward model's score plus the verifiable math reward, KL-penalised) and GRPO
(the verifiable math reward) -> held-out
accuracy of every model -> REPORT.md / REPORT.html with plots. Each training stage runs the real
`examples/training_scripts` under `torchrun --nproc_per_node 2 --plugin ddp`, its outputs feeding the next.
Copy this file and point `--pretrain`-style paths at your own model and data to reuse the pipeline.
"""
import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from transformers import AutoTokenizer

from coati.dataset.demo_data import (REJECTIONS, generate_problems, preference_records, prompt_records, sft_records,
                                     tokenizer_corpus, write_jsonl)
from coati.dataset.prepare import prepare_dataset
from coati.rollout.evaluation import evaluate_model
from coati.models.tiny import MODEL_SIZES, write_tiny_model
from coati.utils.ranges import at_least

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "training_scripts"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import alarm_lines, bar_chart, plot, read_metrics, reward_vs_accuracy, write_report  # noqa: E402

STAGES = ("sft", "rm", "ppo", "grpo")
NEEDS = {"rm": ("sft",), "ppo": ("sft", "rm"), "grpo": ("sft",)}
"""Stage -> the stages whose exported model it starts from."""
MODELS = {"initial": "model_init", "sft": "sft/model", "ppo": "ppo/model", "grpo": "grpo/model"}
DATASETS = {"sft_train": "sft", "sft_eval": "sft", "pref_train": "preference", "pref_eval": "preference",
            "prompt_train": "prompt", "prompt_eval": "prompt"}
MAX_NEW_TOKENS = 24
PORTABLE_CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
"""torch's vectorised CPU kernels, and MKL's, capped at AVX2 (a cap: a CPU without AVX2 keeps its own best)."""


def use_portable_cpu_kernels() -> None:
    """Cap this process's and every stage's CPU kernels at AVX2 (on x86, unless the environment already chooses), so
    that a seed gives the same numbers on CPUs with AVX-512 and without: with AVX-512 kernels the seed-1 SFT model
    scored 0.797 held-out, with AVX2 ones 0.766, on one machine. Call it before any tensor is computed."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    for name, value in PORTABLE_CPU_KERNELS.items():
        os.environ.setdefault(name, value)
    print(f"[demo] CPU kernels: ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']} "
          f"MKL_CBWR={os.environ['MKL_CBWR']} (avx2, the default here, makes a seed's numbers the same with AVX-512 "
          "or without; ATEN_CPU_CAPABILITY=default lifts the cap)", flush=True)


def check_stage_inputs(parser: argparse.ArgumentParser, out: Path, stages: Sequence[str],
                       needs: Dict[str, Sequence[str]]) -> None:
    """Refuse in one line, before any work, a stage whose input model is neither listed to be made nor left in `out`
    by an earlier run (otherwise the stage's script fails deep in `from_pretrained`)."""
    for name in stages:
        for earlier in needs.get(name, ()):
            model = out / earlier / "model"
            if earlier not in stages and not (model / "config.json").is_file():
                parser.error(f"--stages {name} needs the {earlier} stage's model and {model} has none: add {earlier} "
                             f"to --stages, or run it into this --out first")


@contextmanager
def stage(name: str, timings: Dict[str, float]):
    """Print the stage's start and end lines with its wall time, and keep the time for the report."""
    print(f"[demo] {name}: start", flush=True)
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start
    print(f"[demo] {name}: done in {timings[name]:.1f}s", flush=True)


def _torchrun_with(script: str, nproc: int, *flags: str, extra: Sequence[str] = ()) -> None:
    """Run a training script under torchrun with `flags`, then `extra`; a failure stops the demo with the script's
    exit status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(SCRIPTS / script), *flags, *extra]
    result = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        sys.exit(f"[demo] {script} failed with exit status {result.returncode}")


def data_sizes(steps: int, nproc: int) -> Dict[str, int]:
    """Rows of SFT and preference training data: enough for `steps` optimizer steps of 16 rows on `nproc` ranks."""
    return {"sft_train": steps * 16 * nproc, "pref_train": steps * 16 * nproc}


def build_assets(out: Path, size: str, sizes: Dict[str, int], seed: int = 0) -> None:
    """The tokenizer and random model (initialised from `seed`), and raw task data: held-out sets use wordings
    training never shows (the task's data is the same for every seed)."""
    write_tiny_model(out / "model_init", tokenizer_corpus(), size=size, seed=seed)
    raw = out / "raw"
    write_jsonl(sft_records(generate_problems(sizes["sft_train"], "train")), raw / "sft_train.jsonl")
    write_jsonl(sft_records(generate_problems(256, "eval")), raw / "sft_eval.jsonl")
    for split, n in (("train", sizes["pref_train"]), ("eval", 256)):
        problems = generate_problems(n, split, seed=2)
        write_jsonl(preference_records(problems, seed=2, rejections=tuple(REJECTIONS)), raw / f"pref_{split}.jsonl")
    write_jsonl(prompt_records(generate_problems(2048, "train", seed=1)), raw / "prompt_train.jsonl")
    write_jsonl(prompt_records(generate_problems(256, "eval", seed=3)), raw / "prompt_eval.jsonl")


def prepare(out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(out / "model_init")
    for name, data_type in DATASETS.items():
        counts = prepare_dataset([out / "raw" / f"{name}.jsonl"], data_type, tokenizer, 128, out / "data" / name)
        print(f"[demo] {name}: {counts['kept']} rows kept, {counts['dropped']} dropped", flush=True)


def common_flags(out: Path, name: str, seed: int) -> List[str]:
    return ["--plugin", "ddp", "--output_dir", str(out / name), "--log_dir", str(out / name / "logs"),
            "--save_dir", str(out / name / "checkpoints"), "--keep_last", "1", "--seed", str(seed)]


def grpo_sampling(steps: int) -> List[str]:
    """GRPO's rollout size: prompts per rank, completions per prompt and episodes (the learning benchmark gives PPO
    the same, to compare the two at equal completions sampled)."""
    return ["--num_generations", "8", "--batch_size", "8", "--num_episodes", str(max(steps * 3 // 2, 2))]


def run_stage(name: str, out: Path, steps: int, nproc: int, seed: int = 42, extra: Sequence[str] = (),
              folder: Optional[str] = None) -> None:
    """One training stage through its script, into `out/folder` (default: its name); the flags are the demo's tuned
    defaults, then `extra` (a later flag wins)."""
    data = out / "data"
    folder = folder or name
    torchrun = functools.partial(_torchrun_with, extra=[*common_flags(out, folder, seed), *extra])
    if name == "sft":
        torchrun("train_sft.py", nproc, "--pretrain", str(out / "model_init"), "--dataset", str(data / "sft_train"),
                 "--eval_dataset", str(data / "sft_eval"), "--batch_size", "16", "--max_steps", str(steps),
                 "--lr", "3e-3", "--warmup_steps", "5", "--log_interval", "5")
    elif name == "rm":
        torchrun("train_rm.py", nproc, "--pretrain", str(out / "sft" / "model"), "--dataset", str(data / "pref_train"),
                 "--eval_dataset", str(data / "pref_eval"), "--batch_size", "16", "--max_steps", str(max(steps // 2, 4)),
                 "--lr", "1e-3", "--warmup_steps", "5", "--log_interval", "4")
    elif name == "ppo":
        torchrun("train_ppo.py", nproc, "--pretrain", str(out / "sft" / "model"), "--rm_pretrain", str(out / "rm" / "model"),
                 "--prompt_dataset", str(data / "prompt_train"), "--eval_dataset", str(data / "prompt_eval"),
                 "--reward_fn", "math_answer", "--rm_weight", "0.1", "--batch_size", "16", "--num_generations", "4",
                 "--num_episodes", str(max(steps // 2, 2)),
                 "--lr", "1e-4", "--critic_lr", "5e-4", "--warmup_steps", "10", "--kl_coef", "0.1", "--num_update_steps", "2",
                 "--max_new_tokens", str(MAX_NEW_TOKENS), "--eval_interval", str(max(steps // 8, 1)),
                 "--save_interval", str(max(steps // 4, 1)), "--sample_log_interval", str(max(steps // 4, 1)))
    elif name == "grpo":
        torchrun("train_grpo.py", nproc, "--pretrain", str(out / "sft" / "model"),
                 "--prompt_dataset", str(data / "prompt_train"), "--eval_dataset", str(data / "prompt_eval"),
                 "--reward_fn", "math_answer", *grpo_sampling(steps), "--lr", "2e-4", "--warmup_steps", "20",
                 "--max_new_tokens", str(MAX_NEW_TOKENS), "--eval_interval", str(max(steps // 4, 1)),
                 "--save_interval", str(max(steps // 2, 1)), "--sample_log_interval", str(max(steps // 2, 1)))


def evaluate_all(out: Path, models: Dict[str, str] = MODELS, max_new_tokens: int = MAX_NEW_TOKENS) -> Dict[str, Dict]:
    """Greedy held-out accuracy (exact answer) of every model of `models` (name -> folder under `out`) the run has,
    with its completions."""
    results = {}
    for name, folder in models.items():
        if (out / folder / "config.json").is_file():
            result = evaluate_model(str(out / folder), [str(out / "data" / "prompt_eval")], ["math_answer"],
                                    max_new_tokens)
            results[name] = {"accuracy": result.components["math_answer"], "samples": result.samples}
            print(f"[demo] held-out accuracy of the {name} model: {results[name]['accuracy']:.3f}", flush=True)
    (out / "heldout_accuracy.json").write_text(json.dumps({k: v["accuracy"] for k, v in results.items()}, indent=2))
    return results


def report(out: Path, results: Dict[str, Dict], timings: Dict[str, float]) -> Path:
    """Plots and REPORT.md / REPORT.html from the stages' logs and the held-out results."""
    logs = {name: read_metrics(out / name / "logs" / "metrics.jsonl") for name in STAGES}
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    images = [
        plot(plots / "sft_loss.png", "SFT", [("loss", [("train", logs["sft"], "train/loss"), ("held-out", logs["sft"], "eval/loss")])]),
        plot(plots / "rm_accuracy.png", "Reward model", [("accuracy", [("train", logs["rm"], "train/accuracy"),
                                                                       ("held-out", logs["rm"], "eval/accuracy")]),
                                                         ("margin", [("train", logs["rm"], "train/margin")])]),
        plot(plots / "rl_reward.png", "RL: reward and held-out accuracy, by completions sampled", [
            ("PPO reward (math_answer + 0.1 RM)", [("PPO", logs["ppo"], "train/reward")]),
            ("GRPO reward (math_answer)", [("GRPO", logs["grpo"], "train/reward")]),
            ("held-out accuracy", [("PPO", logs["ppo"], "eval/rewards/math_answer"),
                                   ("GRPO", logs["grpo"], "eval/rewards/math_answer")])], x="train/num_completions"),
        plot(plots / "rl_kl_length.png", "RL: KL and completion length, by completions sampled", [
            ("KL to the SFT model", [("PPO", logs["ppo"], "train/kl"), ("GRPO (only with --kl_coef)", logs["grpo"], "train/kl")]),
            ("completion length", [("PPO", logs["ppo"], "train/completions/mean_length_sampled"),
                                   ("GRPO", logs["grpo"], "train/completions/mean_length_sampled")])],
             x="train/num_completions"),
        plot(plots / "ppo_critic.png", "PPO's critic", [
            ("explained variance of the returns", [("PPO", logs["ppo"], "train/explained_variance")]),
            ("value loss", [("PPO", logs["ppo"], "train/loss/value")])],
             ylims={"explained variance of the returns": (-1.0, 1.0)}),
    ]
    accuracy = {name: r["accuracy"] for name, r in results.items()}
    if accuracy:
        images.append(bar_chart(plots / "heldout_accuracy.png", "Held-out accuracy (greedy, exact answer)", accuracy))
    blocks = [("h1", "coati demo report"),
              ("p", "Arithmetic word problems; held-out questions use name/item wordings never seen in training. "
                    "Accuracy = exact final answer of a greedy completion (the math_answer reward)."),
              ("h2", "Held-out accuracy"),
              ("table", [["model", "accuracy", "prompts"]] + [[k, f"{v['accuracy']:.3f}", len(v["samples"])] for k, v in results.items()]),
              ("h2", "Did RL help?")] + [("p", line) for line in reward_checks(out, logs, results)] + [
              ("h2", "Stage wall times"),
              ("table", [["stage", "seconds"]] + [[k, f"{v:.1f}"] for k, v in timings.items()]),
              ("h2", "Plots")] + [("image", str(path)) for path in images if path is not None]
    blocks += sample_blocks(results)
    return write_report(out, blocks, "coati demo report")[0]


RL_REWARDS = {"ppo": "train/rewards/reward_model/mean", "grpo": "train/reward"}
"""The reward each RL stage optimises that is not held-out accuracy itself: PPO's learned reward model score."""


def reward_checks(out: Path, logs: Dict[str, List[Dict]], results: Dict[str, Dict]) -> List[str]:
    """For each RL stage that ran: whether it raised or lowered held-out accuracy (SFT model -> RL model), beside its
    reward's trend, and the health alarms it raised while training."""
    if "sft" not in results:
        return []
    lines = []
    for name, metric in RL_REWARDS.items():
        if name in results:
            lines.append(reward_vs_accuracy(name.upper(), logs[name], metric, results["sft"]["accuracy"],
                                            results[name]["accuracy"]))
            alarms = out / name / "alarms.json"
            lines += alarm_lines(name.upper(), json.loads(alarms.read_text()) if alarms.is_file() else {})
    return [line for line in lines if line]


def sample_blocks(results: Dict[str, Dict], count: int = 6) -> list:
    """A few held-out completions of the SFT model next to the RL models'."""
    names = [n for n in ("sft", "ppo", "grpo") if n in results]
    if not names:
        return []
    rows = []
    for i in range(min(count, len(results[names[0]]["samples"]))):
        prompt = results[names[0]]["samples"][i]["prompt"].split("\n")[1]
        rows.append([prompt] + [f"{results[n]['samples'][i]['completion']} ({'right' if results[n]['samples'][i]['math_answer'] else 'wrong'})"
                                for n in names])
    return [("h2", "Sample completions before and after RL"), ("table", [["question"] + names] + rows)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/demo", help="output directory for every stage")
    parser.add_argument("--steps", type=at_least(1), default=200,
                        help="SFT optimizer steps; the reward model takes steps/2, PPO steps/2 episodes, GRPO 1.5*steps")
    parser.add_argument("--model_size", default="small", choices=tuple(MODEL_SIZES))
    parser.add_argument("--nproc", type=at_least(1), default=2, help="processes per stage")
    parser.add_argument("--seed", type=int, default=42,
                        help="seeds the model's initialisation and every stage (the task's data stays the same)")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES,
                        help="training stages to run; a stage uses what earlier runs left in --out")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    check_stage_inputs(parser, out, args.stages, NEEDS)
    use_portable_cpu_kernels()
    timings: Dict[str, float] = {}
    if not (out / "data" / "prompt_eval").is_dir() or "sft" in args.stages:
        with stage("build tiny model and task data", timings):
            build_assets(out, args.model_size, data_sizes(args.steps, args.nproc), args.seed)
        with stage("prepare datasets", timings):
            prepare(out)
    for name in STAGES:
        if name in args.stages:
            with stage(name, timings):
                run_stage(name, out, args.steps, args.nproc, args.seed)
    evaluate_and_report(out, timings, evaluate_all, report)


def evaluate_and_report(out: Path, timings: Dict[str, float], evaluate: Callable[[Path], Dict[str, Dict]],
                        write: Callable[[Path, Dict[str, Dict], Dict[str, float]], Path]) -> None:
    """The closing stages of a demo: held-out results, then the report (its path printed)."""
    with stage("evaluate held-out accuracy", timings):
        results = evaluate(out)
    with stage("report", timings):
        markdown = write(out, results, timings)
    print(f"[demo] finished: report in {markdown} (and {markdown.with_suffix('.html')})", flush=True)


if __name__ == "__main__":
    main()
