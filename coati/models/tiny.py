"""A tiny tokenizer with a chat template and a tiny random `LlamaForCausalLM`, built locally for tests and the demo.

Both are written with `save_pretrained`, so every consumer loads them with the real
`AutoTokenizer.from_pretrained(path)` / `AutoModelForCausalLM.from_pretrained(path)` code path.
"""
from pathlib import Path
from typing import Dict, Iterable, Union

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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
                                   model_max_length=512)


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

