from .loss import DPOLoss, KTOLoss, LogExpLoss, LogSigLoss, ORPOLoss, PolicyLoss, SimPOLoss, ValueLoss
from .tiny import CHAT_TEMPLATE, END_OF_TURN, MODEL_SIZES, build_tiny_llama, train_tokenizer, write_tiny_model

LAZY = {"RewardModel": ".reward_model", "RLVRRewardModel": ".reward_model", "Critic": ".critic", "LoraConfig": ".lora",
        "convert_to_lora_module": ".lora", "disable_dropout": ".utils", "generate_streaming": ".generation",
        "lora_manager": "coati.compat.lora", "DpoLoss": "coati.compat.losses",
        "OddsRatioLoss": "coati.compat.losses"}
"""ColossalChat's names, imported on first use (from a module of this package, or of `coati.compat` for what only
ColossalChat's scripts use): LoRA's pulls in colossalai's booster and peft, which a plain `import coati.models`
should not pay for."""


def __getattr__(name: str):
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(LAZY[name], __name__), name)


__all__ = [*LAZY, "DPOLoss", "KTOLoss", "LogExpLoss", "LogSigLoss", "ORPOLoss", "PolicyLoss",
           "SimPOLoss", "ValueLoss", "CHAT_TEMPLATE", "END_OF_TURN", "MODEL_SIZES",
           "build_tiny_llama", "train_tokenizer", "write_tiny_model"]
