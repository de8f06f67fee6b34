"""Images in the data: TRL's image rows read and checked, and the processor that turns them into a vision-language
model's inputs.

A row's images come from its `images` column (TRL's; `image` for one) in the order of the `{"type": "image"}` parts of
its messages, or inline, from OpenAI's `{"type": "image_url", "image_url": {"url": ...}}` parts (a path or a `data:`
URL). An image is a path (a relative one is looked up beside the data file, then in the working directory), a `data:`
URL, a `datasets` image (decoded, or its `{"bytes", "path"}`), or bytes. Prepared rows keep each image's file bytes
(`IMAGES`) and their input ids hold the image token once per token the image becomes (`ImageProcessing.token_counts`),
so lengths, truncation and token budgets count what the model sees; the pixels are made per batch, by the same
processor with the same limits.
"""
import base64
import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from coati.utils.errors import CoatiUsageError, first_line

IMAGES = "images"
"""The column of a prepared row's images (file bytes), and TRL's column of a raw row's images."""
SINGLE_IMAGE = "image"
"""TRL's column of a raw row's one image."""
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
"""Files of a model folder that say how images become pixels and image tokens."""
LIMITS_INFO = "image_limits"
"""Key of a prepared folder's info that records the pixel limits its image token counts were made with."""


class ImageError(CoatiUsageError):
    """A raw row's image that cannot be used: one line naming the row and the field."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        super().__init__(f"{where}: field '{field}': {problem}")


def content_parts(content: List[Any], where: str, field: str) -> Any:
    """A message's list of content parts normalised: its text alone where it has no image; else text parts and
    `{"type": "image"}` parts, an inline image (OpenAI's `image_url`, HF's `{"type": "image", "image": ...}`) kept
    under `image` for `row_images`."""
    parts = []
    for i, part in enumerate(content):
        where_part = f"{field}[{i}]"
        if not isinstance(part, dict) or part.get("type") not in ("text", "image", "image_url"):
            raise ImageError(where, where_part, "expected a content part {\"type\": \"text\" | \"image\" | \"image_url\"}")
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise ImageError(where, f"{where_part}.text", "missing or not a string")
            parts.append({"type": "text", "text": part["text"]})
            continue
        inline = part.get("image_url", part.get("image", part.get("url")))
        if isinstance(inline, dict):
            inline = inline.get("url")
        if part["type"] == "image_url" and not isinstance(inline, str):
            raise ImageError(where, where_part, "an image_url part needs {\"image_url\": {\"url\": PATH or data: URL}}")
        parts.append({"type": "image", **({"image": inline} if inline is not None else {})})
    if not any(p["type"] == "image" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def content_text(content: Any) -> str:
    """The text of a message's content (a string, or its text parts)."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _image_parts(row: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The image parts of every conversation of a validated row, in the order the row's text renders them."""
    found = []
    for field in ("messages", "context", "chosen", "rejected", "completion"):
        for message in row.get(field) or ():
            if isinstance(message, dict) and isinstance(message.get("content"), list):
                found += [part for part in message["content"] if part["type"] == "image"]
    return found


def raw_images(raw: Any) -> List[Any]:
    """The images of a raw row's `images` (or `image`) column, as given."""
    if not isinstance(raw, dict):
        return []
    if raw.get(IMAGES) is not None:
        return list(raw[IMAGES]) if isinstance(raw[IMAGES], (list, tuple)) else [raw[IMAGES]]
    return [raw[SINGLE_IMAGE]] if raw.get(SINGLE_IMAGE) is not None else []


def row_images(row: Dict[str, Any], raw: Any, where: str, base: Optional[Path] = None) -> Dict[str, Any]:
    """`row` (validated) with its images read and checked, in the order its text shows them, under `IMAGES`; the
    inline sources taken out of its parts. Unchanged where the row has no image."""
    given, parts = raw_images(raw), _image_parts(row)
    row = {k: v for k, v in row.items() if k not in (IMAGES, SINGLE_IMAGE)}   # prompt rows carry other fields
    if not given and not parts:
        return row
    from_column = [part for part in parts if "image" not in part]
    if len(from_column) != len(given):
        raise ImageError(where, IMAGES, f"{len(given)} image{'s' * (len(given) != 1)} for {len(from_column)} "
                                        "{\"type\": \"image\"} placeholder" + "s" * (len(from_column) != 1) +
                         " in the messages (one placeholder per image, in order)")
    column = iter(enumerate(given))
    images = []
    for part in parts:
        if "image" in part:
            images.append(read_image(part.pop("image"), where, "image_url", base))
        else:
            index, source = next(column)
            images.append(read_image(source, where, f"{IMAGES}[{index}]", base))
    return {**row, IMAGES: images}


