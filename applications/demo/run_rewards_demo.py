"""Rewards and teachers beyond rules, on the demo task, each against plain GRPO from the same SFT model:

    python applications/demo/run_rewards_demo.py --out output/demo_rewards

builds the demo's tokenizer, model and arithmetic data, its solutions in two steps (the working, then the answer
line) -> SFT -> GRPO on `math_answer` (the baseline, and the distillation teacher) -> an LLM judge (the SFT model
fine-tuned on graded responses: written ones, and the SFT model's own samples graded against the reference) and
GRPO rewarded by the judge alone -> the judge fine-tuned on that GRPO model's own responses, graded (round 2), and GRPO
rewarded by it alone, on a KL leash to the SFT model -> a process reward model trained on
step-labelled solutions and GRPO with its step scores (`--adv_estimator process`) beside `math_answer` -> the SFT
model distilled from the GRPO model with no reward -> greedy held-out accuracy of each, the judge's and the PRM's own
held-out accuracy, and REPORT.md. Every stage is the real script under `torchrun --nproc_per_node 2 --plugin ddp`.
"""
import argparse
import dataclasses
import json
import random
import re
import sys
from pathlib import Path
from typing import Dict, List

from transformers import AutoTokenizer

from coati.dataset.demo_data import (REJECTIONS, Problem, generate_problems, prm_records, prompt_records, sft_records,
                                     tokenizer_corpus, write_jsonl)
from coati.dataset.prepare import prepare_dataset
from coati.inference.judge_server import HFJudgeEngine
from coati.models.tiny import MODEL_SIZES, write_tiny_model
from coati.rewards.judge import parse_score
from coati.rewards.math import math_answer
from coati.rollout.evaluation import evaluate_model
from coati.utils.ranges import at_least, non_negative

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_report  # noqa: E402
from run_demo import (MAX_NEW_TOKENS, _torchrun_with, check_stage_inputs, common_flags, stage,  # noqa: E402
                      use_portable_cpu_kernels)

RUBRIC = ("Question: {prompt}\nReference: {reference}\nResponse: {completion}\n"
          "Score: 10 if the response's final answer is the reference, else Score: 0.")
DATASETS = {"sft_train": "sft", "sft_eval": "sft", "prompt_train": "prompt", "prompt_eval": "prompt",
            "judge_train": "sft", "judge_eval": "sft", "prm_train": "prm", "prm_eval": "prm"}
STAGES = ("sft", "grpo", "judge", "grpo_judge", "judge2", "grpo_judge2", "prm", "grpo_prm", "distill")
NEEDS = {"grpo": ("sft",), "judge": ("sft",), "grpo_judge": ("sft", "judge"), "judge2": ("judge", "grpo_judge"),
         "grpo_judge2": ("sft", "judge2"), "prm": ("sft",), "grpo_prm": ("sft", "prm"), "distill": ("sft", "grpo")}
"""Stage -> the stages whose exported model it starts from, or scores or learns with."""
MODELS = {"sft": "sft/model", "grpo": "grpo/model", "grpo + judge": "grpo_judge/model",
          "grpo + judge, round 2": "grpo_judge2/model",
          "grpo + prm": "grpo_prm/model", "distilled from grpo": "distill/model"}
CURVES = {"grpo": "grpo (math_answer)", "grpo_judge": "grpo + judge (judge only)",
          "grpo_judge2": "grpo + judge, round 2 (judge only)", "distill": "distilled from grpo (no reward)"}
"""Stage -> its column in the report's table of held-out math_answer accuracy during training."""
MAX_LENGTH = 256


def two_steps(problem: Problem) -> Problem:
    """The solution as two steps, the answer line on a line of its own: a PRM reads each step where it ends."""
    return dataclasses.replace(problem, solution=problem.solution.replace(" #### ", "\n#### "))


def problems(n: int, split: str, seed: int) -> List[Problem]:
    return [two_steps(p) for p in generate_problems(n, split, seed=seed)]


