"""A vision-language model learns to read, on tiny built-in defaults, with nothing downloaded (`make demo-vision`):

    python applications/demo/run_vision_demo.py --out output/demo_vision

Arithmetic problems (`a + b`, `a - b`) drawn as images with PIL, one question beside each ("What is the answer?"):
build a tokenizer and a small random Qwen2.5-VL-shaped model with its processor -> SFT on the worked solution
(`3 + 4 = 7. #### 7`: what the image says, then the answer) -> GRPO from the SFT model with the exact-answer reward
(`math_answer`) -> held-out accuracy of the three (greedy; held-out images are drawn with other seeds) ->
REPORT.md / REPORT.html with plots and sample images beside each model's answer. Each stage runs the real
`examples/training_scripts` under `torchrun --plugin ddp`; the tower and the language model both train.
"""
import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

from transformers import AutoTokenizer

from coati.dataset.demo_data import (IMAGE_QUESTION, generate_problems, image_records, tokenizer_corpus,
                                     vision_prompt_records, vision_sft_records, write_jsonl)
from coati.dataset.prepare import prepare_dataset
from coati.dataset.vision import ImageLimits, ImageProcessing
from coati.models.tiny import MODEL_SIZES, write_tiny_vl_model
from coati.utils.ranges import at_least

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import bar_chart, plot, read_metrics, reward_vs_accuracy, write_report  # noqa: E402
from run_demo import (_torchrun_with, common_flags, evaluate_all, evaluate_and_report, stage,  # noqa: E402
                      use_portable_cpu_kernels)

MODELS = {"initial": "model_init", "sft": "sft/model", "grpo": "grpo/model"}
DATASETS = {"sft_train": "sft", "prompt_train": "prompt", "prompt_eval": "prompt"}
MAX_LENGTH = 64
MAX_NEW_TOKENS = 16
EVAL_ROWS = 256


def build_assets(out: Path, size: str, sft_rows: int, seed: int) -> None:
    """The tokenizer, the random model (initialised from `seed`) and its processor, then the drawn task data: SFT
    rows, GRPO prompts and held-out prompts, each set drawn with its own seed (the same for every model seed)."""
    write_tiny_vl_model(out / "model_init", tokenizer_corpus() + [IMAGE_QUESTION] * 50, size=size, seed=seed)
    raw = out / "raw"
    write_jsonl(vision_sft_records(image_records(generate_problems(sft_rows, "train"), raw, seed=0)),
                raw / "sft_train.jsonl")
    write_jsonl(vision_prompt_records(image_records(generate_problems(2048, "train", seed=1), raw, seed=1)),
                raw / "prompt_train.jsonl")
    write_jsonl(vision_prompt_records(image_records(generate_problems(EVAL_ROWS, "eval", seed=3), raw, seed=3)),
                raw / "prompt_eval.jsonl")


def prepare(out: Path) -> None:
    """Each raw set prepared with the model's processor (image tokens counted as the model will see them)."""
    tokenizer = AutoTokenizer.from_pretrained(out / "model_init")
    images = ImageProcessing.load(out / "model_init", tokenizer, ImageLimits())
    for name, data_type in DATASETS.items():
        counts = prepare_dataset([out / "raw" / f"{name}.jsonl"], data_type, tokenizer, MAX_LENGTH, out / "data" / name,
                                 images=images)
        print(f"[demo-vision] {name}: {counts['kept']} rows kept, {counts['dropped']} dropped", flush=True)


