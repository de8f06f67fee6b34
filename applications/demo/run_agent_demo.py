"""Tool use learned end to end, on tiny built-in defaults, with nothing downloaded (`make demo-agent`):

    python applications/demo/run_agent_demo.py --out output/demo_agent

"What is A * B?" with three-digit A and B: a product a tiny model cannot work out in its head, and one call of the
`calculator` tool away. Build a tokenizer and a small random Llama -> SFT without the tool (the worked answer) and
SFT on tool-use demonstrations (call the calculator, then answer with its result) -> GRPO from the tool SFT model in
multi-turn episodes with the calculator (`--tools calculator`, the `math_answer` reward) -> held-out accuracy of the
three (greedy; the tool models in episodes that may call it) -> REPORT.md / REPORT.html with plots and sample
conversations. Each stage runs the real `examples/training_scripts` under `torchrun --plugin ddp`.
"""
import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Dict, List

from transformers import AutoTokenizer

from coati.dataset.demo_data import generate_products, prompt_records, sft_records, tool_sft_records, write_jsonl
from coati.dataset.prepare import prepare_dataset
from coati.models.tiny import CHAT_TEMPLATE, MODEL_SIZES, write_tiny_model
from coati.rollout.evaluation import evaluate_model
from coati.rollout.tools import resolve_tools, tool_schemas
from coati.utils.ranges import at_least, in_range

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import bar_chart, plot, read_metrics, write_report  # noqa: E402
from run_demo import (_torchrun_with, common_flags, evaluate_and_report, stage,  # noqa: E402
                      use_portable_cpu_kernels)

TOOLS = ["calculator"]
MODELS = {"sft (no tool)": ("sft_plain", ()), "sft (tool)": ("sft_tool", TOOLS), "grpo (tool)": ("grpo_tool", TOOLS)}
"""Model name -> (its folder under --out, the tools its held-out episodes may call)."""
MAX_NEW_TOKENS = 48
MAX_TURNS = 2
MAX_LENGTH = 320
VOCAB_SIZE = 1024
"""Room for merges of the tool block the template puts in every prompt, so it takes few tokens."""


def corpus(problems: List, schemas: List[Dict]) -> List[str]:
    """What the tokenizer learns its merges from: the task's texts, the tool calls and the template's tool block."""
    tool_block = CHAT_TEMPLATE.split("{% for tool")[0] + "".join(json.dumps(s) for s in schemas)
    texts = [tool_block + " system user assistant tool"] * 50
    for record in tool_sft_records(problems, schemas) + sft_records(problems):
        texts.append(" ".join(m["content"] for m in record["messages"]))
    return texts


def tool_demonstrations(problems: List, schemas: List[Dict], tool_fraction: float) -> List[Dict]:
    """SFT rows that all offer the calculator: the first `tool_fraction` of `problems` call it, the rest answer in
    their head, as a model that does not always use its tools (RL is then to learn when to)."""
    calls = round(len(problems) * tool_fraction)
    direct = [{**record, "tools": schemas} for record in sft_records(problems[calls:])]
    return tool_sft_records(problems[:calls], schemas) + direct


def build_assets(out: Path, size: str, sft_rows: int, tool_fraction: float, seed: int) -> None:
    """Tokenizer and random model, then the raw task data: demonstrations with and without the tool, prompts."""
    schemas = tool_schemas(resolve_tools(TOOLS))
    demos = generate_products(sft_rows, "train")
    write_tiny_model(out / "model_init", corpus(demos, schemas), size=size, seed=seed, vocab_size=VOCAB_SIZE)
    raw = out / "raw"
    write_jsonl(sft_records(demos), raw / "sft_plain.jsonl")
    write_jsonl(tool_demonstrations(demos, schemas, tool_fraction), raw / "sft_tool.jsonl")
    write_jsonl(prompt_records(generate_products(2048, "train", seed=1)), raw / "prompt_train.jsonl")
    write_jsonl(prompt_records(generate_products(256, "eval", seed=3)), raw / "prompt_eval.jsonl")