def chat_prompt(tokenizer, question: str, special_tokens: bool) -> str:
    """The chat-templated prompt: with its special tokens (as a PRM reads the token sequence), or decoded without them
    (as reward functions such as the judge get the prompt of a rollout)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return tokenizer.decode(ids, skip_special_tokens=not special_tokens)


def garbled(number: int, rng: random.Random) -> str:
    """`number` written as a drifting policy writes numbers: its digits apart (`1 1`), a digit doubled or dropped, or
    a leading zero. GRPO rewarded by a judge that had never seen these learned to write `#### 1 1` for every
    two-digit answer, which the judge scored 10."""
    digits = str(number)
    i, kind = rng.randrange(len(digits)), rng.randrange(4)
    if kind == 0 and len(digits) > 1:
        return " ".join(digits)
    if kind == 1:
        return digits[:i + 1] + digits[i:]
    if kind == 2 and len(digits) > 1:
        return digits[:i] + digits[i + 1:]
    return "0" + digits


def scrambled_working(p: Problem, rng: random.Random) -> str:
    """A working of 1 to 8 pieces drawn at random (numbers of the question and others, `+ - = . #`, words of the
    question), as a policy that has drifted far from SFT writes one. GRPO rewarded by a judge that had only seen
    well-formed working learned to answer everything with `## 1 = 1.\n#### 1`, which the judge scored 10."""
    numbers = [str(n) for n in (*map(int, re.findall(r"\d+", p.question)), p.answer, rng.randrange(21))]
    pieces = [*numbers, "+", "-", "=", ".", "#", "##", "###", *p.question.rstrip("?").split()]
    return " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))


def written_response(p: Problem, rng: random.Random) -> str:
    """A response whose working and answer line are drawn apart. The working is right, a slip, the other operation
    (`REJECTIONS`) or scrambled (`scrambled_working`); the answer line is the reference (half the time), the working's
    own result, a near number, or a garbled one; a tenth are cut short anywhere (the working without its answer line,
    half a number); now and then no answer at all. Only the answer line against the reference tells right from
    wrong, as `math_answer` grades: a judge trained on this cannot score a response by whether its working agrees
    with its answer, the shortcut GRPO exploited (`8 + 3 = 13. #### 13` for a reference of 11, scored 10), nor pass
    working that never reaches an answer line (`4 + 2 = 12.`, scored 10 on another seed)."""
    if rng.random() < 0.05:
        return REJECTIONS["no_answer"](p, rng)
    kind = rng.choice(("right", "wrong_answer", "wrong_operation", "scrambled"))
    if kind == "scrambled":
        working, stated = scrambled_working(p, rng), rng.randrange(21)
    else:
        working = p.solution.split("\n")[0] if kind == "right" else REJECTIONS[kind](p, rng).split(" #### ")[0]
        stated = int(working.rstrip(".").split("= ")[-1])
    near = p.answer + rng.choice([-2, -1, 1, 2])
    draw = rng.random()
    if draw < 0.5:
        answer = str(p.answer)
    elif draw < 0.7:
        answer = str(stated if stated != p.answer else near)
    elif draw < 0.85:
        answer = str(near)
    else:
        answer = garbled(rng.choice([p.answer, near]), rng)
    response = f"{working}\n#### {answer}"
    return response[:rng.randrange(1, len(response))] if rng.random() < 0.1 else response


def graded_responses(tokenizer, items: List[Problem], seed: int) -> List[Dict]:
    """Judge training conversations on written responses (`written_response`), graded by `math_answer`."""
    rng = random.Random(seed)
    return judge_records(tokenizer, items, [written_response(p, rng) for p in items])


def judge_records(tokenizer, items: List[Problem], responses: List[str]) -> List[Dict]:
    """The rubric filled with each problem, its reference and its response -> `Score: 10` where `math_answer` grades
    the response right, else `Score: 0`: the judge learns the verifiable reward's verdicts."""
    grades = math_answer([], responses, [str(p.answer) for p in items]).values
    return [{"messages": [{"role": "user", "content": RUBRIC.format(prompt=chat_prompt(tokenizer, p.question, False),
                                                                   reference=p.answer, completion=response)},
                          {"role": "assistant", "content": f"Score: {10 if grade else 0}"}]}
            for p, response, grade in zip(items, responses, grades)]


