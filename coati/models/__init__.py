from .loss import KTOLoss, LogExpLoss, LogSigLoss, ValueLoss
from .tiny import CHAT_TEMPLATE, END_OF_TURN, MODEL_SIZES, build_tiny_llama, train_tokenizer, write_tiny_model

__all__ = ["KTOLoss", "LogExpLoss", "LogSigLoss", "ValueLoss", "CHAT_TEMPLATE", "END_OF_TURN", "MODEL_SIZES",
           "build_tiny_llama", "train_tokenizer", "write_tiny_model"]
