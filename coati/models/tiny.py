"""A tiny tokenizer with a chat template and a tiny random `LlamaForCausalLM`, built locally for tests and the demo.

Both are written with `save_pretrained`, so every consumer loads them with the real
`AutoTokenizer.from_pretrained(path)` / `AutoModelForCausalLM.from_pretrained(path)` code path.
"""
from pathlib import Path
from typing import Dict, Iterable, Union

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from coati.config import TINY_VISION_STYLES

END_OF_TURN = "<|im_end|>"
SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", END_OF_TURN, "<|unk|>"]
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools: write <tool_call>{\"name\": ..., \"arguments\": {...}}"
    "</tool_call> and end your turn; the answer comes back in a tool turn.\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_MULTIPLE = 64
MODEL_MAX_LENGTH = 2048
"""The tokenizers' stated context, the trainers' default --max_length: a prompt with the tools' schemas is 544 tokens
with this vocabulary. The models' rotary positions have no table, so they read beyond `max_position_embeddings`."""
MODEL_SIZES: Dict[str, Dict[str, int]] = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "small": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
    "base": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4),
    "100m": dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=14, num_attention_heads=12,
                 num_key_value_heads=4),
}


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on `corpus`, digits split one per token, ChatML template, EOS = end of turn."""
    tokenizer = Tokenizer(models.BPE(unk_token="<|unk|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TURN, pad_token="<|pad|>",
                                   unk_token="<|unk|>", chat_template=CHAT_TEMPLATE, padding_side="right",
                                   model_max_length=MODEL_MAX_LENGTH, model_input_names=["input_ids", "attention_mask"])


def build_tiny_llama(tokenizer: PreTrainedTokenizerFast, size: str = "tiny", seed: int = 0,
                     max_position_embeddings: int = 512) -> LlamaForCausalLM:
    """A randomly initialised Llama sized by `MODEL_SIZES[size]`, its vocabulary covering `tokenizer`.

    The embedding rows are rounded up to a multiple of 64, as real checkpoints do, so tensor-parallel
    sharding needs no padded vocabulary."""
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(MODEL_SIZES)}")
    vocab_size = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    config = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=False, **MODEL_SIZES[size])
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model


def write_tiny_model(out_dir: Union[str, Path], corpus: Iterable[str], size: str = "tiny", seed: int = 0,
                     vocab_size: int = 384) -> Path:
    """Train the tokenizer (`vocab_size` tokens at most) on `corpus`, build the model, and save both into `out_dir`."""
    out = Path(out_dir)
    tokenizer = train_tokenizer(corpus, vocab_size)
    model = build_tiny_llama(tokenizer, size=size, seed=seed)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out



IMAGE_MARKUP = {"qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>", "llava": "<image>"}
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<image>"]
IMAGE_SIDE = 56
"""LLaVA's square input side, and the Qwen2.5-VL processor's default pixel limit's side (56 x 112 at most)."""


def vision_chat_template(style: str) -> str:
    """The tiny chat template with content parts: text as it is, each image part as the style's image markup."""
    content = ("{% if message['content'] is string %}{{ message['content'] }}{% else %}"
               "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + IMAGE_MARKUP[style] +
               "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}")
    return CHAT_TEMPLATE.replace("{{ message['content'] }}", content)


def mrope_sections(head_dim: int) -> list:
    """Qwen2-VL's split of a head's rotary frequencies between time, height and width (1/4, 3/8, 3/8 of them)."""
    half = head_dim // 2
    time = half // 4
    return [time, (half - time) // 2, half - time - (half - time) // 2]


def write_tiny_vl_model(out_dir: Union[str, Path], corpus: Iterable[str], style: str = "qwen2_5_vl", seed: int = 0,
                        vocab_size: int = 384, size: str = "tiny") -> Path:
    """A small random vision-language model of `style` with its processor (a slow image processor: no torchvision),
    its language model sized by `MODEL_SIZES[size]` and its vision tower half as wide, saved into `out_dir` so that
    `AutoModelForImageTextToText` and `AutoProcessor` load them: a Qwen2.5-VL (14-pixel patches merged 2 x 2, images of
    28 x 28 to 56 x 112 pixels) or a LLaVA (a CLIP tower on 56 x 56 images, a Llama)."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2_5_VLProcessor, Qwen2TokenizerFast, Qwen2VLImageProcessor)

    if style not in TINY_VISION_STYLES:
        raise ValueError(f"unknown vision style {style!r}; choose one of {', '.join(TINY_VISION_STYLES)}")
    text = train_tokenizer(corpus, vocab_size)
    tokenizer = Qwen2TokenizerFast(tokenizer_object=text.backend_tokenizer, eos_token=END_OF_TURN, pad_token="<|pad|>",
                                   unk_token="<|unk|>", chat_template=vision_chat_template(style), padding_side="right",
                                   model_max_length=MODEL_MAX_LENGTH, model_input_names=["input_ids", "attention_mask"])
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    padded_vocab = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    text_config = dict(vocab_size=padded_vocab, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=False,
                       **MODEL_SIZES[size])
    hidden = MODEL_SIZES[size]["hidden_size"]
    vision = dict(hidden_size=hidden // 2, intermediate_size=hidden, num_heads=2)
    torch.manual_seed(seed)
    if style == "qwen2_5_vl":
        config = Qwen2_5_VLConfig(
            **text_config,
            rope_scaling={"type": "mrope", "mrope_section": mrope_sections(hidden // MODEL_SIZES[size]["num_attention_heads"])},
            vision_config=dict(depth=2, out_hidden_size=hidden, patch_size=14, spatial_merge_size=2,
                               temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1], **vision),
            image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
        model = Qwen2_5_VLForConditionalGeneration(config)
        processor = Qwen2_5_VLProcessor(Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=IMAGE_SIDE * 2 * IMAGE_SIDE),
                                        tokenizer, chat_template=tokenizer.chat_template)
    else:
        config = LlavaConfig(
            vision_config=CLIPVisionConfig(hidden_size=vision["hidden_size"], intermediate_size=vision["intermediate_size"],
                                           num_hidden_layers=2, num_attention_heads=vision["num_heads"],
                                           image_size=IMAGE_SIDE, patch_size=14, projection_dim=vision["hidden_size"]),
            text_config=LlamaConfig(**text_config), image_token_index=ids["<image>"], vision_feature_layer=-1,
            vision_feature_select_strategy="default", pad_token_id=tokenizer.pad_token_id)
        model = LlavaForConditionalGeneration(config)
        image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIDE},
                                             crop_size={"height": IMAGE_SIDE, "width": IMAGE_SIDE})
        processor = LlavaProcessor(image_processor, tokenizer, patch_size=14, vision_feature_select_strategy="default",
                                   image_token="<image>", num_additional_image_tokens=1,
                                   chat_template=tokenizer.chat_template)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return out
