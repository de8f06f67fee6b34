"""A learnable, verifiable task for tests and the demo: one-step arithmetic word problems.

The (name, item) pairings are split deterministically into train and held-out sets: a held-out
question is worded in a way never seen in training, while the arithmetic facts it needs (operands up
to `MAX_OPERAND`) are the ones training covers. Held-out accuracy thus measures whether a model reads
the question and gets the fact right, which a tiny model learns partly by SFT and further by RL.
"""
import json
import operator
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Sequence, Tuple, Union

if TYPE_CHECKING:
    from PIL import Image

NAMES = ("Ann", "Ben", "Cat", "Dan", "Eve", "Fay", "Gus", "Hal")
ITEMS = ("apples", "pens", "books", "coins", "cards", "shells")
MAX_OPERAND = 9
HELD_OUT_EVERY = 6


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    solution: str


def _is_held_out(name: str, item: str) -> bool:
    return (NAMES.index(name) * 5 + ITEMS.index(item)) % HELD_OUT_EVERY == 0


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
    def draw(rng: random.Random) -> Tuple[bool, Problem]:
        a, b, op = rng.randint(1, MAX_OPERAND), rng.randint(1, MAX_OPERAND), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        return _is_held_out(name, item), make_problem(a, b, op, name, item)

    return _split_draws(n, split, random.Random(f"{seed}-{split}"), draw)


def _split_draws(n: int, split: str, rng: random.Random, draw: Callable[[random.Random], Tuple[bool, Problem]]
                 ) -> List[Problem]:
    """The first `n` problems `draw` makes from `rng` that fall in `split` (held out or not)."""
    if split not in ("train", "eval"):
        raise ValueError("split must be 'train' or 'eval'")
    problems = []
    while len(problems) < n:
        held_out, problem = draw(rng)
        if held_out == (split == "eval"):
            problems.append(problem)
    return problems


def sft_records(problems: Iterable[Problem]) -> List[Dict]:
    return [{"messages": [{"role": "user", "content": p.question}, {"role": "assistant", "content": p.solution}]}
            for p in problems]


def _wrong_answer(p: Problem, rng: random.Random) -> str:
    """The right working with a wrong result: telling it apart means checking the arithmetic."""
    wrong = p.answer + rng.choice([-3, -2, -1, 1, 2, 3])
    return p.solution.rsplit("=", 1)[0] + f"= {wrong}. #### {wrong}"


def _wrong_operation(p: Problem, rng: random.Random) -> str:
    """The other operation, worked correctly: it contradicts the question's 'gets more' / 'gives away'."""
    a, op, b = p.solution.split(" ")[:3]
    flipped = "-" if op == "+" else "+"
    result = int(a) - int(b) if flipped == "-" else int(a) + int(b)
    return f"{a} {flipped} {b} = {result}. #### {result}"


def _no_answer(p: Problem, rng: random.Random) -> str:
    """A reply that restates part of the question and never answers it."""
    return p.question.split(" and ")[0] + "."


REJECTIONS: Dict[str, Callable[[Problem, random.Random], str]] = {
    "wrong_answer": _wrong_answer, "wrong_operation": _wrong_operation, "no_answer": _no_answer,
}
LEARNABLE_REJECTIONS = ("wrong_operation", "no_answer")


def preference_records(problems: Iterable[Problem], seed: int = 0,
                       rejections: Sequence[str] = LEARNABLE_REJECTIONS) -> List[Dict]:
    """Chosen: the correct solution. Rejected: one of `rejections` (see `REJECTIONS`), drawn per problem.

    The default kinds are learnable by a small reward model from the text alone; `wrong_answer` needs
    the model to verify arithmetic and is the hard variant.
    """
    rng = random.Random(seed)
    records = []
    for p in problems:
        rejected = REJECTIONS[rng.choice(tuple(rejections))](p, rng)
        records.append({"context": [{"role": "user", "content": p.question}],
                        "chosen": [{"role": "assistant", "content": p.solution}],
                        "rejected": [{"role": "assistant", "content": rejected}]})
    return records


def kto_records(problems: Iterable[Problem], seed: int = 0,
                rejections: Sequence[str] = LEARNABLE_REJECTIONS) -> List[Dict]:
    """Unpaired completions for KTO: per problem, the correct solution (label true) or, as often, one
    of `rejections` (label false)."""
    rng = random.Random(seed)
    records = []
    for p in problems:
        desirable = rng.random() < 0.5
        completion = p.solution if desirable else REJECTIONS[rng.choice(tuple(rejections))](p, rng)
        records.append({"prompt": [{"role": "user", "content": p.question}],
                        "completion": [{"role": "assistant", "content": completion}], "label": desirable})
    return records


