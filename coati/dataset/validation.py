"""Reading and checking raw data rows: one clear error naming file, line and field for each bad row.

Accepted shapes (ColossalChat's, OpenAI/HF's and every one of TRL's dataset formats). Conversational rows go
through the chat template; TRL's standard rows (plain text) are tokenized as they are, with no template, as TRL does.
- sft: `messages` = [{role|from, content|value}, ...]: an optional system turn, then user/assistant
  turns alternating (tool turns answering an assistant turn before the next), ending with a non-empty assistant turn
  (labels on the assistant turns); an optional `tools` column (OpenAI function schemas) the template renders. ShareGPT's
  `conversations` (`from`: human/gpt/system, `value`) is read the same way, for prompt data too. TRL's
  language modelling `text` (labels on all of it) and prompt-completion, standard (`prompt`/`completion`
  strings) or conversational (message lists), labels on the completion only.
- preference: `context` (or TRL's conversational `prompt`) + `chosen` + `rejected` message lists;
  `prompt`/`chosen`/`rejected` strings; TRL's implicit prompt, `chosen` and `rejected` alone (strings or full
  conversations), whose shared start is the prompt.
- prompt: `messages` or TRL's conversational `prompt`, ending with a user turn (a final assistant turn, the
  answer, is dropped, as ColossalChat does), or a standard `prompt` string; every other field (e.g.
  `gt_answer`) is carried through unchanged for the reward function, and a `tools` column (checked like sft's) as
  JSON text, for multi-turn rollouts.
- kto: `prompt` + `completion` (strings, or a message list and assistant turns, or ColossalChat's single
  completion message object) + boolean `label` (desirable or not), or `messages` ending with the assistant
  completion + `label`; or a preference row, read as two (chosen desirable, rejected not), as TRL's KTO does.
- prm: TRL's stepwise supervision: a `prompt` string, `completions` (a list of the solution's steps) and `labels`
  (a bool per step).
- GSM8K's `question` + `answer` (a worked solution ending in `#### N`, as in openai/gsm8k), for sft
  (the solution is the assistant turn) and prompt (`gt_answer` = N, commas dropped; `solution` kept).
"""
import functools
import json
import math
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Sequence, Tuple, Union

from coati.utils.errors import CoatiUsageError

from .vision import IMAGES, ImageError, content_parts, content_text, row_images

ROLE_ALIASES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system",
                "tool": "tool", "ipython": "tool", "function_call": "assistant", "observation": "tool"}
FOLLOWS = {None: ("user",), "user": ("assistant",), "assistant": ("user", "tool"), "tool": ("tool", "assistant")}
"""Which roles may come after each (None: the first turn after an optional system turn): tool answers follow an
assistant turn that called tools, and the assistant speaks after them."""
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
        raise DataValidationError(where, field, f"missing (the row's columns: {', '.join(map(str, row)) or 'none'}; "
                                                f"--dataset_columns COLUMN={field} reads one of them as {field})")
    return row[field]


def normalize_messages(messages: Any, where: str, field: str) -> List[Dict[str, str]]:
    """Messages with `role`/`content` keys, from either key style; roles and contents checked. A content given as
    parts is its text where it has no image, else its parts (`coati.dataset.vision.content_parts`)."""
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
        if isinstance(content, list):
            content = content_parts(content, where, f"{field}[{i}].content")
        if not isinstance(content, (str, list)):
            raise DataValidationError(where, f"{field}[{i}].content", "missing, or neither a string nor a list of "
                                                                      "content parts")
        name = message.get("name")
        normalized.append({"role": role, "content": content, **({"name": name} if role == "tool" and name else {})})
    return normalized


def check_turn_order(messages: List[Dict[str, str]], where: str, field: str, last_role: str) -> None:
    """Optional system turn, then user/assistant alternating from user (tool turns answering an assistant turn's
    calls between it and the next assistant turn), ending with `last_role`."""
    turns = messages[1:] if messages[0]["role"] == "system" else messages
    previous = None
    for i, message in enumerate(turns):
        if message["role"] not in FOLLOWS[previous]:
            expected = " or ".join(FOLLOWS[previous])
            raise DataValidationError(where, field, f"wrong role order: turn {i + 1} is {message['role']}, expected {expected}")
        previous = message["role"]
    if not turns or turns[-1]["role"] != last_role:
        raise DataValidationError(where, field, f"must end with a {last_role} turn")
    for i, message in enumerate(turns):
        if message["role"] == "assistant" and not content_text(message["content"]).strip():
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


def _text(row: Row, field: str, where: str, empty_ok: bool = False) -> str:
    value = _require(row, field, where)
    if not isinstance(value, str):
        raise DataValidationError(where, field, "expected a string (TRL's standard format) like the row's other texts")
    if not empty_ok and not value.strip():
        raise DataValidationError(where, field, "empty text")
    return value


