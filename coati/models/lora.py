"""LoRA through colossalai's `booster.enable_lora` (HF peft underneath): adapters on, and merged for export.

Only the adapters (and, for a reward model, its score head) train. Checkpoints keep the whole
adapted model, so a run resumes exactly; the export merges the adapters into the base weights so
that `from_pretrained` loads a plain model, and also writes the adapters alone in peft's format.
"""
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import Plugin
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

from coati.distributed.comm import barrier
from coati.utils.errors import CoatiUsageError


def _task_type(model: torch.nn.Module) -> str:
    """peft's task type: SEQ_CLS keeps a reward model's score head trainable and saved."""
    classifiers = set(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values())
    return "SEQ_CLS" if type(model).__name__ in classifiers else "CAUSAL_LM"


def enable_lora(booster: Booster, plugin: Plugin, plugin_name: str, model: torch.nn.Module, rank: int, alpha: float,
                dropout: float = 0.0, target_modules: Sequence[str] = ("all-linear",)) -> torch.nn.Module:
    """`model` with rank-`rank` adapters on `target_modules` and every other weight frozen; call before boosting."""
    if not plugin.support_lora():
        raise CoatiUsageError(f"--lora_rank: --plugin {plugin_name} does not support LoRA in colossalai; "
                              "use ddp, zero2, zero2_cpu or 3d")
    from peft import LoraConfig

    targets = "all-linear" if list(target_modules) == ["all-linear"] else list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                        task_type=_task_type(model))
    try:
        return booster.enable_lora(model, lora_config=config)
    except ValueError as error:
        raise CoatiUsageError(f"--lora_target_modules: {error}") from error


def peft_model_of(model: torch.nn.Module) -> Optional[Any]:
    """The peft model inside a boosted (or plain) model, or None when LoRA is off."""
    from peft import PeftModel

    inner = model.unwrap(unwrap_peft=False) if hasattr(model, "unwrap") else model
    return inner if isinstance(inner, PeftModel) else None


def export_adapter_and_merge(booster: Booster, model: torch.nn.Module, adapter_dir: Union[str, Path]) -> Optional[Path]:
    """Write the adapters alone (peft format) to `adapter_dir`, then fold them into the base weights in
    place, so the model saves as a plain HF model. Training is over after this; no-op without LoRA."""
    peft_model = peft_model_of(model)
    if peft_model is None:
        return None
    booster.save_lora_as_pretrained(model, str(adapter_dir), use_safetensors=True)
    barrier()
    peft_model.merge_and_unload()
    return Path(adapter_dir)
