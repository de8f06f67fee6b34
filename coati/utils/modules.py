"""The HF model inside the wrappers a run puts around it (colossalai's booster, peft), without importing either."""
import torch


def inner_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model inside a boosted one, and inside its peft wrapper when LoRA is on."""
    inner = model.unwrap(unwrap_peft=False) if hasattr(model, "unwrap") else model
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner
