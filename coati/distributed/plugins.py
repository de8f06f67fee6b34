"""`PluginConfig` (`--plugin` and its flags) -> a colossalai `Plugin` and `Booster`: the one place that knows the
plugins. torch and colossalai are imported where a plugin is built."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional

if TYPE_CHECKING:
    import torch
    from colossalai.booster import Booster
    from colossalai.booster.plugin import Plugin
    from colossalai.shardformer.policies.base_policy import Policy

from coati.config import PLUGIN_HELP, PLUGINS, SP_MODES, PluginConfig
from coati.utils.errors import CoatiUsageError, warn_user

CUDA_ONLY = frozenset(PLUGINS) - {"ddp"}
INITIAL_LOSS_SCALE = 2**16


@dataclass
class BoostSetup:
    """What the factory made: the plugin, its booster, the precision really used, and gradient clipping.

    `trainer_clips_grad` is True where the plugin does not clip by itself (ddp): the trainer then
    clips to `grad_clip` before each optimizer step.
    """

    plugin: Plugin
    booster: Booster
    precision: str
    trainer_clips_grad: bool
    grad_clip: float

    def boost(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler=None, dataloader=None):
        """`booster.boost`, after giving a ddp model its bf16 autocast (and a 3d model the shardformer policy that fits
        it); returns (model, optimizer, lr_scheduler, dataloader)."""
        import torch
        from colossalai.booster.plugin import HybridParallelPlugin

        if self.trainer_clips_grad and self.precision == "bf16":
            _autocast_forward(model, torch.bfloat16)
        if isinstance(self.plugin, HybridParallelPlugin):
            self.plugin.custom_policy = shard_policy(model)
        model, optimizer, _, dataloader, lr_scheduler = self.booster.boost(
            model, optimizer, lr_scheduler=lr_scheduler, dataloader=dataloader
        )
        return model, optimizer, lr_scheduler, dataloader


def _autocast_forward(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Run `model.forward` under CUDA autocast; parameters and optimizer states stay fp32.

    Done on the module itself, inside DDP, so `booster.no_sync` and checkpoints see the plain model.
    """
    import torch

    model.forward = torch.autocast(device_type="cuda", dtype=dtype)(model.forward)


def shard_policy(model: torch.nn.Module) -> Optional[Policy]:
    """None where shardformer has a policy for `model`'s class; else its backbone's (`model.base_model`), for a head
    shardformer does not know, such as PPO's `*ForTokenClassification` critic: the head then stays whole on each
    rank, reading the backbone's gathered hidden states."""
    from colossalai.shardformer.policies.auto_policy import get_autopolicy

    try:
        get_autopolicy(model)
        return None
    except NotImplementedError:
        return get_autopolicy(model.base_model)


def check_first_forward(plugin: str, no_grad_forward: Optional[str]) -> None:
    """Refuse gemini_auto for a trainer whose first forward runs without gradients (`no_grad_forward` names it):
    Gemini's automatic placement traces memory over a first iteration that must begin with a training forward."""
    if plugin == "gemini_auto" and no_grad_forward:
        raise CoatiUsageError(f"--plugin gemini_auto traces memory over a first iteration that must begin with a training "
                              f"forward, and this trainer runs {no_grad_forward} first; use --plugin gemini (static "
                              "placement), or zero2_cpu to keep optimizer states on the CPU")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_plugin_available(name: str) -> None:
    """Refuse a CUDA-only plugin on a machine without CUDA, naming the alternative."""
    if name not in PLUGIN_HELP:
        raise CoatiUsageError(f"unknown --plugin {name!r}; choose one of {', '.join(PLUGINS)}")
    if name in CUDA_ONLY and not _cuda_available():
        raise CoatiUsageError(
            f"--plugin {name} needs CUDA GPUs and this machine has none; use --plugin ddp to train on the CPU"
        )


def resolve_precision(requested: str) -> str:
    """The precision that will really be used: fp32 when there is no GPU to run half precision on."""
    if requested != "fp32" and not _cuda_available():
        warn_user(f"--mixed_precision {requested} needs CUDA; training in fp32 on this machine")
        return "fp32"
    return requested


