"""Token-in, token-out conversations: the trained sequence of a multi-turn episode is the engine's sampled token ids,
verbatim, turn after turn, and only what the environment adds is tokenized.

After a model turn (sampled ids ending in a stop token), the chat template is rendered once with a placeholder in
place of the turn; the text the template puts after the turn's stop token (the rest of its closing, the environment's
messages, the next assistant header) is tokenized on its own and appended. The model's text is decoded to parse its
tool calls, never re-encoded. This is exact only for templates that render a conversation by appending;
`check_appending` proves that at start-up on a probe conversation, token for token against the template's rendering
of the whole conversation, and refuses a template that rewrites history (Qwen3's drops earlier reasoning) in one line.
"""
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from coati.dataset.collators import IMAGE_INPUTS
from coati.dataset.vision import IMAGES, ImageProcessing
from coati.utils.errors import CoatiUsageError

Message = Dict[str, Any]
PLACEHOLDER = "\u2063coati-turn\u2063"
"""Stands for a model turn when the template is rendered (invisible separators: no model writes it)."""


class ChatTokens:
    """Renders prompts and the environment's additions with `tokenizer`'s chat template and `tools`' schemas; `stop_ids`
    end a model turn; `images`, a vision-language model's processor, expands a prompt's image tokens."""

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int], tools: Optional[List[Dict[str, Any]]] = None,
                 template_name: str = "the chat template", images: Optional[ImageProcessing] = None) -> None:
        self.tokenizer, self.stop_ids, self.tools, self.template_name = tokenizer, list(stop_ids), tools, template_name
        self.images = images
        self.closing = self._closing()

    def render(self, messages: List[Message], generation_prompt: bool, tools: Any = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools if tools is not None else self.tools,
                                                  add_generation_prompt=generation_prompt, tokenize=False)

    def encode(self, text: str) -> List[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: List[Message], tools: Any = None, pictures: Sequence[bytes] = ()) -> List[int]:
        """The prompt with the tools and the assistant header, as the template renders it; with `pictures` (the
        images of its `{"type": "image"}` parts, in order) each image token repeated as its image becomes."""
        ids = self.tokenizer.apply_chat_template(messages, tools=tools if tools is not None else self.tools,
                                                 add_generation_prompt=True, tokenize=True)
        if not pictures:
            return ids
        if self.images is None:
            raise CoatiUsageError("a prompt with images needs a vision-language model's processor")
        return self.images.expanded(ids, pictures)

    def after_turn(self, history: List[Message], stop_id: int, observation: List[Message],
                   tools: Any = None) -> List[int]:
        """The token ids after a model turn that ended with `stop_id`: the rest of the template's closing of the turn,
        the `observation` messages, and the next assistant header. `history` is the conversation before the turn."""
        before = self.render(history, True, tools)
        after = self.render(history + [{"role": "assistant", "content": PLACEHOLDER}] + observation, True, tools)
        if not after.startswith(before):
            raise CoatiUsageError(f"{self.template_name} rewrites earlier turns when a turn is appended, so the trained "
                                  "tokens would not be the sampled ones")
        rest = after[len(before):].split(PLACEHOLDER, 1)[1]
        stop_text = self.tokenizer.decode([stop_id])
        if not rest.startswith(stop_text):
            raise CoatiUsageError(f"{self.template_name} closes an assistant turn with {rest[:20]!r}, not with the stop "
                                  f"token {stop_text!r} the model ended it with")
        return self.encode(rest[len(stop_text):])

    def _closing(self) -> str:
        """The text the template puts right after an assistant turn's content."""
        probe = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": PLACEHOLDER}]
        text = self.render(probe, False)
        if PLACEHOLDER not in text:
            raise CoatiUsageError(f"{self.template_name} does not render assistant turns' content verbatim")
        return text.split(PLACEHOLDER, 1)[1]

    def turn_stop_id(self) -> int:
        """The stop token that closes a turn as the template does: one of `stop_ids` whose text starts its closing. A
        template that closes turns with a token generation does not stop at is refused in one line."""
        for stop in self.stop_ids:
            if self.closing.startswith(self.tokenizer.decode([stop])):
                return stop
        stops = ", ".join(repr(self.tokenizer.decode([s])) for s in self.stop_ids)
        raise CoatiUsageError(f"{self.template_name} closes an assistant turn with {self.closing[:20]!r}, but generation "
                              f"stops only at {stops}; add the turn's end token to the stop tokens")


