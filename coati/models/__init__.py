from .loss import (DPOLoss, DpoLoss, KTOLoss, LogExpLoss, LogSigLoss, OddsRatioLoss, ORPOLoss, PolicyLoss, SimPOLoss,
                   ValueLoss)
from .tiny import CHAT_TEMPLATE, END_OF_TURN, MODEL_SIZES, build_tiny_llama, train_tokenizer, write_tiny_model

__all__ = ["DPOLoss", "DpoLoss", "KTOLoss", "LogExpLoss", "LogSigLoss", "OddsRatioLoss", "ORPOLoss", "PolicyLoss",
           "SimPOLoss", "ValueLoss", "CHAT_TEMPLATE", "END_OF_TURN", "MODEL_SIZES",
           "build_tiny_llama", "train_tokenizer", "write_tiny_model"]
