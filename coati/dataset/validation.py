"""Reading and checking raw data rows: one clear error naming file, line and field for each bad row.

Accepted shapes (ColossalChat's and OpenAI/HF's):
- sft: `messages` = [{role|from, content|value}, ...]: an optional system turn, then user/assistant
  turns alternating, ending with a non-empty assistant turn. ShareGPT's `conversations` (`from`:
  human/gpt/system, `value`) is read the same way, for prompt data too.
- preference: `context` + `chosen` + `rejected` message lists, or `prompt`/`chosen`/`rejected` strings.
- prompt: `messages` ending with a user turn (a final assistant turn, the answer, is dropped, as ColossalChat
  does), or a `prompt` string; every other field (e.g. `gt_answer`) is carried through unchanged for the
  reward function.
- kto: `prompt` + `completion` (strings, or a message list and assistant turns, or ColossalChat's single
  completion message object) + boolean `label` (desirable or not), or `messages` ending with the assistant
  completion + `label`.
- GSM8K's `question` + `answer` (a worked solution ending in `#### N`, as in openai/gsm8k), for sft
  (the solution is the assistant turn) and prompt (`gt_answer` = N, commas dropped; `solution` kept).
"""
import functools
import json
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Tuple

from coati.utils.errors import CoatiUsageError

ROLE_ALIASES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system"}
Row = Dict[str, Any]


class DataValidationError(CoatiUsageError):
    """A raw row that cannot be used; the message names the file, the line and the field."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        super().__init__(f"{where}: field '{field}': {problem}")


def jsonl_lines(path: Path) -> Iterator[Tuple[str, str]]:
    """(`file:line`, text) for each non-blank line; a line that is not UTF-8 text (a binary file) is an
    error naming its file and line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            if b"\0" in raw:
                raise DataValidationError(where, "<line>", "binary data (a NUL byte); expected JSON Lines text")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataValidationError(where, "<line>", f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at "
                                                           f"column {error.start + 1}); expected JSON Lines text") from None
            if line.strip():
                yield where, line


def parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text.strip())
    except json.JSONDecodeError as error:
        raise DataValidationError(where, "<line>", f"invalid JSON ({error.msg} at column {error.colno})") from None


def _require(row: Any, field: str, where: str) -> Any:
    if not isinstance(row, dict):
        raise DataValidationError(where, "<row>", "expected a JSON object")
    if field not in row:
        raise DataValidationError(where, field, "missing")
    return row[field]


def normalize_messages(messages: Any, where: str, field: str) -> List[Dict[str, str]]:
    """Messages with `role`/`content` keys, from either key style; roles and contents checked."""
    if not isinstance(messages, list) or not messages:
        raise DataValidationError(where, field, "expected a non-empty list of messages")
    normalized = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DataValidationError(where, f"{field}[{i}]", "expected an object with role and content")
        role = ROLE_ALIASES.get(str(message.get("role", message.get("from", ""))).lower())
        content = message.get("content", message.get("value"))
        if role is None:
            raise DataValidationError(where, f"{field}[{i}].role", f"unknown role {message.get('role', message.get('from'))!r}")
        if not isinstance(content, str):
            raise DataValidationError(where, f"{field}[{i}].content", "missing or not a string")
        normalized.append({"role": role, "content": content})
    return normalized


def check_turn_order(messages: List[Dict[str, str]], where: str, field: str, last_role: str) -> None:
    """Optional system turn, then user/assistant alternating from user, ending with `last_role`."""
    turns = messages[1:] if messages[0]["role"] == "system" else messages
    for i, message in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise DataValidationError(where, field, f"wrong role order: turn {i + 1} is {message['role']}, expected {expected}")
    if not turns or turns[-1]["role"] != last_role:
        raise DataValidationError(where, field, f"must end with a {last_role} turn")
    for i, message in enumerate(turns):
        if message["role"] == "assistant" and not message["content"].strip():
            raise DataValidationError(where, field, f"assistant turn {i + 1} is empty")


GSM8K_MARK = "####"


def is_gsm8k(row: Any) -> bool:
    return isinstance(row, dict) and "messages" not in row and isinstance(row.get("question"), str) and "answer" in row


def gsm8k_answer(row: Row, where: str) -> str:
    """The final answer of a GSM8K solution (`... #### 1,234` gives `1234`)."""
    answer = row["answer"]
    if not isinstance(answer, str) or GSM8K_MARK not in answer or not answer.rsplit(GSM8K_MARK, 1)[1].strip():
        raise DataValidationError(where, "answer", f"a GSM8K answer is a solution ending in '{GSM8K_MARK} <number>'")
    return answer.rsplit(GSM8K_MARK, 1)[1].strip().replace(",", "")


