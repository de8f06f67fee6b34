"""Vision-language models as coati trains them: loaded with their auto class, parts frozen as the flags say, and
LoRA kept to the language model.

Qwen2-VL and Qwen2.5-VL hold their vision encoder in `visual` (its `merger` the projector); LLaVA-style models in
`vision_tower`, with a `multi_modal_projector`.
"""
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from coati.utils.modules import inner_model

VISION_TOWERS = ("visual", "vision_tower", "vision_model")
PROJECTORS = ("multi_modal_projector", "visual.merger", "mm_projector")
VISION_KEYS = ("pixel_values", "image_grid_thw")
"""A batch's image inputs, passed to the model's forward as they are."""


def is_vision_model(path: Union[str, Path]) -> bool:
    """Whether the model folder `path` holds a vision-language model (its config has a `vision_config`)."""
    config = Path(path) / "config.json"
    return config.is_file() and "vision_config" in json.loads(config.read_text())


def auto_model_class(path: Union[str, Path]) -> Any:
    """The transformers auto class that loads `path` with its LM head: image-text-to-text for a vision-language
    model, causal LM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM


def _prefixed(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def freeze_vision_parts(model: nn.Module, vision_tower: bool, projector: bool) -> int:
    """Freeze the vision encoder (its projector apart) and/or the projector; returns how many weights were frozen."""
    frozen = 0
    for name, param in model.named_parameters():
        in_projector = _prefixed(name, PROJECTORS)
        if (projector and in_projector) or (vision_tower and _prefixed(name, VISION_TOWERS) and not in_projector):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def freeze_unused_vision_layers(model: nn.Module) -> int:
    """Freeze what a LLaVA-style model's vision tower computes but never reads: the encoder layers after
    `vision_feature_layer` (LLaVA-1.5 reads the second to last) and the final norm (and head) of its pooled output.
    They receive no gradient, which DDP would refuse; returns how many weights were frozen."""
    layer = getattr(model.config, "vision_feature_layer", None)
    tower = getattr(getattr(model, "vision_tower", None), "vision_model", None)
    layers = getattr(getattr(tower, "encoder", None), "layers", None)
    if layer is None or layers is None:
        return 0
    read = max(layer) if isinstance(layer, (list, tuple)) else layer
    used = read % (len(layers) + 1)   # hidden state k is the output of layer k - 1 (0: the embeddings)
    unused = [*layers[used:], *(getattr(tower, name) for name in ("post_layernorm", "head") if hasattr(tower, name))]
    frozen = 0
    for module in unused:
        for param in module.parameters():
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def language_model_lora_targets(model: nn.Module, targets: Sequence[str]) -> str:
    """peft's `target_modules` for LoRA on the language model only: a pattern matching the linear layers named in
    `targets` (every linear layer but the LM head for 'all-linear') outside the vision encoder and projector."""
    if list(targets) == ["all-linear"]:
        output = model.get_output_embeddings()
        names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                 if isinstance(module, nn.Linear) and module is not output
                 and not _prefixed(name, VISION_TOWERS + PROJECTORS)}
    else:
        names = set(targets)
    outside = "|".join(re.escape(p) for p in VISION_TOWERS + PROJECTORS)
    return rf"^(?!(?:{outside})\.).*\.(?:{'|'.join(sorted(map(re.escape, names)))})$"


PLACEHOLDER_KEYS = ("image_token_id", "image_token_index", "video_token_id", "vision_start_token_id",
                    "vision_end_token_id")
"""Config keys of the token ids that stand for an image's (or video's) features, and of Qwen2-VL's markers around them
(its `get_rope_index` reads the token after each `vision_start` as an image's: a completion ending in one fails)."""


def placeholder_token_ids(model: nn.Module) -> List[int]:
    """The token ids that a vision-language model reads as image (or video) features or their markers: generation
    never samples them, since a completion holding one would no longer match its images. [] for a text model."""
    config = getattr(model, "config", None)
    return [value for key in PLACEHOLDER_KEYS if isinstance(value := getattr(config, key, None), int)]


def joined_image_inputs(rows: Sequence[Dict[str, torch.Tensor]], device: Optional[torch.device] = None
                        ) -> Dict[str, torch.Tensor]:
    """The image inputs of several rows (each row's `ImageProcessing.pixel_inputs`) as one forward takes them, in row
    order, on `device`: {} where no row has an image."""
    keys = [key for key in VISION_KEYS if any(key in row for row in rows)]
    return {key: torch.cat([row[key] for row in rows if key in row]).to(device) for key in keys}


def rope_positions(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   images: Optional[Dict[str, torch.Tensor]]) -> Optional[torch.Tensor]:
    """Qwen2-VL's 3-D rotary positions (3, batch, length) of left-padded rows with images, as the model computes them
    for itself (`get_rope_index`), so that generation, which passes positions, and training agree; None for a model
    without them (its positions are the text's)."""
    inner = inner_model(model)
    if not images or not hasattr(inner, "get_rope_index"):
        return None
    positions, _ = inner.get_rope_index(input_ids, images.get("image_grid_thw"), None, None, attention_mask)
    return positions


def image_inputs(batch: dict, repeat: int = 1) -> dict:
    """A batch's image inputs, for a forward over its rows `repeat` times over (chosen then rejected: twice)."""
    return {key: torch.cat([batch[key]] * repeat) if repeat > 1 else batch[key] for key in VISION_KEYS if key in batch}