def prepare(out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(out / "model_init")
    for name, data_type in (("sft_plain", "sft"), ("sft_tool", "sft"), ("prompt_train", "prompt"), ("prompt_eval", "prompt")):
        counts = prepare_dataset([out / "raw" / f"{name}.jsonl"], data_type, tokenizer, MAX_LENGTH, out / "data" / name)
        print(f"[demo-agent] {name}: {counts['kept']} rows kept, {counts['dropped']} dropped", flush=True)


def run_stage(name: str, out: Path, steps: int, episodes: int, nproc: int, seed: int) -> None:
    """One training stage through its script into `out/name`, with the demo's flags."""
    data = out / "data"
    torchrun = functools.partial(_torchrun_with, extra=common_flags(out, name, seed))
    if name.startswith("sft"):
        torchrun("train_sft.py", nproc, "--pretrain", str(out / "model_init"), "--dataset", str(data / name),
                 "--batch_size", "16", "--max_epochs", "100", "--max_steps", str(steps), "--lr", "3e-3",
                 "--warmup_steps", "5", "--log_interval", "5", "--max_length", str(MAX_LENGTH))
    else:
        torchrun("train_grpo.py", nproc, "--pretrain", str(out / "sft_tool" / "model"),
                 "--prompt_dataset", str(data / "prompt_train"), "--eval_dataset", str(data / "prompt_eval"),
                 "--reward_fn", "math_answer", "--num_generations", "8", "--batch_size", "4",
                 "--num_episodes", str(episodes), "--lr", "2e-4", "--warmup_steps", "5",
                 "--tools", *TOOLS, "--max_turns", str(MAX_TURNS), "--max_new_tokens", str(MAX_NEW_TOKENS),
                 "--eval_interval", str(max(episodes // 4, 1)), "--save_interval", str(max(episodes // 2, 1)),
                 "--sample_log_interval", str(max(episodes // 4, 1)))


def evaluate_all(out: Path) -> Dict[str, Dict]:
    """Greedy held-out accuracy of each model; the tool models in episodes that may call the calculator."""
    results = {}
    for name, (folder, tools) in MODELS.items():
        if (out / folder / "model" / "config.json").is_file():
            result = evaluate_model(str(out / folder / "model"), [str(out / "data" / "prompt_eval")], ["math_answer"],
                                    MAX_NEW_TOKENS, tools=tools, max_turns=MAX_TURNS)
            results[name] = {"accuracy": result.components["math_answer"], "samples": result.samples}
            print(f"[demo-agent] held-out accuracy of {name}: {results[name]['accuracy']:.3f}", flush=True)
    (out / "heldout_accuracy.json").write_text(json.dumps({k: v["accuracy"] for k, v in results.items()}, indent=2))
    return results


def conversation_text(completion) -> str:
    """A held-out episode as one line per turn: what the model wrote and what the tool answered."""
    if isinstance(completion, str):
        return completion
    return " | ".join(f"{m['role']}: {m['content']}" for m in completion)


def report(out: Path, results: Dict[str, Dict], timings: Dict[str, float]) -> Path:
    """Plots and REPORT.md / REPORT.html: held-out accuracy, GRPO's curves, sample conversations."""
    grpo = read_metrics(out / "grpo_tool" / "logs" / "metrics.jsonl")
    sft = {name: read_metrics(out / name / "logs" / "metrics.jsonl") for name in ("sft_plain", "sft_tool")}
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    images = [
        plot(plots / "sft_loss.png", "SFT", [("loss", [("no tool", sft["sft_plain"], "train/loss"),
                                                        ("tool", sft["sft_tool"], "train/loss")])]),
        plot(plots / "grpo.png", "GRPO with the calculator", [
            ("reward / held-out accuracy", [("train reward", grpo, "train/reward"),
                                            ("held-out", grpo, "eval/rewards/math_answer")]),
            ("tool calls and errors per episode", [("calls", grpo, "train/rollout/tool_calls"),
                                                   ("malformed", grpo, "train/rollout/tool_errors/malformed"),
                                                   ("bad arguments", grpo, "train/rollout/tool_errors/bad_arguments")]),
            ("turns per episode", [("turns", grpo, "train/rollout/turns")])]),
    ]
    accuracy = {name: r["accuracy"] for name, r in results.items()}
    if accuracy:
        images.append(bar_chart(plots / "heldout_accuracy.png", "Held-out accuracy (greedy, exact answer)", accuracy))
    names = list(results)
    questions = [json.loads(line)["messages"][0]["content"] for line in (out / "raw" / "prompt_eval.jsonl").open()]
    samples = [[question] + [f"{conversation_text(results[n]['samples'][i]['completion'])} "
                             f"({'right' if results[n]['samples'][i]['math_answer'] else 'wrong'})" for n in names]
               for i, question in enumerate(questions[:6])]
    blocks = [("h1", "coati agent demo report"),
              ("p", "What is A * B? with three-digit A and B, held-out operand pairs. Accuracy = exact final answer "
                    "of a greedy episode (the math_answer reward); the tool models may call the calculator."),
              ("h2", "Held-out accuracy"),
              ("table", [["model", "accuracy", "prompts"]] + [[k, f"{v['accuracy']:.3f}", len(v["samples"])]
                                                            for k, v in results.items()]),
              ("h2", "Stage wall times"),
              ("table", [["stage", "seconds"]] + [[k, f"{v:.1f}"] for k, v in timings.items()]),
              ("h2", "Plots")] + [("image", str(path)) for path in images if path is not None]
    blocks += [("h2", "Sample held-out conversations"), ("table", [["question"] + names] + samples)]
    return write_report(out, blocks, "coati agent demo report")[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/demo_agent", help="output directory for every stage")
    parser.add_argument("--sft_rows", type=at_least(1), default=800, help="demonstrations of each SFT stage")
    parser.add_argument("--tool_fraction", type=in_range(0, 1), default=0.5,
                        help="of the tool SFT stage's demonstrations, the fraction that call the calculator")
    parser.add_argument("--sft_steps", type=at_least(1), default=600, help="optimizer steps of each SFT stage (16 rows each)")
    parser.add_argument("--episodes", type=at_least(1), default=16, help="GRPO episodes (4 prompts x 8 episodes per rank)")
    parser.add_argument("--model_size", default="small", choices=tuple(MODEL_SIZES))
    parser.add_argument("--nproc", type=at_least(1), default=2, help="processes per stage")
    parser.add_argument("--seed", type=int, default=42, help="seeds the model's initialisation and every stage")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    use_portable_cpu_kernels()
    timings: Dict[str, float] = {}
    with stage("build tiny model and task data", timings):
        build_assets(out, args.model_size, args.sft_rows, args.tool_fraction, args.seed)
    with stage("prepare datasets", timings):
        prepare(out)
    for name in ("sft_plain", "sft_tool", "grpo_tool"):
        with stage(name, timings):
            run_stage(name, out, args.sft_steps, args.episodes, args.nproc, args.seed)
    evaluate_and_report(out, timings, evaluate_all, report)


if __name__ == "__main__":
    main()