def prompt_records(problems: Iterable[Problem]) -> List[Dict]:
    return [{"messages": [{"role": "user", "content": p.question}], "gt_answer": str(p.answer)} for p in problems]


def gsm8k_records(problems: Iterable[Problem]) -> List[Dict]:
    """The problems in GSM8K's format (openai/gsm8k): `question`, and `answer` ending in `#### N`."""
    return [{"question": p.question, "answer": p.solution.replace(". ####", ".\n####")} for p in problems]


CODE_OPERATIONS = {"plus": ("+", operator.add), "minus": ("-", operator.sub), "times": ("*", operator.mul)}


@dataclass(frozen=True)
class CodeProblem:
    """"Write f(x) that returns x <op> k": the question, a correct solution and assert statements checking it."""

    question: str
    solution: str
    tests: List[str]


def generate_code_problems(n: int, seed: int = 0) -> List[CodeProblem]:
    """`n` one-line function tasks with three asserts each, reproducible from `seed` (for the `code_tests` reward)."""
    rng = random.Random(f"{seed}-code")
    problems = []
    for _ in range(n):
        word, k = rng.choice(tuple(CODE_OPERATIONS)), rng.randint(1, MAX_OPERAND)
        op, apply = CODE_OPERATIONS[word]
        solution = f"```python\ndef f(x):\n    return x {op} {k}\n```"
        tests = [f"assert f({x}) == {apply(x, k)}" for x in rng.sample(range(-MAX_OPERAND, 20), 3)]
        problems.append(CodeProblem(f"Write a Python function f(x) that returns x {word} {k}.", solution, tests))
    return problems


def code_sft_records(problems: Iterable[CodeProblem]) -> List[Dict]:
    return [{"messages": [{"role": "user", "content": p.question}, {"role": "assistant", "content": p.solution}]}
            for p in problems]


def code_prompt_records(problems: Iterable[CodeProblem]) -> List[Dict]:
    return [{"messages": [{"role": "user", "content": p.question}], "tests": p.tests} for p in problems]


PRODUCT_RANGE = (100, 999)
"""Operands of the tool task: three-digit products, which a tiny model cannot work out in its head."""


def generate_products(n: int, split: str = "train", seed: int = 0) -> List[Problem]:
    """`n` "What is A * B?" problems with three-digit A and B; held-out pairs are a fixed seventh of all pairs."""
    def draw(rng: random.Random) -> Tuple[bool, Problem]:
        a, b = rng.randint(*PRODUCT_RANGE), rng.randint(*PRODUCT_RANGE)
        return (a * 31 + b) % 7 == 0, Problem(f"What is {a} * {b}?", a * b, f"{a} * {b} = {a * b}. #### {a * b}")

    return _split_draws(n, split, random.Random(f"{seed}-products-{split}"), draw)


