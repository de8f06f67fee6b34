"""LoRA through colossalai's `booster.enable_lora` (HF peft underneath): adapters on, and merged for export.

Only the adapters (and, for a reward model, its score or value head) train. Checkpoints keep the whole
adapted model, so a run resumes exactly; the export merges the adapters into the base weights so
that `from_pretrained` loads a plain model, and also writes the adapters alone in peft's format.
ColossalChat's LoRA names (`LoraConfig`, `LoraLinear`, `LoraEmbedding`, `convert_to_lora_module`) are here
too, as peft layers.
"""
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
import coati.utils.lean_import  # noqa: F401  (before colossalai.booster: no compile-worker processes)
from colossalai.booster import Booster
from colossalai.booster.plugin import Plugin
from peft.tuners.lora import Embedding as PeftEmbedding
from peft.tuners.lora import LoraLayer
from peft.tuners.lora import Linear as PeftLinear
from torch import nn
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

from coati.utils.comm import barrier
from coati.config import LORA_INIT, LoraConfig
from coati.utils.errors import CoatiUsageError, warn_user

__all__ = ["LoraConfig", "LoraEmbedding", "LoraLinear", "convert_to_lora_module", "enable_lora",
           "export_adapter_and_merge", "merged_weights", "peft_model_of", "active_adapter"]


def _task_settings(model: torch.nn.Module) -> Dict[str, Any]:
    """peft's task type and the heads that train and save beside the adapters: SEQ_CLS keeps a reward model's score
    head; a one-output head in place of an LM head (a vision-language reward model's) is named to keep."""
    if type(model).__name__ in set(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values()):
        return {"task_type": "SEQ_CLS"}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Linear) and head.out_features == 1:
        return {"task_type": "CAUSAL_LM", "modules_to_save": [name for name, module in model.named_modules()
                                                              if module is head]}
    return {"task_type": "CAUSAL_LM"}


def enable_lora(booster: Booster, plugin: Plugin, plugin_name: str, model: torch.nn.Module, rank: int, alpha: float,
                dropout: float = 0.0, target_modules: Union[str, Sequence[str]] = ("all-linear",), bias: str = "none",
                init: str = "kaiming_uniform") -> torch.nn.Module:
    """`model` with rank-`rank` adapters on `target_modules` (names, or one pattern peft matches whole) and every other weight frozen (but the biases `bias`
    names: peft's none, all or lora_only), started as `init` says (kaiming_uniform or pissa); call before
    boosting."""
    if not plugin.support_lora():
        raise CoatiUsageError(f"--lora_rank: --plugin {plugin_name} does not support LoRA in colossalai; "
                              "use ddp, zero2, zero2_cpu or 3d")
    from peft import LoraConfig as PeftLoraConfig

    targets = target_modules if isinstance(target_modules, str) else (
        "all-linear" if list(target_modules) == ["all-linear"] else list(target_modules))
    config = PeftLoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias=bias,
                            init_lora_weights=_peft_init(init), **_task_settings(model))
    try:
        return booster.enable_lora(model, lora_config=config)
    except ValueError as error:
        raise CoatiUsageError(f"--lora_target_modules: {error}") from error


def _peft_init(init: str) -> Union[bool, str]:
    """peft's `init_lora_weights`: True is its kaiming-uniform A and zero B."""
    return True if init == "kaiming_uniform" else init


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
    written = not _started_with_pissa(peft_model)
    if written:
        booster.save_lora_as_pretrained(model, str(adapter_dir), use_safetensors=True)
    else:
        warn_user("--lora_init pissa: the adapters alone are not exported (they apply to the weights PiSSA left "
                  "in the base model, not to the base model itself); the merged model is")
    barrier()
    peft_model.merge_and_unload()
    return Path(adapter_dir) if written else None