def policy_graded_responses(policy: Path, items: List[Problem], seed: int) -> List[Dict]:
    """Judge training conversations on the `policy` model's own responses (one sampled at temperature 1 per problem, as
    GRPO samples them), graded by `math_answer` against the reference: the mistakes a judge must catch are the ones
    the policy makes, which the synthetic wrong answers of `graded_responses` only approximate."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(policy, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    torch.manual_seed(seed)
    responses: List[str] = []
    for start in range(0, len(items), 64):
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p.question}], add_generation_prompt=True)
                   for p in items[start:start + 64]]
        batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
        with torch.no_grad():
            generated = model.generate(**batch, do_sample=True, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS,
                                       pad_token_id=tokenizer.pad_token_id)
        responses += tokenizer.batch_decode(generated[:, batch["input_ids"].size(1):], skip_special_tokens=True)
    return judge_records(tokenizer, items, responses)


def build_assets(out: Path, size: str, steps: int, nproc: int, seed: int) -> None:
    """Tokenizer and random model, then the raw data of every stage (the same for every seed)."""
    write_tiny_model(out / "model_init", tokenizer_corpus(), size=size, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(out / "model_init")
    raw, rows = out / "raw", steps * 16 * nproc
    write_jsonl(sft_records(problems(rows, "train", 0)), raw / "sft_train.jsonl")
    write_jsonl(sft_records(problems(256, "eval", 0)), raw / "sft_eval.jsonl")
    write_jsonl(prompt_records(problems(2048, "train", 1)), raw / "prompt_train.jsonl")
    write_jsonl(prompt_records(problems(256, "eval", 3)), raw / "prompt_eval.jsonl")
    write_jsonl(graded_responses(tokenizer, problems(rows, "train", 4), 4), raw / "judge_train.jsonl")
    write_jsonl(graded_responses(tokenizer, problems(256, "eval", 5), 5), raw / "judge_eval.jsonl")
    for split, n, data_seed in (("train", rows, 6), ("eval", 256, 7)):
        records = prm_records(generate_problems(n, split, seed=data_seed), seed=data_seed)
        for record in records:   # prompts as the policy sees them, so the PRM reads what it will score
            record["prompt"] = chat_prompt(tokenizer, record["prompt"], True)
        write_jsonl(records, raw / f"prm_{split}.jsonl")


def add_policy_responses(out: Path, source: str, policy: str, judge: str, count: int, seed: int,
                         problem_seed: int) -> None:
    """A judge's training data, raw/JUDGE_train_with_policy.jsonl and data/JUDGE_train: raw/SOURCE.jsonl's graded
    responses, and the `policy` stage's model's own on `count` training problems, graded."""
    records = [json.loads(line) for line in (out / "raw" / f"{source}.jsonl").read_text().splitlines()]
    records += policy_graded_responses(out / policy / "model", problems(count, "train", problem_seed), seed)
    random.Random(seed).shuffle(records)
    write_jsonl(records, out / "raw" / f"{judge}_train_with_policy.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(out / "model_init")
    counts = prepare_dataset([out / "raw" / f"{judge}_train_with_policy.jsonl"], "sft", tokenizer, MAX_LENGTH,
                             out / "data" / f"{judge}_train")
    right = sum(r["messages"][1]["content"] == "Score: 10" for r in records)
    print(f"[demo] {judge}_train with the {policy} model's responses: {counts['kept']} rows kept, {right} graded "
          f"right", flush=True)


def prepare(out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(out / "model_init")
    for name, data_type in DATASETS.items():
        counts = prepare_dataset([out / "raw" / f"{name}.jsonl"], data_type, tokenizer, MAX_LENGTH, out / "data" / name)
        print(f"[demo] {name}: {counts['kept']} rows kept, {counts['dropped']} dropped", flush=True)
    (out / "rubric.txt").write_text(RUBRIC)


def supervised(out: Path, name: str, script: str, pretrain: str, data: str, steps: int, lr: str, nproc: int,
               seed: int, eval_data: str = "") -> None:
    """`script` from `pretrain` on data/DATA_train, evaluated on data/EVAL_DATA_eval (DATA's without one)."""
    _torchrun_with(script, nproc, "--pretrain", str(out / pretrain), "--dataset", str(out / "data" / f"{data}_train"),
                   "--eval_dataset", str(out / "data" / f"{eval_data or data}_eval"), "--batch_size", "16",
                   "--max_steps", str(steps), "--max_epochs", "100", "--lr", lr, "--warmup_steps", "5",
                   "--log_interval", "5",
                   extra=common_flags(out, name, seed))


def grpo(out: Path, name: str, pretrain: str, episodes: int, nproc: int, seed: int, *extra: str) -> None:
    """GRPO with the demo's settings from `pretrain`, rewarded by `math_answer` unless `extra` says otherwise."""
    _torchrun_with("train_grpo.py", nproc, "--pretrain", str(out / pretrain),
                   "--prompt_dataset", str(out / "data" / "prompt_train"), "--eval_dataset",
                   str(out / "data" / "prompt_eval"), "--reward_fn", "math_answer", "--num_generations", "8",
                   "--batch_size", "8", "--num_episodes", str(episodes), "--lr", "2e-4", "--warmup_steps", "20",
                   "--max_new_tokens", str(MAX_NEW_TOKENS), "--eval_interval", str(max(episodes // 6, 1)),
                   "--save_interval", str(episodes), "--sample_log_interval", str(max(episodes // 2, 1)),
                   extra=[*common_flags(out, name, seed), *extra])


def grpo_with_judge(out: Path, name: str, judge: str, episodes: int, nproc: int, seed: int, *extra: str) -> None:
    """GRPO from the SFT model rewarded by the `judge` stage's model alone; math_answer at weight 0 logs the policy's
    true accuracy beside the judge's reward, and rewards nothing."""
    grpo(out, name, "sft/model", episodes, nproc, seed, "--reward_fn", "judge", "math_answer=0", "--judge_model",
         str(out / judge / "model"), "--judge_rubric", str(out / "rubric.txt"), "--judge_max_tokens", "16", *extra)


def run(name: str, out: Path, args: argparse.Namespace) -> None:
    episodes, steps, nproc, seed = args.episodes, args.steps, args.nproc, args.seed
    judge_steps = args.judge_steps or 5 * steps
    if name == "sft":
        supervised(out, "sft", "train_sft.py", "model_init", "sft", steps, "3e-3", nproc, seed)
    elif name == "grpo":
        grpo(out, "grpo", "sft/model", episodes, nproc, seed)
    elif name == "judge":
        add_policy_responses(out, "judge_train", "sft", "judge", steps * 8 * nproc, seed, problem_seed=8)
        write_jsonl(policy_graded_responses(out / "sft" / "model", problems(256, "eval", 9), seed),
                    out / "raw" / "judge_eval_policy.jsonl")
        supervised(out, "judge", "train_sft.py", "sft/model", "judge", judge_steps, "1e-3", nproc, seed)
    elif name == "grpo_judge":
        grpo_with_judge(out, "grpo_judge", "judge", episodes, nproc, seed)
    elif name == "judge2":   # the judge, fine-tuned on what GRPO learned to write to fool it, graded
        add_policy_responses(out, "judge_train_with_policy", "grpo_judge", "judge2", steps * 8 * nproc, seed,
                             problem_seed=12)
        supervised(out, "judge2", "train_sft.py", "judge/model", "judge2", max(judge_steps // 2, 1), "1e-3", nproc,
                   seed, eval_data="judge")
    elif name == "grpo_judge2":
        grpo_with_judge(out, "grpo_judge2", "judge2", episodes, nproc, seed, "--kl_coef", str(args.judge2_kl_coef))
    elif name == "prm":
        supervised(out, "prm", "train_prm.py", "sft/model", "prm", max(steps // 2, 4), "1e-3", nproc, seed)
    elif name == "grpo_prm":
        grpo(out, "grpo_prm", "sft/model", episodes, nproc, seed, "--prm_pretrain", str(out / "prm" / "model"),
             "--adv_estimator", "process")
    elif name == "distill":   # math_answer at weight 0: logged and evaluated, never rewarded
        grpo(out, "distill", "sft/model", episodes, nproc, seed, "--reward_fn", "math_answer=0", "--teacher_model",
             str(out / "grpo" / "model"), "--distill_loss", "gkd")


def judge_accuracy(out: Path, judge: str, graded: str) -> float:
    """The `judge` stage's model's held-out grading accuracy on the responses of `graded` (raw/NAME.jsonl): its greedy
    `Score: N` against theirs."""
    engine = HFJudgeEngine(str(out / judge / "model"), "cpu")
    rows = [json.loads(line) for line in (out / "raw" / f"{graded}.jsonl").read_text().splitlines()]
    texts = [engine.render(row["messages"][:1]) for row in rows]
    answers = [a for start in range(0, len(texts), 64) for a in engine.generate(texts[start:start + 64], 16, 0.0)]
    truth = [parse_score(row["messages"][1]["content"], 10.0) for row in rows]
    return sum(parse_score(a, 10.0) == t for a, t in zip(answers, truth)) / len(rows)


def evaluate(out: Path) -> Dict[str, object]:
    results: Dict[str, object] = {}
    for name, folder in MODELS.items():
        if (out / folder / "config.json").is_file():
            result = evaluate_model(str(out / folder), [str(out / "data" / "prompt_eval")], ["math_answer"],
                                    MAX_NEW_TOKENS)
            results[name] = result.components["math_answer"]
            print(f"[demo] held-out accuracy of {name}: {results[name]:.3f}", flush=True)
    for judge in ("judge", "judge2"):
        if (out / judge / "model").is_dir():
            results[f"{judge} grading accuracy"] = judge_accuracy(out, judge, "judge_eval")
            results[f"{judge} grading accuracy on the SFT model's responses"] = judge_accuracy(out, judge,
                                                                                              "judge_eval_policy")
    prm_results = sorted((out / "prm").glob("eval_result_epoch*.json"))
    if prm_results:
        results["prm step accuracy"] = json.loads(prm_results[-1].read_text())["accuracy"]
    for model, folder in MODELS.items():   # the runs rewarded by a judge are those that log its reward
        judged = [m["train/rewards/judge/mean"] for m in _metrics((out / folder).parent)
                  if "train/rewards/judge/mean" in m]
        if judged:
            results[f"judge's reward, last 10 episodes of {model}"] = sum(judged[-10:]) / len(judged[-10:])
    results["accuracy during training"] = {name: _eval_history(out / name) for name in CURVES}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return results


def _metrics(folder: Path) -> List[Dict]:
    path = folder / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _eval_history(folder: Path) -> Dict[str, float]:
    """Greedy held-out math_answer accuracy by episode, from the run's evaluations."""
    path = folder / "eval_results.json"
    if not path.is_file():
        return {}
    history = json.loads(path.read_text())
    return {step: values.get("eval/rewards/math_answer", float("nan")) for step, values in history.items()}


def report(out: Path, results: Dict[str, object], args: argparse.Namespace) -> Path:
    rows = [[name, f"{value:.3f}"] for name, value in results.items() if isinstance(value, float)]
    history = results["accuracy during training"]
    episodes = sorted({int(e) for run in history.values() for e in run})
    curve = [[str(e)] + [f"{history[run].get(str(e), float('nan')):.3f}" for run in CURVES]
             for e in episodes]
    verdicts = [f"{name}: held-out accuracy {_change(results['sft'], results[name])}." for name in list(MODELS)[1:]
                if name in results]
    blocks = [("h1", "coati rewards demo"),
              ("p", f"seed {args.seed}, {args.steps} SFT steps, {args.episodes} episodes per RL stage, "
                    f"model size {args.model_size}"),
              ("h2", "Greedy held-out accuracy (and the judge's and the PRM's own held-out accuracy)"),
              ("table", [["model", "accuracy"], *rows]),
              ("p", " ".join(verdicts)),
              ("h2", "Greedy held-out accuracy during training: GRPO, GRPO on the judges, distillation from GRPO"),
              ("table", [["episode", *CURVES.values()], *curve])]
    return write_report(out, blocks, "coati rewards demo")[0]


def _change(before: float, after: float) -> str:
    if after == before:
        return f"stayed at {before:.3f} (SFT's)"
    return f"{'rose' if after > before else 'fell'} from {before:.3f} (SFT) to {after:.3f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/demo_rewards", help="output directory for every stage")
    parser.add_argument("--steps", type=at_least(1), default=200, help="SFT optimizer steps (the PRM takes half)")
    parser.add_argument("--episodes", type=at_least(1), default=300,
                        help="episodes of each RL stage (the main demo's GRPO takes 300; at 120, GRPO on math_answer "
                             "had not yet passed SFT)")
    parser.add_argument("--judge_steps", type=at_least(0), default=0,
                        help="the judge's optimizer steps (0: 5 x --steps, about three passes over its data; at "
                             "--steps it graded half the SFT model's responses wrong); the round-2 judge takes half")
    parser.add_argument("--judge2_kl_coef", type=non_negative(), default=0.1,
                        help="KL to the SFT model in GRPO with the round-2 judge (round 1 has none, and is exploited)")
    parser.add_argument("--model_size", default="small", choices=tuple(MODEL_SIZES))
    parser.add_argument("--nproc", type=at_least(1), default=2, help="processes per stage")
    parser.add_argument("--seed", type=int, default=42, help="seeds the model's initialisation and every stage")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES,
                        help="stages to run; a stage uses what earlier runs left in --out")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    check_stage_inputs(parser, out, args.stages, NEEDS)
    use_portable_cpu_kernels()
    timings: Dict[str, float] = {}
    if not (out / "data" / "prompt_eval").is_dir() or "sft" in args.stages:
        with stage("build tiny model and task data", timings):
            build_assets(out, args.model_size, args.steps, args.nproc, args.seed)
        with stage("prepare datasets", timings):
            prepare(out)
    for name in STAGES:
        if name in args.stages:
            with stage(name, timings):
                run(name, out, args)
    with stage("evaluate", timings):
        results = evaluate(out)
    print(f"[demo] finished: report in {report(out, results, args)}", flush=True)


if __name__ == "__main__":
    main()