def tool_sft_records(problems: Iterable[Problem], tools: List[Dict]) -> List[Dict]:
    """Demonstrations of the calculator: call it with the question's expression, then answer with its result."""
    records = []
    for p in problems:
        expression = p.question.removeprefix("What is ").removesuffix("?")
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        records.append({"messages": [{"role": "user", "content": p.question},
                                     {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                                     {"role": "tool", "name": "calculator", "content": str(p.answer)},
                                     {"role": "assistant", "content": f"#### {p.answer}"}], "tools": tools})
    return records


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


def prm_records(problems: Iterable[Problem], seed: int = 0) -> List[Dict]:
    """Step-labelled solutions for a process reward model, in TRL's stepwise format: the working (`a op b = r.`) and
    the answer line (`#### r`), each labelled correct or not. Per problem one of: the solution (both right), the
    other operation (both wrong: the working contradicts the question), a slip in the working (both wrong), or the
    right working with another answer line (only the first right)."""
    rng = random.Random(seed)
    records = []
    for p in problems:
        working, answer = p.solution.split(" #### ")
        kind = rng.randrange(4)
        if kind == 0:
            steps, labels = [working, f"#### {answer}"], [True, True]
        elif kind == 1:
            flipped = _wrong_operation(p, rng)
            steps, labels = [flipped.split(" #### ")[0], f"#### {flipped.split(' #### ')[1]}"], [False, False]
        else:
            slipped = _wrong_answer(p, rng).split(" #### ")
            steps, labels = ([slipped[0], f"#### {slipped[1]}"], [False, False]) if kind == 2 else \
                ([working, f"#### {slipped[1]}"], [True, False])
        records.append({"prompt": p.question, "completions": steps, "labels": labels})
    return records


IMAGE_QUESTION = "What is the answer?"
"""The text beside each image of the vision task: the problem itself is only in the image."""
IMAGE_SIZE = (112, 56)
"""Width and height of a drawn problem (Qwen2.5-VL's 14-pixel patches: 8 x 4, eight image tokens after its 2 x 2
merge; LLaVA's processor resizes it to its square)."""
GLYPH_CELL = 28
"""Each character of a drawn problem sits in its own 28 x 28 cell, the area one image token covers after Qwen2.5-VL's
2 x 2 merge: a tiny random vision tower learns to read glyphs laid out so within minutes, and did not learn to read
text drawn at any offset (the first digit stayed at chance over 800 steps)."""
FONT_SIZES = (18, 20, 22, 24)


def draw_problem(p: Problem, rng: random.Random) -> "Image.Image":
    """The problem's expression (`a op b`, from its solution) drawn one character per cell (`GLYPH_CELL`) in a dark
    ink on a mid-grey noisy background; the row, the first cell, the font's size and weight, the ink, a jitter of up
    to 3 pixels and the noise drawn from `rng` (PIL's own font, so that every machine draws the same images). A
    mid-grey background keeps the normalised pixels near zero: on a light one the tower learned far more slowly."""
    from PIL import Image, ImageDraw, ImageFont

    width, height = IMAGE_SIZE
    noise = bytes(rng.randrange(100, 156) for _ in range(width * height))
    image = Image.merge("RGB", [Image.frombytes("L", IMAGE_SIZE, noise)] * 3)
    draw = ImageDraw.Draw(image)
    glyphs = p.solution.split(" = ")[0].replace(" ", "")
    font = ImageFont.load_default(size=rng.choice(FONT_SIZES))
    stroke = rng.choice((0, 1))
    ink = tuple(rng.randrange(0, 40) for _ in range(3))
    row = rng.randrange(height // GLYPH_CELL)
    first = rng.randrange(width // GLYPH_CELL - len(glyphs) + 1)
    for index, glyph in enumerate(glyphs):
        left, top, right, bottom = draw.textbbox((0, 0), glyph, font=font, stroke_width=stroke)
        x = (first + index) * GLYPH_CELL + (GLYPH_CELL - (right - left)) // 2 - left + rng.randint(-3, 3)
        y = row * GLYPH_CELL + (GLYPH_CELL - (bottom - top)) // 2 - top + rng.randint(-3, 3)
        draw.text((x, y), glyph, font=font, fill=ink, stroke_width=stroke, stroke_fill=ink)
    return image


def image_records(problems: Iterable[Problem], folder: Union[str, Path], seed: int = 0) -> List[Dict]:
    """Each problem drawn into `folder/images/` (`draw_problem`) and its row's shared fields: `images` (the path,
    relative to `folder`, where the JSONL goes), the user turn (the image, then `IMAGE_QUESTION`), the worked solution
    and the answer."""
    rng = random.Random(seed)
    (Path(folder) / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for index, p in enumerate(problems):
        name = f"images/{seed}-{index:05d}.png"
        draw_problem(p, rng).save(Path(folder) / name)
        user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": IMAGE_QUESTION}]}
        rows.append({"images": [name], "prompt": [user], "solution": p.solution, "answer": str(p.answer)})
    return rows


def vision_sft_records(rows: Iterable[Dict]) -> List[Dict]:
    """TRL's vision SFT rows: `images`, and `messages` whose assistant turn is the worked solution (`3 + 4 = 7. #### 7`:
    what the image says, then the answer)."""
    return [{"images": r["images"], "messages": [*r["prompt"], _assistant(r["solution"])]} for r in rows]


def vision_preference_records(rows: Iterable[Dict], seed: int = 0) -> List[Dict]:
    """TRL's vision DPO rows: `images`, `prompt`, the right answer `chosen`, a near miss `rejected`."""
    rng = random.Random(seed)
    return [{"images": r["images"], "prompt": r["prompt"], "chosen": [_assistant(r["answer"])],
             "rejected": [_assistant(str(int(r["answer"]) + rng.choice((-2, -1, 1, 2))))]} for r in rows]


def vision_prompt_records(rows: Iterable[Dict]) -> List[Dict]:
    """TRL's vision GRPO rows: `images`, `prompt`, and the answer as `gt_answer` for the reward."""
    return [{"images": r["images"], "prompt": r["prompt"], "gt_answer": r["answer"]} for r in rows]


def _assistant(text: str) -> Dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}
