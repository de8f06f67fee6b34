"""Verifiable rewards for math answers: extract the final answer, compare it as a number, or symbolically with
math-verify where it is an expression (LaTeX, sets, intervals, equations)."""
import re
from fractions import Fraction
from typing import List, Optional, Sequence, Tuple

from .output import RewardOutput
from .verifier import ERROR, MATCH, MISMATCH, TIMEOUT, shared_verifier

_HASHES = re.compile(r"####\s*([^\n]+)")
_BRACES = re.compile(r"\\boxed\{|[{}]")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_boxed(text: str) -> Optional[str]:
    """The content of the last `\\boxed{...}` that closes, its braces matched to any depth; None without one. One pass
    over the text (a long completion full of unclosed boxes must not take quadratic time)."""
    opened: List[int] = []   # each brace still open: where a box's content starts, -1 for other braces
    last: Optional[Tuple[int, int]] = None
    for match in _BRACES.finditer(text):
        if match.group() == "}":
            if opened:
                start = opened.pop()
                if start >= 0 and (last is None or start > last[0]):
                    last = (start, match.start())
        else:
            opened.append(match.end() if match.group() == "\\boxed{" else -1)
    return text[last[0]:last[1]] if last else None


def marked_answer(text: str) -> Optional[str]:
    """The answer a text marks as final: the last `#### N`, else the last `\\boxed{...}`; None without either."""
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1].strip()
    boxed = last_boxed(text)
    return boxed.strip() if boxed is not None else None


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a completion: the marked one (`marked_answer`), else the last number in the text; None
    when there is none."""
    marked = marked_answer(text)
    if marked is not None:
        return marked
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize_number(answer: str) -> Optional[Fraction]:
    """`answer` as an exact number: thousands commas, `$`, `%`, a trailing period and surrounding text
    dropped; fractions `a/b` and `\\frac{a}{b}` understood. None when it holds no number."""
    text = answer.replace("\\!", "").replace("$", "").replace("%", "").strip()
    latex = re.search(r"(-?)\\[dt]?frac\{(-?[\d,]+)\}\{([\d,]+)\}", text)
    if latex:
        sign = -1 if latex.group(1) else 1
        return sign * Fraction(int(latex.group(2).replace(",", "")), int(latex.group(3).replace(",", "")))
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    token = numbers[0].replace(",", "")
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


_STRUCTURE = re.compile(r"[\\\[\](){}=^]")
_FRACTION = re.compile(r"^-?\\[dt]?frac\{-?[\d,]+\}\{[\d,]+\}$")


def is_expression(answer: str) -> bool:
    """Whether an answer is more than a number (LaTeX, brackets, an equation): math-verify compares those."""
    text = answer.replace("$", "").replace("\\!", "").strip()
    return bool(_STRUCTURE.search(text)) and not _FRACTION.match(text)


def _numeric_match(answer: str, truth: str) -> bool:
    got, want = normalize_number(answer), normalize_number(truth)
    if got is not None and want is not None:
        return got == want
    return " ".join(answer.split()) == " ".join(str(truth).split())


def check_answers(completions: Sequence[str], ground_truths: Sequence[str]) -> List[str]:
    """For each completion: MATCH, MISMATCH, TIMEOUT or ERROR against its ground truth. The completion's final answer
    is extracted (`extract_answer`), the ground truth's where it marks one (a GSM8K `... #### 3` is 3; else it is the
    answer as written); numbers are compared exactly, and where
    either side is an expression, math-verify decides (`\\frac{1}{2}` = 0.5, `x=3` = 3, sets, intervals), in
    worker processes with a timeout per check."""
    outcomes: List[Optional[str]] = []
    symbolic = []
    for completion, truth in zip(completions, ground_truths):
        answer = extract_answer(completion)
        truth = marked_answer(str(truth)) or str(truth)
        if answer is not None and (is_expression(answer) or is_expression(truth)):
            symbolic.append((len(outcomes), (truth, answer)))
            outcomes.append(None)
        else:
            outcomes.append(MATCH if answer is not None and _numeric_match(answer, truth) else MISMATCH)
    for (index, _), outcome in zip(symbolic, shared_verifier().check([pair for _, pair in symbolic]) if symbolic else []):
        outcomes[index] = outcome
    return outcomes


def answers_match(completion: str, ground_truth: str) -> bool:
    """True when the completion's final answer equals `ground_truth` (see `check_answers`)."""
    return check_answers([completion], [ground_truth])[0] == MATCH


def math_answer(prompts: Sequence[str], completions: Sequence[str], gt_answer: Sequence[str], **_: object) -> RewardOutput:
    """1.0 where the completion's final answer equals `gt_answer`, else 0.0. A symbolic check that times out or
    fails scores 0 and is counted in the diagnostics `timeouts` and `errors` (1.0 where it happened), logged as
    `rewards/math_answer/timeouts` and `/errors`."""
    outcomes = check_answers(completions, gt_answer)
    return RewardOutput([float(o == MATCH) for o in outcomes],
                        {"timeouts": [float(o == TIMEOUT) for o in outcomes],
                         "errors": [float(o == ERROR) for o in outcomes]})


def answer_format(prompts: Sequence[str], completions: Sequence[str], **_: object) -> List[float]:
    """1.0 where the completion states its final answer as `#### N` or `\\boxed{N}`, else 0.0."""
    return [float(bool(_HASHES.search(c)) or last_boxed(c) is not None) for c in completions]