def _ddp(config: PluginConfig, precision: str) -> Plugin:
    from colossalai.booster.plugin import TorchDDPPlugin

    return TorchDDPPlugin(find_unused_parameters=config.find_unused_parameters)


def _zero2(config: PluginConfig, precision: str, cpu_offload: bool = False) -> Plugin:
    from colossalai.booster.plugin import LowLevelZeroPlugin

    return LowLevelZeroPlugin(stage=2, precision=precision, initial_scale=INITIAL_LOSS_SCALE,
                              max_norm=config.grad_clip, cpu_offload=cpu_offload)


def _gemini(config: PluginConfig, precision: str, placement_policy: str = "static") -> Plugin:
    from colossalai.booster.plugin import GeminiPlugin

    return GeminiPlugin(precision=precision, placement_policy=placement_policy, initial_scale=INITIAL_LOSS_SCALE,
                        max_norm=config.grad_clip, enable_gradient_accumulation=True)


def _hybrid(config: PluginConfig, precision: str) -> Plugin:
    from colossalai.booster.plugin import HybridParallelPlugin

    sp_enabled = config.sp_mode is not None
    return HybridParallelPlugin(
        tp_size=config.tp,
        pp_size=config.pp,
        sp_size=config.sp if sp_enabled else None,
        enable_sequence_parallelism=sp_enabled,
        sequence_parallelism_mode=config.sp_mode,
        zero_stage=config.zero_stage,
        cpu_offload=config.zero_stage >= 1 and config.zero_cpu_offload,
        precision=precision,
        max_norm=config.grad_clip,
        initial_scale=INITIAL_LOSS_SCALE,
        microbatch_size=config.microbatch_size if config.pp > 1 else None,
        parallel_output=False,
    )


_FACTORIES: Dict[str, Callable[[PluginConfig, str], Plugin]] = {
    "ddp": _ddp,
    "zero2": _zero2,
    "zero2_cpu": lambda config, precision: _zero2(config, precision, cpu_offload=True),
    "gemini": _gemini,
    "gemini_auto": lambda config, precision: _gemini(config, precision, placement_policy="auto"),
    "3d": _hybrid,
}


def _check_config(config: PluginConfig) -> None:
    if config.plugin != "3d" and (config.tp, config.pp, config.sp, config.zero_stage) != (1, 1, 1, 0):
        raise CoatiUsageError(f"--tp/--pp/--sp/--zero_stage apply to --plugin 3d only, not --plugin {config.plugin}")
    if config.plugin == "ddp" and config.mixed_precision == "fp16" and _cuda_available():
        raise CoatiUsageError("--plugin ddp trains in fp32 or bf16; pass --mixed_precision bf16, or use --plugin zero2 for fp16")
    if config.plugin.startswith("gemini") and config.mixed_precision == "fp32":
        raise CoatiUsageError(f"--plugin {config.plugin} trains in fp16 or bf16 only; pass --mixed_precision bf16")
    if config.plugin == "3d" and config.sp > 1 and config.sp_mode is None:
        raise CoatiUsageError("--sp > 1 needs --sp_mode (one of " + ", ".join(SP_MODES) + ")")


def build_booster(config: PluginConfig) -> BoostSetup:
    """Build the plugin `config` names and its `Booster`; call after the process group exists."""
    from colossalai.booster import Booster

    check_plugin_available(config.plugin)
    _check_config(config)
    allow_tf32(config.tf32)
    precision = resolve_precision(config.mixed_precision)
    plugin = _FACTORIES[config.plugin](config, precision)
    return BoostSetup(plugin, Booster(plugin=plugin), precision, trainer_clips_gradients(plugin), config.grad_clip)


def allow_tf32(allowed: bool) -> None:
    """`--tf32`: CUDA's fp32 matrix products and convolutions in TF32; without it, torch's own setting stays."""
    if allowed:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def trainer_clips_gradients(plugin: Plugin) -> bool:
    """True for plugins that leave gradient clipping to the training loop (ddp); the others clip in `step`."""
    from colossalai.booster.plugin import TorchDDPPlugin

    return isinstance(plugin, TorchDDPPlugin)
