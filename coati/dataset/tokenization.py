"""Chat-template tokenization with loss masks: labels cover assistant tokens only, end of turn included."""
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from coati.config import DEFAULT_STEP_SEPARATOR
from coati.utils.errors import CoatiUsageError, first_line
from coati.utils.file_checks import read_json

from .vision import ImageTokens

IGNORE_INDEX = -100


def load_tokenizer(path: str, trust_remote_code: bool = False, template_config: Optional[str] = None,
                   eos_token: Optional[str] = None, chat_template: Optional[str] = None,
                   pad_token: Optional[str] = None) -> PreTrainedTokenizerBase:
    """The tokenizer in `path` (EOS standing in for a missing pad token), with the chat template (where the
    JSON `template_config` has one; the tokenizer's own otherwise, as in ColossalChat, or its folder's processor's) and the optional
    end-of-turn token of `template_config` when given; `chat_template` (TRL's chat_template_path, `take_chat_template`)
    replaces the template; `eos_token` and `pad_token` (TRL's), tokens of its vocabulary, as its EOS and padding."""
    if not Path(path).is_dir():
        raise CoatiUsageError(f"tokenizer directory {path} does not exist or is not a directory")
    config = _template_config(template_config)
    if config is not None and not isinstance(config.get("chat_template", ""), str):
        raise CoatiUsageError(f"{template_config}: field 'chat_template' is not a string (--conversation_template_config)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise CoatiUsageError(f"no tokenizer could be loaded from {path} ({first_line(error)})") from None
    if not tokenizer.chat_template:
        tokenizer.chat_template = processor_chat_template(Path(path))
    if config is not None:
        tokenizer.chat_template = config.get("chat_template") or tokenizer.chat_template
        if config.get("end_of_turn_token"):
            tokenizer.eos_token = config["end_of_turn_token"]
    if chat_template:
        take_chat_template(tokenizer, chat_template, trust_remote_code)
    for flag, token in (("eos_token", eos_token), ("pad_token", pad_token)):
        if token and token not in tokenizer.get_vocab():
            raise CoatiUsageError(f"--{flag} {token!r} is not a token of the tokenizer in {path}")
        if token:
            setattr(tokenizer, flag, token)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if config is not None:
        check_template(tokenizer, f"--conversation_template_config {template_config}")
    return tokenizer


def take_chat_template(tokenizer: PreTrainedTokenizerBase, source: str, trust_remote_code: bool = False) -> None:
    """`tokenizer`'s chat template from `source`, as TRL's chat_template_path sets it: a Jinja file's text, or a
    tokenizer folder's template and its EOS. TRL adds the folder's tokens that `tokenizer` lacks and resizes the
    model's embeddings; here such a folder is refused, naming them, since a resized model is no longer the one given."""
    if Path(source).is_file():
        tokenizer.chat_template = Path(source).read_text()
        check_template(tokenizer, f"--chat_template {source}")
        return
    try:
        other = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise CoatiUsageError(f"--chat_template {source}: no tokenizer could be loaded there ({first_line(error)})") \
            from None
    template = other.chat_template or processor_chat_template(Path(source))
    if not isinstance(template, str):
        raise CoatiUsageError(f"--chat_template {source}: its tokenizer has no chat template")
    vocabulary = tokenizer.get_vocab()
    missing = [token.content for token in other.added_tokens_decoder.values() if token.content not in vocabulary]
    if missing:
        raise CoatiUsageError(f"--chat_template {source}: this tokenizer lacks {len(missing)} of its tokens "
                              f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); taking them would "
                              "resize the model's embeddings, which coati does not do: give a Jinja file of a template "
                              "written in this tokenizer's tokens")
    tokenizer.chat_template = template
    if other.eos_token:
        tokenizer.eos_token = other.eos_token
    check_template(tokenizer, f"--chat_template {source}")


def processor_chat_template(folder: Path) -> Optional[str]:
    """The chat template a vision-language model's processor keeps in `chat_template.json` (LLaVA's folders hold it
    there only), or None."""
    path = folder / "chat_template.json"
    template = read_json(path, "the processor's chat template").get("chat_template") if path.is_file() else None
    return template if isinstance(template, str) else None


PROBE = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "The answer is 2."}]
"""A conversation every chat template must render, its answer among what it writes."""