def read_image(source: Any, where: str, field: str, base: Optional[Path] = None) -> bytes:
    """The file bytes of one image (PNG, JPEG, ... as stored), checked to be an image PIL reads."""
    data = _image_bytes(source, where, field, base)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except (UnidentifiedImageError, OSError, ValueError) as error:
        named = f"{source} is " if isinstance(source, str) and not source.startswith("data:") else ""
        raise ImageError(where, field, f"{named}not an image PIL can read ({type(error).__name__})") from None
    return data


def _image_bytes(source: Any, where: str, field: str, base: Optional[Path]) -> bytes:
    from PIL import Image

    if isinstance(source, Image.Image):
        out = io.BytesIO()
        source.save(out, format="PNG")
        return out.getvalue()
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if isinstance(source, dict) and (source.get("bytes") or source.get("path")):
        return bytes(source["bytes"]) if source.get("bytes") else _file_bytes(source["path"], where, field, base)
    if not isinstance(source, str) or not source:
        raise ImageError(where, field, f"expected an image path, a data: URL or an image, got {source!r:.60}")
    if source.startswith("data:"):
        header, _, payload = source.partition(",")
        if not header.endswith(";base64"):
            raise ImageError(where, field, "a data: URL image must be base64 (data:image/png;base64,...)")
        try:
            return base64.b64decode(payload, validate=True)
        except ValueError:
            raise ImageError(where, field, "the data: URL's base64 payload is not valid base64") from None
    if source.startswith(("http://", "https://")):
        raise ImageError(where, field, f"{source:.80}: images are not downloaded; save it and give its path")
    return _file_bytes(source[len("file://"):] if source.startswith("file://") else source, where, field, base)


def _file_bytes(path: str, where: str, field: str, base: Optional[Path]) -> bytes:
    """A local image file's bytes; a relative path beside the data file first, then in the working directory."""
    candidates = [Path(path)] if Path(path).is_absolute() or base is None else [base / path, Path(path)]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        looked = [str(p) for p in dict.fromkeys(candidates)]
        tried = f" (looked for {' or '.join(looked)})" if looked != [path] else ""
        raise ImageError(where, field, f"image file not found: {path}{tried}")
    return found.read_bytes()


