from .tiny import CHAT_TEMPLATE, END_OF_TURN, MODEL_SIZES, build_tiny_llama, train_tokenizer, write_tiny_model

__all__ = ["CHAT_TEMPLATE", "END_OF_TURN", "MODEL_SIZES", "build_tiny_llama", "train_tokenizer", "write_tiny_model"]