@torch.no_grad()
def merged_weights(model: nn.Module, state_dict: Optional[Dict[str, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
    """`model`'s weights (`state_dict`, by default its own: pass the gathered one where parameters are sharded) under
    the base model's names with its active adapters folded in (W + scale·BA): what an engine that knows nothing of
    LoRA serves. Computed out of place, so training goes on with the adapters apart (merging in place and back would
    drift the base weights by rounding at every publish). Without LoRA: the state dict."""
    weights = {}
    for name, tensor in (model.state_dict() if state_dict is None else state_dict).items():
        if ".lora_" not in name:
            weights[name.replace(".base_layer.", ".")] = tensor
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and not module.merged and not module.disable_adapters:
            for adapter in module.active_adapters:
                if adapter in module.lora_A or adapter in module.lora_embedding_A:
                    key = f"{name}.weight"
                    weights[key] = weights[key] + module.get_delta_weight(adapter).to(weights[key].dtype)
    return weights


def active_adapter(model: torch.nn.Module) -> Optional[Tuple[Dict[str, torch.Tensor], Dict[str, Any]]]:
    """The active adapter of `model` (boosted or plain) as peft saves it: its tensors under peft's names and its config
    as a dict, which is what vLLM loads; None without LoRA."""
    from peft import get_peft_model_state_dict

    peft_model = peft_model_of(model)
    if peft_model is None:
        return None
    name = peft_model.active_adapter
    tensors = {key: tensor.detach() for key, tensor in get_peft_model_state_dict(peft_model, adapter_name=name).items()}
    return tensors, peft_model.peft_config[name].to_dict()


def _started_with_pissa(peft_model: Any) -> bool:
    return any(str(config.init_lora_weights).startswith("pissa") for config in peft_model.peft_config.values())


class LoraLinear(PeftLinear):
    """ColossalChat's `LoraLinear(weight, bias, r, ...)`: a linear layer over `weight` (and `bias`: a parameter,
    True for a new zero one, None for none) with a peft LoRA adapter; the weight is frozen, the adapter trains."""

    def __init__(self, weight: nn.Parameter, bias: Union[nn.Parameter, bool, None], r: int = 0, lora_alpha: int = 32,
                 lora_dropout: float = 0.0, lora_initialization_method: str = "kaiming_uniform") -> None:
        base = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None and bias is not False)
        base.weight = weight
        if isinstance(bias, nn.Parameter):
            base.bias = bias
        elif base.bias is not None:
            nn.init.zeros_(base.bias)
        super().__init__(base, "default", r=_rank(r), lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                         init_lora_weights=_peft_init(LORA_INIT[lora_initialization_method]))
        weight.requires_grad = False


class LoraEmbedding(PeftEmbedding):
    """ColossalChat's `LoraEmbedding(weight, r, ...)`: an embedding over `weight` with a peft LoRA adapter (A zero,
    B normal, for PiSSA too, as in ColossalChat; no dropout); the weight is frozen."""

    def __init__(self, weight: nn.Parameter, r: int = 0, lora_alpha: int = 32, lora_dropout: float = 0.1,
                 num_embeddings: Optional[int] = None, embedding_dim: Optional[int] = None,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = False,
                 lora_initialization_method: str = "kaiming_uniform") -> None:
        LORA_INIT[lora_initialization_method]   # a name ColossalChat does not know fails here, as there
        base = nn.Embedding(num_embeddings or weight.shape[0], embedding_dim or weight.shape[1], padding_idx=padding_idx,
                            max_norm=max_norm, norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)
        base.weight = weight
        super().__init__(base, "default", r=_rank(r), lora_alpha=lora_alpha, lora_dropout=lora_dropout)
        weight.requires_grad = False


def _rank(r: int) -> int:
    if r <= 0:
        raise ValueError(f"LoRA rank r={r}: a LoRA layer needs r >= 1 (r=0 means no adapter: keep the plain layer)")
    return r


def convert_to_lora_module(module: nn.Module, lora_config: LoraConfig) -> nn.Module:
    """ColossalChat's `convert_to_lora_module`: peft adapters, in place, on `module`'s linear and embedding layers
    whose name is in `lora_config.target_modules` (all of them when None); every other weight is frozen, biases
    too unless `lora_train_bias` says otherwise. r=0 leaves `module` as it is."""
    if lora_config.r <= 0:
        return module
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    wanted = lora_config.target_modules
    targets = [name for name, child in module.named_modules() if isinstance(child, (nn.Linear, nn.Embedding))
               and (wanted is None or name.rsplit(".", 1)[-1] in wanted)]
    if not targets:
        raise ValueError(f"convert_to_lora_module: no linear or embedding layer is named {wanted}")
    config = PeftLoraConfig(r=lora_config.r, lora_alpha=lora_config.lora_alpha,
                            lora_dropout=lora_config.linear_lora_dropout, bias=lora_config.peft_bias,
                            init_lora_weights=_peft_init(lora_config.peft_init), target_modules=targets)
    return inject_adapter_in_model(config, module)