def run_stage(name: str, out: Path, args: argparse.Namespace) -> None:
    """One training stage through its script into `out/name`, with the demo's flags."""
    data = out / "data"
    torchrun = functools.partial(_torchrun_with, extra=common_flags(out, name, args.seed))
    if name == "sft":
        torchrun("train_sft.py", args.nproc, "--pretrain", str(out / "model_init"),
                 "--dataset", str(data / "sft_train"),
                 "--batch_size", "16", "--max_epochs", "100", "--max_steps", str(args.sft_steps), "--lr", "1e-3",
                 "--warmup_steps", "10", "--log_interval", "10", "--max_length", str(MAX_LENGTH))
    else:
        torchrun("train_grpo.py", args.nproc, "--pretrain", str(out / "sft" / "model"),
                 "--prompt_dataset", str(data / "prompt_train"), "--eval_dataset", str(data / "prompt_eval"),
                 "--reward_fn", "math_answer", "--num_generations", "8", "--batch_size", "16",
                 "--num_episodes", str(args.episodes), "--lr", "1e-4", "--warmup_steps", "20",
                 "--max_new_tokens", str(MAX_NEW_TOKENS), "--eval_interval", str(max(args.episodes // 4, 1)),
                 "--save_interval", str(max(args.episodes // 2, 1)),
                 "--sample_log_interval", str(max(args.episodes // 4, 1)))


def sample_sheet(path: Path, out: Path, results: Dict[str, Dict], count: int = 8) -> Path:
    """The first `count` held-out images, each above every model's greedy answer (right or wrong)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    rows = [json.loads(line) for line in (out / "raw" / "prompt_eval.jsonl").open()][:count]
    fig, axes = plt.subplots(2, (count + 1) // 2, figsize=(2.6 * ((count + 1) // 2), 4.6))
    for i, (ax, row) in enumerate(zip(axes.flat, rows)):
        ax.imshow(Image.open(out / "raw" / row["images"][0]))
        ax.set_xticks([])
        ax.set_yticks([])
        lines = [f"{name}: {_answer(r['samples'][i])} {'✓' if r['samples'][i]['math_answer'] else '✗'}"
                 for name, r in results.items()]
        ax.set_title(f"answer {row['gt_answer']}\n" + "\n".join(lines), fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _answer(sample: Dict) -> str:
    """A greedy completion, short enough for a caption, in printable ASCII (a random model writes any bytes)."""
    text = "".join(c if " " <= c <= "~" else "?" for c in str(sample["completion"]).strip())
    return text if len(text) <= 22 else text[:21] + "..."


def report(out: Path, results: Dict[str, Dict], timings: Dict[str, float]) -> Path:
    """Plots and REPORT.md / REPORT.html: held-out accuracy, the SFT loss, GRPO's curves, sample images."""
    sft, grpo = (read_metrics(out / name / "logs" / "metrics.jsonl") for name in ("sft", "grpo"))
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    images = [plot(plots / "sft_loss.png", "SFT on images", [("loss", [("train", sft, "train/loss")])]),
              plot(plots / "grpo.png", "GRPO on images", [
                  ("reward / held-out accuracy", [("train reward", grpo, "train/reward"),
                                                  ("held-out", grpo, "eval/rewards/math_answer")]),
                  ("completion length", [("sampled", grpo, "train/completions/mean_length_sampled")])])]
    accuracy = {name: r["accuracy"] for name, r in results.items()}
    if accuracy:
        images.append(bar_chart(plots / "heldout_accuracy.png", "Held-out accuracy (greedy, exact answer)", accuracy))
        images.append(sample_sheet(plots / "samples.png", out, results))
    checks = []
    if "sft" in results and "grpo" in results:
        checks = [reward_vs_accuracy("GRPO", grpo, "train/reward", results["sft"]["accuracy"],
                                     results["grpo"]["accuracy"])]
    blocks = [("h1", "coati vision demo report"),
              ("p", f"Arithmetic problems drawn as images; the text beside each is only \"{IMAGE_QUESTION}\". "
                    "Held-out images are drawn with other seeds. Accuracy = exact final answer of a greedy "
                    "completion (the math_answer reward)."),
              ("h2", "Held-out accuracy"),
              ("table", [["model", "accuracy", "prompts"]] + [[k, f"{v['accuracy']:.3f}", len(v["samples"])]
                                                            for k, v in results.items()]),
              ("h2", "Did RL help?")] + [("p", line) for line in checks if line] + [
              ("h2", "Stage wall times"),
              ("table", [["stage", "seconds"]] + [[k, f"{v:.1f}"] for k, v in timings.items()]),
              ("h2", "Plots and samples")] + [("image", str(path)) for path in images if path is not None]
    return write_report(out, blocks, "coati vision demo report")[0]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/demo_vision", help="output directory for every stage")
    parser.add_argument("--sft_rows", type=at_least(16), default=4096, help="drawn SFT rows")
    parser.add_argument("--sft_steps", type=at_least(1), default=1200, help="SFT optimizer steps (16 rows per rank)")
    parser.add_argument("--episodes", type=at_least(1), default=200,
                        help="GRPO episodes (16 prompts x 8 completions per rank each)")
    parser.add_argument("--model_size", default="tiny", choices=tuple(MODEL_SIZES))
    parser.add_argument("--nproc", type=at_least(1), default=2, help="processes per stage")
    parser.add_argument("--seed", type=int, default=42, help="seeds the model's initialisation and every stage")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    use_portable_cpu_kernels()
    timings: Dict[str, float] = {}
    with stage("build tiny model and drawn task data", timings):
        build_assets(out, args.model_size, args.sft_rows, args.seed)
    with stage("prepare datasets", timings):
        prepare(out)
    for name in ("sft", "grpo"):
        with stage(name, timings):
            run_stage(name, out, args)
    evaluate_and_report(out, timings, functools.partial(evaluate_all, models=MODELS, max_new_tokens=MAX_NEW_TOKENS),
                        report)


if __name__ == "__main__":
    main()
