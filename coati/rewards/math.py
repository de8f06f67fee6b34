"""Verifiable rewards for math answers: extract the final answer, compare it numerically."""
import re
from fractions import Fraction
from typing import List, Optional, Sequence

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_HASHES = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a completion: the last `#### N`, else the last `\\boxed{...}`, else the last
    number in the text; None when there is none."""
    for pattern in (_HASHES, _BOXED):
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
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


def answers_match(completion: str, ground_truth: str) -> bool:
    """True when the completion's final answer equals `ground_truth` as a number (or, for answers that
    are not numbers, as whitespace-normalised text)."""
    answer = extract_answer(completion)
    if answer is None:
        return False
    truth = extract_answer(ground_truth) or ground_truth
    got, want = normalize_number(answer), normalize_number(truth)
    if got is not None and want is not None:
        return got == want
    return " ".join(answer.split()) == " ".join(str(truth).split())


def math_answer(prompts: Sequence[str], completions: Sequence[str], gt_answer: Sequence[str], **_: object) -> List[float]:
    """1.0 where the completion's final answer equals `gt_answer`, else 0.0."""
    return [float(answers_match(c, str(t))) for c, t in zip(completions, gt_answer)]


def answer_format(prompts: Sequence[str], completions: Sequence[str], **_: object) -> List[float]:
    """1.0 where the completion states its final answer as `#### N` or `\\boxed{N}`, else 0.0."""
    return [float(bool(_HASHES.search(c) or _BOXED.search(c))) for c in completions]