def check_template(tokenizer: PreTrainedTokenizerBase, given: str) -> None:
    """A template that fails on this tokenizer (a syntax error, or one that reads a `bos_token` it lacks) or that
    leaves the assistant's turn out is one line naming `given` (where it came from), not a traceback from inside
    jinja at the first row, nor every row dropped as if cut by truncation."""
    from jinja2 import TemplateError

    try:
        rendered = tokenizer.apply_chat_template(PROBE, tokenize=False)
    except TemplateError as error:
        raise CoatiUsageError(f"{given}: its chat template fails on the tokenizer ({type(error).__name__}: "
                              f"{first_line(error)})") from None
    if PROBE[-1]["content"] not in rendered:
        raise CoatiUsageError(f"{given}: its chat template does not write the assistant's turn (a conversation's "
                              "answer is not in what it renders)")


PROBE_ANSWERS = ("The answer is 2.", "#### 2", "2")
"""Answers whose first token a generation prompt ending in a space or a word's start would join."""


def splits_first_answer_token(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template's generation prompt ends inside the first token of an answer (a trailing space the
    answer's first word joins): labels covering the answer's characters then leave that token out."""
    return any(_prompt_ends_inside_a_token(tokenizer, answer) for answer in PROBE_ANSWERS)


def _prompt_ends_inside_a_token(tokenizer: PreTrainedTokenizerBase, answer: str) -> bool:
    """Whether the first token of `answer` in the rendered conversation begins inside the generation prompt (labels
    covering the answer's characters alone then leave that token out)."""
    prompt = tokenizer.apply_chat_template(PROBE[:1], tokenize=False, add_generation_prompt=True)
    rendered = tokenizer.apply_chat_template([PROBE[0], {"role": "assistant", "content": answer}], tokenize=False)
    if not rendered.startswith(prompt):
        return False
    offsets = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return any(begin < len(prompt) < end for begin, end in offsets)


def template_system_message(template_config: Optional[str]) -> Optional[str]:
    """The `system_message` of a ColossalChat template config: the system turn of every conversation that has
    none of its own (None: no such turn)."""
    message = (_template_config(template_config) or {}).get("system_message")
    if message is not None and not isinstance(message, str):
        raise CoatiUsageError(f"{template_config}: field 'system_message' is not a string (--conversation_template_config)")
    return message


def _template_config(path: Optional[str]) -> Optional[Dict[str, Any]]:
    return read_json(Path(path), "--conversation_template_config") if path else None


def assistant_spans(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Dict[str, str]],
                    first: int = 0, tools: Optional[List[Dict[str, Any]]] = None) -> List[tuple]:
    """Character spans of each assistant turn from message `first` on in the rendered conversation,
    end-of-turn token included.

    Rendering message prefixes finds where each turn starts and ends, so any template whose renders
    are prefix-consistent works, whatever its markup.
    """
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i < first:
            continue
        start = len(tokenizer.apply_chat_template(list(messages[:i]), tools=tools, tokenize=False,
                                                  add_generation_prompt=True))
        rendered = tokenizer.apply_chat_template(list(messages[: i + 1]), tools=tools, tokenize=False)
        eos = tokenizer.eos_token or ""
        end = rendered.rfind(eos, start) + len(eos) if eos and eos in rendered[start:] else len(rendered.rstrip())
        spans.append((start, end))
    return spans


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Dict[str, Any]], max_length: int, label_from: int = 0,
    tools: Optional[List[Dict[str, Any]]] = None, image_tokens: Optional[ImageTokens] = None,
) -> Optional[Dict[str, List[int]]]:
    """`input_ids` and `labels` for one conversation, truncated to `max_length` tokens from the right, rendered with
    `tools`' schemas where given. Labels cover the assistant turns from message `label_from` on (a response, not its
    context; tool answers never). With `image_tokens`, each image token is repeated as many times as its image has
    tokens (never labelled) before the cut, and the cut never splits an image (`ImageTokens.cut`).

    Markup after the last labelled token (the template's newline after the final end-of-turn) is
    dropped, so a row ends at its end-of-turn token as a rollout does: a reward model then reads its
    score at the token where PPO will read it.

    Returns None when truncation leaves no assistant token to learn from.
    """
    text = tokenizer.apply_chat_template(list(messages), tools=tools, tokenize=False)
    cut = {} if image_tokens else {"truncation": True, "max_length": max_length}
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, **cut)
    spans = assistant_spans(tokenizer, messages, label_from, tools)
    ids = encoded["input_ids"]
    labels = [
        token if any(s <= start and end <= e for s, e in spans) else IGNORE_INDEX
        for token, (start, end) in zip(ids, encoded["offset_mapping"])
    ]
    if image_tokens:
        ids, labels = image_tokens.expand(ids, labels, IGNORE_INDEX)
        ids, labels, _ = image_tokens.cut(ids, labels, max_length)
    end = max((i + 1 for i, label in enumerate(labels) if label != IGNORE_INDEX), default=0)
    if end == 0:
        return None
    return {"input_ids": ids[:end], "labels": labels[:end]}