def prompt_images(sample: Dict[str, Any]) -> Dict[str, Any]:
    """A prompt row's image inputs as a pool request takes them (`{"image_inputs": ...}`; {} for a text prompt). A
    row with images but no image inputs (not made by `PromptRows` with the model's processor) is refused: its image
    tokens would be read as text."""
    if sample.get(IMAGES) and not sample.get(IMAGE_INPUTS):
        raise ValueError("a prompt row with images reached a rollout without its image inputs; make prompt rows with "
                         "coati.dataset.collators.PromptRows(images=ImageProcessing.load(...))")
    return {IMAGE_INPUTS: sample[IMAGE_INPUTS]} if sample.get(IMAGE_INPUTS) else {}


def check_tools_rendered(chat: ChatTokens) -> None:
    """The template shows the model its tools: their names appear in the rendered prompt, else one line refuses it."""
    if not chat.tools:
        return
    text = chat.render([{"role": "user", "content": "1 + 1?"}], True)
    missing = [t["function"]["name"] for t in chat.tools if t["function"]["name"] not in text]
    if missing:
        raise CoatiUsageError(f"{chat.template_name} does not render tools (the prompt does not name {missing[0]!r}); "
                              "use a chat template with tool support")


def probe_conversation(tools: Optional[List[Dict[str, Any]]]) -> List[Message]:
    """A user question, a turn that reasons and calls the first tool, its answer, and a final answer."""
    name = tools[0]["function"]["name"] if tools else "calculator"
    argument = next(iter((tools[0]["function"]["parameters"].get("properties") or {"x": 0})), "x") if tools else "x"
    call = json.dumps({"name": name, "arguments": {argument: "12 * 34"}})
    return [{"role": "user", "content": "What is 12 * 34?"},
            {"role": "assistant", "content": f"<think>\nThe calculator is exact.\n</think>\n<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "name": name, "content": "408"},
            {"role": "assistant", "content": "12 * 34 = 408."}]


def turn_by_turn(chat: ChatTokens, conversation: List[Message]) -> Tuple[List[int], List[bool]]:
    """`conversation`'s token ids as a rollout builds them (each assistant turn's own tokens and the turn's stop
    token, then what `after_turn` adds), with a mask of the turns' own tokens."""
    stop = chat.turn_stop_id()
    first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
    ids = chat.prompt_ids(conversation[:first])
    mask = [False] * len(ids)
    index = first
    while index < len(conversation):
        turn = chat.encode(conversation[index]["content"]) + [stop]
        ids, mask = ids + turn, mask + [True] * len(turn)
        following = index + 1
        while following < len(conversation) and conversation[following]["role"] != "assistant":
            following += 1
        if following == len(conversation):
            break
        added = chat.after_turn(conversation[:index], stop, conversation[index + 1:following])
        ids, mask = ids + added, mask + [False] * len(added)
        index = following
    return ids, mask


def check_appending(chat: ChatTokens) -> None:
    """Start-up check: the probe conversation built turn by turn equals, token for token, the template's rendering of
    the whole conversation (up to the whitespace it puts after the last turn). Refuses in one line, naming the first
    differing token, a template for which it does not."""
    check_tools_rendered(chat)
    conversation = probe_conversation(chat.tools)
    built, _ = turn_by_turn(chat, conversation)
    whole = chat.tokenizer.apply_chat_template(conversation, tools=chat.tools, tokenize=True)
    tail = chat.tokenizer.decode(whole[len(built):]) if whole[:len(built)] == built else None
    if tail is not None and not tail.strip():
        return
    at = next((i for i, (a, b) in enumerate(zip(built, whole)) if a != b), min(len(built), len(whole)))
    token = lambda ids: repr(chat.tokenizer.decode(ids[at:at + 1])) if at < len(ids) else "the end"
    raise CoatiUsageError(f"{chat.template_name} does not render a conversation by appending turns: at token {at}, "
                          f"turn by turn gives {token(built)}, the whole conversation {token(whole)} (a template that "
                          "rewrites earlier turns, e.g. drops earlier reasoning, cannot train on the sampled tokens; "
                          "--chat_template FILE gives one that renders by appending)")