def is_standard(row: Any, fields: Sequence[str]) -> bool:
    """Whether `row` is in TRL's standard format: every one of `fields` it has is plain text (not messages)."""
    present = [row[f] for f in fields if isinstance(row, dict) and f in row]
    return bool(present) and all(isinstance(value, str) for value in present)


def validate_sft(row: Any, where: str) -> Row:
    """A conversation (labels on its assistant turns), TRL's language modelling `text` (labels on all of it) or
    prompt-completion (labels on the completion: standard text, or prompt and completion message lists)."""
    if is_gsm8k(row):
        gsm8k_answer(row, where)
        return {"messages": [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": row["answer"]}]}
    if isinstance(row, dict) and "messages" not in row and SHAREGPT_FIELD not in row:
        if is_standard(row, ("text",)):
            return {"prompt_text": "", "completion_text": _text(row, "text", where)}
        if is_standard(row, ("prompt", "completion")):
            return {"prompt_text": _text(row, "prompt", where, empty_ok=True), "completion_text": _text(row, "completion", where)}
        if "prompt" in row and "completion" in row:
            prompt = _prompt_turns(row, "prompt", where)
            return {"messages": prompt + _response(row, "completion", where), "label_from": len(prompt)}
    field = conversation_field(row)
    messages = normalize_messages(_require(row, field, where), where, field)
    check_turn_order(messages, where, field, last_role="assistant")
    return {"messages": messages, **_tools(row, where)}


def _tools(row: Row, where: str) -> Row:
    """A conversation's `tools` column (OpenAI function schemas, or their JSON, TRL's format), which the chat template
    renders; nothing when the row has none."""
    tools = row.get("tools")
    if not tools:
        return {}
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as error:
            raise DataValidationError(where, "tools", f"invalid JSON ({error.msg})") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and "name" in t.get("function", t) for t in tools):
        raise DataValidationError(where, "tools", "expected a list of OpenAI function schemas "
                                                  "({\"type\": \"function\", \"function\": {\"name\": ...}})")
    return {"tools": tools}


def _response(row: Row, field: str, where: str) -> List[Dict[str, str]]:
    """Assistant turns from a string, a message list, or one message object (ColossalChat's KTO completion)."""
    value = _require(row, field, where)
    if isinstance(value, dict):
        value = [value]
    turns = [{"role": "assistant", "content": value}] if isinstance(value, str) else normalize_messages(value, where, field)
    if any(t["role"] != "assistant" for t in turns):
        raise DataValidationError(where, field, "must hold assistant turns only")
    if not "".join(content_text(t["content"]) for t in turns).strip():
        raise DataValidationError(where, field, "empty response")
    return turns


def _prompt_turns(row: Any, field: str, where: str, drop_answer: bool = False) -> List[Dict[str, str]]:
    """The conversation so far: message list `field` ending with a user turn, or a string, the user's turn (a plain
    prompt beside message-list responses). With `drop_answer`, a list that ends with an assistant turn loses it
    (ColossalChat's prompt data: the answer is not part of the prompt)."""
    if isinstance(_require(row, field, where), str):
        return [{"role": "user", "content": _text(row, field, where)}]
    messages = normalize_messages(row[field], where, field)
    if drop_answer and len(messages) > 1 and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    check_turn_order(messages, where, field, last_role="user")
    return messages


def shared_prefix(chosen: Sequence[Any], rejected: Sequence[Any]) -> int:
    """Where an implicit prompt ends (TRL's `extract_prompt`): the length of chosen's and rejected's common start,
    less a space it ends with (texts), so that the responses keep their leading space."""
    end = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
    if isinstance(chosen, str) and end > 0 and chosen[end - 1] == " ":
        end -= 1
    return end


def validate_preference(row: Any, where: str) -> Row:
    """A prompt with a chosen and a rejected response: standard texts (`prompt`, `chosen`, `rejected`), message
    lists (`context` or `prompt`, then the responses), or TRL's implicit prompt (`chosen` and `rejected` alone, whose
    shared start is the prompt); TRL's reward-model `margin`, where the row has one, kept beside them."""
    return {**_preference(row, where), **_margin(row, where)}


def _margin(row: Any, where: str) -> Row:
    """TRL's `margin` (how much better chosen is: the reward model's loss is -log sigmoid(r_c - r_r - margin)), a
    finite number, or nothing where the row has none."""
    if not isinstance(row, dict) or row.get("margin") is None:
        return {}
    margin = row["margin"]
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise DataValidationError(where, "margin", f"expected a finite number, got {margin!r}")
    return {"margin": float(margin)}


def _preference(row: Any, where: str) -> Row:
    if is_standard(row, ("prompt", "chosen", "rejected")):
        if "prompt" not in row:
            chosen, rejected = _text(row, "chosen", where), _text(row, "rejected", where)
            if chosen == rejected:
                raise DataValidationError(where, "chosen", "the same text as rejected: a pair needs two responses")
            end = shared_prefix(chosen, rejected)
            row = {"prompt": chosen[:end], "chosen": chosen[end:], "rejected": rejected[end:]}
        return {"prompt_text": _text(row, "prompt", where, empty_ok=True), "chosen_text": _text(row, "chosen", where),
                "rejected_text": _text(row, "rejected", where)}
    if isinstance(row, dict) and "context" not in row and "prompt" not in row and "chosen" in row:
        return _implicit_conversation(row, where)
    context = _prompt_turns(row, "prompt" if isinstance(row, dict) and "context" not in row else "context", where)
    return {"context": context, "chosen": _response(row, "chosen", where), "rejected": _response(row, "rejected", where)}


def _implicit_conversation(row: Row, where: str) -> Row:
    """Chosen and rejected conversations that share their first turns: those turns are the prompt."""
    chosen = normalize_messages(_require(row, "chosen", where), where, "chosen")
    rejected = normalize_messages(_require(row, "rejected", where), where, "rejected")
    end = shared_prefix(chosen, rejected)
    while end and chosen[end - 1]["role"] != "user":
        end -= 1
    others = sorted(set(row) - {"chosen", "rejected", "margin", "images"})
    unread = f"; the row's other columns ({', '.join(others)}) are not read as its prompt" if others else ""
    if not end:
        raise DataValidationError(where, "chosen", "no `prompt` (or `context`) column, so the prompt is the turns chosen "
                                                   "and rejected start with (TRL's implicit prompt), and they share none "
                                                   f"up to a user turn{unread}")
    context = chosen[:end]
    check_turn_order(context, where, "chosen", last_role="user")
    for side, turns in (("chosen", chosen), ("rejected", rejected)):
        if any(t["role"] != "assistant" for t in turns[end:]):
            raise DataValidationError(where, side, f"chosen and rejected differ from turn {end + 1} on, and the "
                                                   "response after their shared turns holds a user turn: a response is "
                                                   "assistant turns only; give the conversations every turn but the "
                                                   f"last reply in common, or a `prompt` column{unread}")
    return {"context": context, "chosen": _response({"chosen": chosen[end:]}, "chosen", where),
            "rejected": _response({"rejected": rejected[end:]}, "rejected", where)}


def validate_prompt(row: Any, where: str) -> Row:
    """A prompt to complete: messages (`messages`, ShareGPT's `conversations`, or TRL's conversational `prompt`), or
    TRL's standard `prompt` text, which is tokenized as it is, with no chat template. Other fields are kept."""
    if is_gsm8k(row):
        extra = {k: v for k, v in row.items() if k not in ("question", "answer")}
        return {"messages": [{"role": "user", "content": row["question"]}], **extra,
                "gt_answer": gsm8k_answer(row, where), "solution": row["answer"]}
    if isinstance(row, dict) and "messages" not in row and SHAREGPT_FIELD not in row and "prompt" in row:
        extra = {k: v for k, v in row.items() if k != "prompt"}
        if isinstance(row["prompt"], str):
            return {"prompt_text": _text(row, "prompt", where), **extra}
        return {"messages": _prompt_turns(row, "prompt", where, drop_answer=True), **extra}
    field = conversation_field(row)
    extra = {k: v for k, v in row.items() if k not in (field, "tools")}
    tools = _tools(row, where)
    return {"messages": _prompt_turns(row, field, where, drop_answer=True), **extra,
            **({"tools": json.dumps(tools["tools"])} if tools else {})}


def validate_kto(row: Any, where: str) -> Union[Row, List[Row]]:
    """An unpaired example (`prompt` + `completion` + boolean `label`: standard texts or message lists, or
    `messages` ending with the completion), or a preference row, which gives two: chosen desirable, rejected not
    (as TRL's KTO trainer reads preference data)."""
    if isinstance(row, dict) and "chosen" in row and "rejected" in row and "label" not in row:
        pair = validate_preference(row, where)
        if "prompt_text" in pair:
            return [{"prompt_text": pair["prompt_text"], "completion_text": pair[side], "label": side == "chosen_text"}
                    for side in ("chosen_text", "rejected_text")]
        return [{"context": pair["context"], "completion": pair[side], "label": side == "chosen"}
                for side in ("chosen", "rejected")]
    label = _require(row, "label", where)
    if not isinstance(label, bool):
        raise DataValidationError(where, "label", f"expected true or false, got {label!r}")
    if "messages" in row:
        messages = normalize_messages(row["messages"], where, "messages")
        check_turn_order(messages, where, "messages", last_role="assistant")
        return {"context": messages[:-1], "completion": messages[-1:], "label": label}
    if is_standard(row, ("prompt", "completion")):
        return {"prompt_text": _text(row, "prompt", where, empty_ok=True), "completion_text": _text(row, "completion", where),
                "label": label}
    _require(row, "prompt", where)
    return {"context": _prompt_turns(row, "prompt", where), "completion": _response(row, "completion", where), "label": label}


def validate_prm(row: Any, where: str) -> Row:
    """TRL's stepwise supervision row: a `prompt` string, `completions` (the solution's steps, strings) and `labels`
    (a bool per step: whether that step is correct)."""
    prompt = _text(row, "prompt", where, empty_ok=True)
    steps = _require(row, "completions", where)
    if not isinstance(steps, list) or not steps or not all(isinstance(step, str) and step.strip() for step in steps):
        raise DataValidationError(where, "completions", "expected a non-empty list of the solution's steps (non-empty "
                                                        "strings)")
    if "labels" not in row:
        raise DataValidationError(where, "labels", "missing: a process reward model needs a label per step (true: "
                                                   "the step is correct), as in TRL's stepwise supervision format")
    labels = row["labels"]
    if not isinstance(labels, list) or not all(isinstance(label, bool) for label in labels):
        raise DataValidationError(where, "labels", f"expected a list of true/false, one per step, got {labels!r:.60}")
    if len(labels) != len(steps):
        raise DataValidationError(where, "labels", f"{len(labels)} labels for {len(steps)} steps")
    return {"prompt_text": prompt, "steps": steps, "step_labels": labels}


VALIDATORS: Dict[str, Callable[[Any, str], Union[Row, List[Row]]]] = {
    "sft": validate_sft,
    "preference": validate_preference,
    "prompt": validate_prompt,
    "kto": validate_kto,
    "prm": validate_prm,
}


IMAGE_TYPES = ("sft", "preference", "prompt")
"""The data types whose rows may hold images."""
Entry = Tuple[str, Callable[[], Any], Path]
"""Where a raw row is (`file:line`), how to read it, and the folder its relative image paths are beside."""


def validate_rows(entries: Iterable[Entry], data_type: str, skip_invalid: bool = False) -> Tuple[List[Row], int]:
    """Validated, normalised rows of `entries` (`Entry`), their images read and checked (`row_images`); returns
    (rows, number skipped). Without `skip_invalid` the first bad row raises `DataValidationError`."""
    validate = VALIDATORS[data_type]
    rows, skipped = [], 0
    for where, read, base in entries:
        try:
            raw = read()
            found = validate(raw, where)
            found = [_with_images(row, raw, where, base, data_type) for row in (found if isinstance(found, list) else [found])]
            rows.extend(found)
        except (DataValidationError, ImageError):
            if not skip_invalid:
                raise
            skipped += 1
    return rows, skipped


def _with_images(row: Row, raw: Any, where: str, base: Path, data_type: str) -> Row:
    row = row_images(row, raw, where, base)
    if IMAGES in row and data_type not in IMAGE_TYPES:
        raise DataValidationError(where, IMAGES, f"{data_type} data takes no images ({', '.join(IMAGE_TYPES)} data do)")
    return row


def with_columns_renamed(entries: Iterable[Entry], columns: Sequence[Tuple[str, str]]) -> Iterator[Entry]:
    """`entries` whose rows have each column OLD of `columns` (OLD, NEW) under the name NEW (--dataset_columns):
    data whose columns are named otherwise (OpenRLHF's input_key, verl's prompt_key) read as coati's formats."""
    for where, read, base in entries:
        yield where, functools.partial(_renamed, read, columns, where) if columns else read, base


def _renamed(read: Callable[[], Any], columns: Sequence[Tuple[str, str]], where: str) -> Any:
    row = read()
    if not isinstance(row, dict):
        return row
    given = list(row)
    for old, new in columns:
        if old not in row:
            raise DataValidationError(where, old, f"no such column to read as {new!r} (--dataset_columns {old}={new}); "
                                                  f"the row has {', '.join(map(repr, given)) or 'none'}")
        if new in row:
            raise DataValidationError(where, new, f"the row has it already beside {old!r}, which --dataset_columns "
                                                  f"{old}={new} reads as it: name one of them otherwise")
        row[new] = row.pop(old)
    return row


def jsonl_entries(paths: Iterable[Path]) -> Iterator[Entry]:
    """An `Entry` for every non-blank line of the JSONL `paths`, for `validate_rows`."""
    for path in paths:
        for where, text in jsonl_lines(path):
            yield where, functools.partial(parse_json, text, where), path.parent