SHAREGPT_FIELD = "conversations"


def conversation_field(row: Any) -> str:
    """Where a row keeps its conversation: `messages`, or ShareGPT's `conversations` when only that is there."""
    return SHAREGPT_FIELD if isinstance(row, dict) and "messages" not in row and SHAREGPT_FIELD in row else "messages"


def validate_sft(row: Any, where: str) -> Row:
    if is_gsm8k(row):
        gsm8k_answer(row, where)
        return {"messages": [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": row["answer"]}]}
    field = conversation_field(row)
    messages = normalize_messages(_require(row, field, where), where, field)
    check_turn_order(messages, where, field, last_role="assistant")
    return {"messages": messages}


def _response(row: Row, field: str, where: str) -> List[Dict[str, str]]:
    """Assistant turns from a string, a message list, or one message object (ColossalChat's KTO completion)."""
    value = _require(row, field, where)
    if isinstance(value, dict):
        value = [value]
    turns = [{"role": "assistant", "content": value}] if isinstance(value, str) else normalize_messages(value, where, field)
    if any(t["role"] != "assistant" for t in turns):
        raise DataValidationError(where, field, "must hold assistant turns only")
    if not "".join(t["content"] for t in turns).strip():
        raise DataValidationError(where, field, "empty response")
    return turns


def _prompt_turns(row: Any, field: str, where: str, drop_answer: bool = False) -> List[Dict[str, str]]:
    """The conversation so far: message list `field` ending with a user turn, or a plain `prompt` string. With
    `drop_answer`, a list that ends with an assistant turn loses it (ColossalChat's prompt data: the answer is
    not part of the prompt)."""
    if isinstance(row, dict) and field not in row and isinstance(row.get("prompt"), str):
        return [{"role": "user", "content": row["prompt"]}]
    messages = normalize_messages(_require(row, field, where), where, field)
    if drop_answer and len(messages) > 1 and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    check_turn_order(messages, where, field, last_role="user")
    return messages


def validate_preference(row: Any, where: str) -> Row:
    context = _prompt_turns(row, "context", where)
    return {"context": context, "chosen": _response(row, "chosen", where), "rejected": _response(row, "rejected", where)}


def validate_prompt(row: Any, where: str) -> Row:
    if is_gsm8k(row):
        extra = {k: v for k, v in row.items() if k not in ("question", "answer")}
        return {"messages": [{"role": "user", "content": row["question"]}], **extra,
                "gt_answer": gsm8k_answer(row, where), "solution": row["answer"]}
    field = conversation_field(row)
    messages = _prompt_turns(row, field, where, drop_answer=True)
    extra = {k: v for k, v in row.items() if k not in (field, "prompt")}
    return {"messages": messages, **extra}


def validate_kto(row: Any, where: str) -> Row:
    label = _require(row, "label", where)
    if not isinstance(label, bool):
        raise DataValidationError(where, "label", f"expected true or false, got {label!r}")
    if "messages" in row:
        messages = normalize_messages(row["messages"], where, "messages")
        check_turn_order(messages, where, "messages", last_role="assistant")
        return {"context": messages[:-1], "completion": messages[-1:], "label": label}
    prompt = _require(row, "prompt", where)
    if isinstance(prompt, str):
        context = [{"role": "user", "content": prompt}]
    else:
        context = normalize_messages(prompt, where, "prompt")
        check_turn_order(context, where, "prompt", last_role="user")
    return {"context": context, "completion": _response(row, "completion", where), "label": label}


VALIDATORS: Dict[str, Callable[[Any, str], Row]] = {
    "sft": validate_sft,
    "preference": validate_preference,
    "prompt": validate_prompt,
    "kto": validate_kto,
}


def validate_rows(entries: Iterable[Tuple[str, Callable[[], Any]]], data_type: str,
                  skip_invalid: bool = False) -> Tuple[List[Row], int]:
    """Validated, normalised rows of `entries`, pairs of (where, read) with `read()` giving the raw row;
    returns (rows, number skipped). Without `skip_invalid` the first bad row raises `DataValidationError`."""
    validate = VALIDATORS[data_type]
    rows, skipped = [], 0
    for where, read in entries:
        try:
            rows.append(validate(read(), where))
        except DataValidationError:
            if not skip_invalid:
                raise
            skipped += 1
    return rows, skipped


def jsonl_entries(paths: Iterable[Path]) -> Iterator[Tuple[str, Callable[[], Any]]]:
    """(`file:line`, parser) for every non-blank line of the JSONL `paths`, for `validate_rows`."""
    for path in paths:
        for where, text in jsonl_lines(path):
            yield where, functools.partial(parse_json, text, where)