def decode_image(data: bytes) -> Any:
    """A prepared image's bytes as an RGB PIL image."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


@dataclass(frozen=True)
class ImageLimits:
    """Pixel limits an image processor resizes to (Qwen2-VL's `min_pixels`/`max_pixels`; 0: the processor's own)."""

    max_pixels: int = 0
    min_pixels: int = 0

    def as_info(self) -> Dict[str, int]:
        return {"max_pixels": self.max_pixels, "min_pixels": self.min_pixels}


class ImageProcessing:
    """A vision-language model folder's processor, its tokenizer the run's: how many image tokens each image becomes,
    and a batch's pixel inputs (`pixel_values`, and Qwen2-VL's `image_grid_thw`), both under the same limits."""

    def __init__(self, processor: Any, limits: ImageLimits = ImageLimits()) -> None:
        self.processor = processor
        self.limits = limits
        image_processor = processor.image_processor
        for name in ("max_pixels", "min_pixels"):
            value = getattr(limits, name)
            if not value:
                continue
            if not hasattr(image_processor, name):
                raise CoatiUsageError(f"--{name}: {type(image_processor).__name__} resizes every image to a fixed size "
                                      "and takes no pixel limits")
            setattr(image_processor, name, value)
            image_processor.size["longest_edge" if name == "max_pixels" else "shortest_edge"] = value
        token = getattr(processor, "image_token", None)
        self.image_token_id = processor.tokenizer.convert_tokens_to_ids(token) if token else None
        if self.image_token_id is None:
            raise CoatiUsageError(f"{type(processor).__name__} names no image token; coati reads Qwen2-VL, Qwen2.5-VL "
                                  "and LLaVA-style processors")

    @classmethod
    def load(cls, path: str, tokenizer: Any, limits: ImageLimits = ImageLimits(),
             trust_remote_code: bool = False) -> Optional["ImageProcessing"]:
        """The processor of the model folder `path` with `tokenizer` in it; None for a folder with no image
        processor (a text model)."""
        if not any((Path(path) / name).is_file() for name in PROCESSOR_FILES):
            return None
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code, use_fast=False)
        processor.tokenizer = tokenizer
        return cls(processor, limits)

    def token_counts(self, images: Sequence[bytes]) -> List[int]:
        """How many image tokens each image becomes."""
        token = self.processor.tokenizer.convert_ids_to_tokens(self.image_token_id)
        counts = []
        for data in images:
            image = decode_image(data)
            with self._resizing(image):
                ids = self.processor(text=[token], images=[image])["input_ids"][0]
            counts.append(sum(1 for i in ids if i == self.image_token_id))
        return counts

    def expanded(self, ids: List[int], images: Sequence[bytes]) -> List[int]:
        """Rendered `ids` with each image token repeated as many times as its image (of `images`, in order) becomes,
        as preparation expands a prompt's."""
        return ImageTokens(self.image_token_id, tuple(self.token_counts(images))).expand(ids, ids, -1)[0]

    def pixel_inputs(self, images: Sequence[bytes]) -> Dict[str, Any]:
        """The model's image inputs for `images` (a batch's, in order): {} for none."""
        if not images:
            return {}
        decoded = [decode_image(d) for d in images]
        with self._resizing(decoded[0]):
            return dict(self.processor.image_processor(images=decoded, return_tensors="pt"))

    @contextlib.contextmanager
    def _resizing(self, image: Any) -> Iterator[None]:
        """An image the processor cannot resize within its limits (Qwen2-VL's rounds a side to 0 below 28 pixels)
        is one line naming its size and the limits."""
        try:
            yield
        except ValueError as error:
            raise CoatiUsageError(f"{type(self.processor.image_processor).__name__} cannot resize a {image.width} x "
                                  f"{image.height} image within max_pixels {self.limits.max_pixels or 'default'}, "
                                  f"min_pixels {self.limits.min_pixels or 'default'} ({first_line(error)}); change "
                                  "--max_pixels or --min_pixels") from None



@dataclass(frozen=True)
class ImageTokens:
    """Where a row's images go in its token ids: the image token, and how many tokens each image becomes."""

    token_id: int
    counts: Tuple[int, ...]

    def expand(self, ids: List[int], labels: List[int], ignore: int) -> Tuple[List[int], List[int]]:
        """Each image token repeated as many times as its image has tokens; those tokens never labelled."""
        found = sum(1 for i in ids if i == self.token_id)
        if found != len(self.counts):
            raise CoatiUsageError(f"the chat template rendered {found} image tokens for {len(self.counts)} images")
        counts = iter(self.counts)
        out_ids, out_labels = [], []
        for token, label in zip(ids, labels):
            if token == self.token_id:
                n = next(counts)
                out_ids += [token] * n
                out_labels += [ignore] * n
            else:
                out_ids.append(token)
                out_labels.append(label)
        return out_ids, out_labels

    def spans(self, ids: Sequence[int]) -> List[Tuple[int, int]]:
        """(start, end) of each image's tokens in expanded `ids`, for as many images as `ids` hold tokens of."""
        positions = [i for i, token in enumerate(ids) if token == self.token_id]
        spans, taken = [], 0
        for count in self.counts:
            if taken >= len(positions):
                break
            run = positions[taken:taken + count]
            spans.append((run[0], run[-1] + 1))
            taken += count
        return spans

    def cut(self, ids: List[int], labels: List[int], max_length: int) -> Tuple[List[int], List[int], int]:
        """`ids` and `labels` cut from the right to at most `max_length` tokens, never inside an image's tokens
        (an image cut is cut whole), and how many images they still hold."""
        end = min(len(ids), max_length)
        spans = self.spans(ids)
        for start, stop in spans:
            if start < end < stop:
                end = start
        return ids[:end], labels[:end], sum(1 for _, stop in spans if stop <= end)


def prepared_limits(info: Dict[str, Any]) -> Optional[ImageLimits]:
    """The pixel limits a prepared folder's image tokens were counted with (None: no images)."""
    limits = info.get(LIMITS_INFO)
    return ImageLimits(**limits) if limits else None
