"""A learnable, verifiable task for tests and the demo: one-step arithmetic word problems.

The (a, b, operation) combinations are split deterministically into train and held-out sets, so
held-out accuracy measures generalisation, not recall.
"""
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Union

NAMES = ("Ann", "Ben", "Cat", "Dan", "Eve", "Fay", "Gus", "Hal")
ITEMS = ("apples", "pens", "books", "coins", "cards", "shells")
MAX_OPERAND = 20
HELD_OUT_EVERY = 5


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    solution: str


def _is_held_out(a: int, b: int, op: str) -> bool:
    return (a * 31 + b * 7 + (op == "-")) % HELD_OUT_EVERY == 0


def make_problem(a: int, b: int, op: str, name: str, item: str) -> Problem:
    if op == "+":
        question = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        answer = a + b
    else:
        question = f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"
        answer = a - b
    return Problem(question, answer, f"{a} {op} {b} = {answer}. #### {answer}")


def generate_problems(n: int, split: str = "train", seed: int = 0) -> List[Problem]:
    """`n` problems from the `train` or `eval` (held-out) combinations, reproducible from `seed`."""
    if split not in ("train", "eval"):
        raise ValueError("split must be 'train' or 'eval'")
    rng = random.Random(f"{seed}-{split}")
    problems = []
    while len(problems) < n:
        a, b, op = rng.randint(1, MAX_OPERAND), rng.randint(1, MAX_OPERAND), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        if _is_held_out(a, b, op) == (split == "eval"):
            problems.append(make_problem(a, b, op, rng.choice(NAMES), rng.choice(ITEMS)))
    return problems


def sft_records(problems: Iterable[Problem]) -> List[Dict]:
    return [{"messages": [{"role": "user", "content": p.question}, {"role": "assistant", "content": p.solution}]}
            for p in problems]


def preference_records(problems: Iterable[Problem], seed: int = 0) -> List[Dict]:
    """Chosen: the correct solution. Rejected: the same shape with a wrong answer."""
    rng = random.Random(seed)
    records = []
    for p in problems:
        wrong = p.answer + rng.choice([-3, -2, -1, 1, 2, 3])
        rejected = p.solution.rsplit("=", 1)[0] + f"= {wrong}. #### {wrong}"
        records.append({"context": [{"role": "user", "content": p.question}],
                        "chosen": [{"role": "assistant", "content": p.solution}],
                        "rejected": [{"role": "assistant", "content": rejected}]})
    return records


def prompt_records(problems: Iterable[Problem]) -> List[Dict]:
    return [{"messages": [{"role": "user", "content": p.question}], "gt_answer": str(p.answer)} for p in problems]


def tokenizer_corpus(n: int = 2000, seed: int = 0) -> List[str]:
    """Texts covering the task's vocabulary, to train the tiny tokenizer on."""
    problems = generate_problems(n, "train", seed) + generate_problems(n // 4, "eval", seed)
    return [f"{p.question} {p.solution}" for p in problems]


def write_jsonl(records: Iterable[Dict], path: Union[str, Path]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return path
