"""ColossalChat's verifiable rewards, `coati.utils.reward_score`: a completion earns 1 for the format (<think> ...
</think><answer> ... </answer>, each tag once, in that order, the answer's closing tag last) and 9 more for the right
answer in the answer tags, 0 otherwise. They take ColossalChat's reward-model call, `fn(input_ids, attention_mask,
tokenizer=, response_start=, response_end=, gt_answer=, tags=)`; coati's own runs use `math_answer` and
`answer_format` instead."""
import re
from typing import Any, Dict, Optional, Tuple

import torch

DEFAULT_TAGS = {"think_start": {"text": "<think>", "num_occur": 1}, "think_end": {"text": "</think>", "num_occur": 1},
                "answer_start": {"text": "<answer>", "num_occur": 1}, "answer_end": {"text": "</answer>", "num_occur": 1}}
"""The tags a well-formed response holds, and how often."""
FORMAT_REWARD, ANSWER_REWARD = 1.0, 9.0
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def validate_response_structure(processed_str: str, tags: Optional[Dict[str, Dict[str, Any]]] = None) -> bool:
    """Whether `processed_str` holds each tag as often as `tags` says (default `DEFAULT_TAGS`), the think block before
    the answer block, and nothing after the answer's closing tag."""
    tags = DEFAULT_TAGS if tags is None else tags
    counts_right = all(processed_str.count(tag["text"]) == tag["num_occur"] for tag in tags.values())
    where = {name: processed_str.find(tag["text"]) for name, tag in tags.items()}
    in_order = where["think_start"] <= where["think_end"] <= where["answer_start"] <= where["answer_end"]
    ends_with_answer = len(processed_str) - where["answer_end"] == len(tags["answer_end"]["text"])
    return counts_right and in_order and ends_with_answer


def extract_solution(solution_str: str) -> Tuple[Optional[str], str]:
    """(the last <answer> block's text, stripped, or None without one; the response as given)."""
    answers = ANSWER.findall(solution_str)
    return (answers[-1].strip() if answers else None), solution_str


def _same(answer: str, gt_answer: str) -> bool:
    """Equal once spaces are removed and case is ignored."""
    return answer.strip().replace(" ", "").lower() == gt_answer.strip().replace(" ", "").lower()


def _is_integer(text: str) -> bool:
    """Whether Python's `int` reads `text` (ColossalChat's test of a GSM8K answer)."""
    try:
        int(text.strip())
    except ValueError:
        return False
    return True


def _response(input_ids: torch.Tensor, tokenizer: Any, start: int, end: int) -> str:
    return tokenizer.decode(input_ids[start:end], skip_special_tokens=True)


def _score(answer: Optional[str], text: str, gt_answer: str, tags: Optional[Dict], needs_integer: bool,
           device: torch.device) -> torch.Tensor:
    well_formed = answer is not None and validate_response_structure(text, tags)
    if well_formed and needs_integer:
        well_formed = _is_integer(answer)
    if not well_formed:
        return torch.tensor(0.0, device=device)
    return torch.tensor(FORMAT_REWARD + (ANSWER_REWARD if _same(answer, gt_answer) else 0.0), device=device)


def gsm8k_reward_fn(input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """GSM8K: the format reward needs a whole number in the answer tags; the response is tokens
    [response_start, response_end)."""
    gt_answer = kwargs["gt_answer"]
    if gt_answer is None:
        return torch.tensor(0.0, device=input_ids.device)
    text = _response(input_ids, kwargs["tokenizer"], kwargs["response_start"], kwargs["response_end"])
    answer, text = extract_solution(text)
    return _score(answer, text, gt_answer, kwargs.get("tags"), True, input_ids.device)


def math_competition_reward_fn(input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Competition math: any answer text; the response is tokens [response_start, response_end] (the end included,
    as ColossalChat reads it)."""
    gt_answer = kwargs["gt_answer"]
    if gt_answer is None:
        return torch.tensor(0.0, device=input_ids.device)
    text = _response(input_ids, kwargs["tokenizer"], kwargs["response_start"], kwargs["response_end"] + 1)
    answer, text = extract_solution(text)
    return _score(answer, text, gt_answer, kwargs.get("tags"), False, input_ids.device)


__all__ = ["validate_response_structure", "extract_solution", "gsm8k_reward_fn", "math_competition_reward_fn"]