def tokenize_text(tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str,
                  max_length: int) -> Optional[Dict[str, List[int]]]:
    """TRL's standard (plain-text) rows: `prompt + completion` tokenized as it is (the tokenizer's own special
    tokens, e.g. BOS, but no chat template), then EOS; labels on the tokens that reach into the completion, and EOS.
    Truncated to `max_length` from the right; None when that leaves no label."""
    encoded = tokenizer(prompt + completion, add_special_tokens=True, return_offsets_mapping=True)
    ids = encoded["input_ids"] + [tokenizer.eos_token_id]
    labels = [token if end > len(prompt) else IGNORE_INDEX for token, (_, end) in zip(ids, encoded["offset_mapping"])]
    labels.append(tokenizer.eos_token_id)
    ids, labels = ids[:max_length], labels[:max_length]
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": ids, "labels": labels}


def tokenize_preference(
    tokenizer: PreTrainedTokenizerBase,
    context: Sequence[Dict[str, Any]],
    chosen: Sequence[Dict[str, Any]],
    rejected: Sequence[Dict[str, Any]],
    max_length: int,
    image_tokens: Optional[ImageTokens] = None,
) -> Optional[Dict[str, List[int]]]:
    """`chosen_*` and `rejected_*` input_ids/labels for context+chosen and context+rejected; labels
    cover the response only, not assistant turns of the context (`image_tokens`: the context's images).

    Returns None when truncation leaves either side without a response token.
    """
    sides = {name: tokenize_conversation(tokenizer, list(context) + list(turns), max_length, label_from=len(context),
                                         image_tokens=image_tokens)
             for name, turns in (("chosen", chosen), ("rejected", rejected))}
    if any(encoded is None for encoded in sides.values()):
        return None
    return {f"{name}_{field}": values for name, encoded in sides.items() for field, values in encoded.items()}


def tokenize_kto(
    tokenizer: PreTrainedTokenizerBase,
    context: Sequence[Dict[str, str]],
    completion: Sequence[Dict[str, str]],
    desirable: bool,
    max_length: int,
) -> Optional[Dict[str, Any]]:
    """`input_ids`/`labels` of context+completion (labels on the completion), `prompt_length` (tokens
    before the first label, so a trainer can pair this prompt with another row's completion) and the
    `desirable` flag. None when truncation cuts the completion away."""
    encoded = tokenize_conversation(tokenizer, list(context) + list(completion), max_length, label_from=len(context))
    if encoded is None:
        return None
    prompt_length = next(i for i, label in enumerate(encoded["labels"]) if label != IGNORE_INDEX)
    return {**encoded, "prompt_length": prompt_length, "desirable": bool(desirable)}


def tokenize_steps(tokenizer: PreTrainedTokenizerBase, prompt: str, steps: Sequence[str], step_labels: Sequence[bool],
                   max_length: int, separator: str = DEFAULT_STEP_SEPARATOR) -> Optional[Dict[str, List[int]]]:
    """`prompt` then each step followed by `separator`, tokenized as one text; each step's label (1 correct, 0 not)
    sits on the token that holds the step's last character (as TRL's PRMTrainer places it), `IGNORE_INDEX`
    elsewhere. Steps past `max_length` are dropped; None when none fits. Needs a fast tokenizer (character
    offsets)."""
    text, ends = prompt, []
    for step in steps:
        text += step
        ends.append(len(text))
        text += separator
    encoded = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"][:max_length], encoded["offset_mapping"][:max_length]
    labels = [IGNORE_INDEX] * len(ids)
    for end, label in zip(ends, step_labels):
        position = next((i for i, (start, stop) in enumerate(offsets) if start < end <= stop), None)
        if position is None:
            break
        labels[position] = int(label)
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": ids, "labels": labels}
