"""`--plugin` and its flags -> a colossalai `Plugin` and `Booster`: the one place that knows the plugins."""
import argparse
from dataclasses import dataclass
from typing import Callable, Dict

import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin, Plugin, TorchDDPPlugin

from coati.distributed.launch import DEFAULT_TIMEOUT_S
from coati.utils.cli import at_least, non_negative, positive
from coati.utils.errors import CoatiUsageError, warn_user

PLUGIN_HELP = {
    "ddp": "torch DistributedDataParallel; CPU (gloo) or GPU",
    "zero2": "ZeRO stage 2 (optimizer states and gradients sharded); CUDA",
    "zero2_cpu": "ZeRO stage 2 with optimizer states offloaded to CPU memory; CUDA",
    "gemini": "Gemini chunk-based ZeRO-3, static placement on the GPU; CUDA",
    "gemini_auto": "Gemini with automatic CPU/GPU placement of parameters; CUDA",
    "3d": "HybridParallelPlugin: --tp/--pp/--sp with --zero_stage; CUDA",
}
PLUGINS = tuple(PLUGIN_HELP)
CUDA_ONLY = frozenset(PLUGINS) - {"ddp"}
SP_MODES = ("split_gather", "ring", "all_to_all", "ring_attn")
INITIAL_LOSS_SCALE = 2**16


def add_plugin_args(parser: argparse.ArgumentParser) -> None:
    """The flags every training script shares for choosing and tuning the plugin."""
    group = parser.add_argument_group("parallelism")
    group.add_argument("--plugin", default="ddp", choices=PLUGINS, help="; ".join(f"{k}: {v}" for k, v in PLUGIN_HELP.items()))
    group.add_argument("--mixed_precision", default="bf16", choices=("fp16", "bf16", "fp32"),
                       help="compute precision with fp32 master weights; ddp takes fp32 or bf16 (autocast); "
                            "a machine without CUDA trains in fp32")
    group.add_argument("--grad_clip", type=non_negative(), default=1.0, help="clip gradients to this global L2 norm; 0 disables")
    group.add_argument("--tp", type=at_least(1), default=1, help="3d: tensor-parallel size")
    group.add_argument("--pp", type=at_least(1), default=1, help="3d: pipeline-parallel size")
    group.add_argument("--sp", type=at_least(1), default=1, help="3d: sequence-parallel size")
    group.add_argument("--sp_mode", default=None, choices=SP_MODES, help="3d: sequence-parallel mode; enables sequence parallelism")
    group.add_argument("--zero_stage", type=int, default=0, choices=(0, 1, 2), help="3d: ZeRO stage over the data-parallel group")
    group.add_argument("--zero_cpu_offload", action="store_true", help="3d: offload ZeRO optimizer states to CPU")
    group.add_argument("--microbatch_size", type=at_least(1), default=1, help="3d with --pp > 1: pipeline micro-batch size")
    group.add_argument("--dist_timeout", type=positive(), default=DEFAULT_TIMEOUT_S,
                       help="seconds a collective waits for a peer before the run stops with an error (a dead or "
                            "unreachable node); raise it when rank 0 alone writes very large checkpoints")


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
        """`booster.boost`, after giving a ddp model its bf16 autocast; returns (model, optimizer, lr_scheduler, dataloader)."""
        if self.trainer_clips_grad and self.precision == "bf16":
            _autocast_forward(model, torch.bfloat16)
        model, optimizer, _, dataloader, lr_scheduler = self.booster.boost(
            model, optimizer, lr_scheduler=lr_scheduler, dataloader=dataloader
        )
        return model, optimizer, lr_scheduler, dataloader


def _autocast_forward(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Run `model.forward` under CUDA autocast; parameters and optimizer states stay fp32.

    Done on the module itself, inside DDP, so `booster.no_sync` and checkpoints see the plain model.
    """
    model.forward = torch.autocast(device_type="cuda", dtype=dtype)(model.forward)


def check_plugin_available(name: str) -> None:
    """Refuse a CUDA-only plugin on a machine without CUDA, naming the alternative."""
    if name not in PLUGIN_HELP:
        raise CoatiUsageError(f"unknown --plugin {name!r}; choose one of {', '.join(PLUGINS)}")
    if name in CUDA_ONLY and not torch.cuda.is_available():
        raise CoatiUsageError(
            f"--plugin {name} needs CUDA GPUs and this machine has none; use --plugin ddp to train on the CPU"
        )


def resolve_precision(requested: str) -> str:
    """The precision that will really be used: fp32 when there is no GPU to run half precision on."""
    if requested != "fp32" and not torch.cuda.is_available():
        warn_user(f"--mixed_precision {requested} needs CUDA; training in fp32 on this machine")
        return "fp32"
    return requested


def _ddp(args: argparse.Namespace, precision: str) -> Plugin:
    return TorchDDPPlugin(find_unused_parameters=getattr(args, "find_unused_parameters", False))


def _zero2(args: argparse.Namespace, precision: str, cpu_offload: bool = False) -> Plugin:
    return LowLevelZeroPlugin(stage=2, precision=precision, initial_scale=INITIAL_LOSS_SCALE,
                              max_norm=args.grad_clip, cpu_offload=cpu_offload)


def _gemini(args: argparse.Namespace, precision: str, placement_policy: str = "static") -> Plugin:
    return GeminiPlugin(precision=precision, placement_policy=placement_policy, initial_scale=INITIAL_LOSS_SCALE,
                        max_norm=args.grad_clip, enable_gradient_accumulation=True)


def _hybrid(args: argparse.Namespace, precision: str) -> Plugin:
    sp_enabled = args.sp_mode is not None
    return HybridParallelPlugin(
        tp_size=args.tp,
        pp_size=args.pp,
        sp_size=args.sp if sp_enabled else None,
        enable_sequence_parallelism=sp_enabled,
        sequence_parallelism_mode=args.sp_mode,
        zero_stage=args.zero_stage,
        cpu_offload=args.zero_stage >= 1 and args.zero_cpu_offload,
        precision=precision,
        max_norm=args.grad_clip,
        initial_scale=INITIAL_LOSS_SCALE,
        microbatch_size=args.microbatch_size if args.pp > 1 else None,
        parallel_output=False,
    )


_FACTORIES: Dict[str, Callable[[argparse.Namespace, str], Plugin]] = {
    "ddp": _ddp,
    "zero2": _zero2,
    "zero2_cpu": lambda args, precision: _zero2(args, precision, cpu_offload=True),
    "gemini": _gemini,
    "gemini_auto": lambda args, precision: _gemini(args, precision, placement_policy="auto"),
    "3d": _hybrid,
}


def _check_args(args: argparse.Namespace) -> None:
    if args.plugin != "3d" and (args.tp, args.pp, args.sp, args.zero_stage) != (1, 1, 1, 0):
        raise CoatiUsageError(f"--tp/--pp/--sp/--zero_stage apply to --plugin 3d only, not --plugin {args.plugin}")
    if args.plugin == "ddp" and args.mixed_precision == "fp16" and torch.cuda.is_available():
        raise CoatiUsageError("--plugin ddp trains in fp32 or bf16; pass --mixed_precision bf16, or use --plugin zero2 for fp16")
    if args.plugin.startswith("gemini") and args.mixed_precision == "fp32":
        raise CoatiUsageError(f"--plugin {args.plugin} trains in fp16 or bf16 only; pass --mixed_precision bf16")
    if args.plugin == "3d" and args.sp > 1 and args.sp_mode is None:
        raise CoatiUsageError("--sp > 1 needs --sp_mode (one of " + ", ".join(SP_MODES) + ")")


def build_booster(args: argparse.Namespace) -> BoostSetup:
    """Build the plugin named by `args.plugin` and its `Booster`; call after the process group exists."""
    check_plugin_available(args.plugin)
    _check_args(args)
    precision = resolve_precision(args.mixed_precision)
    plugin = _FACTORIES[args.plugin](args, precision)
    return BoostSetup(plugin, Booster(plugin=plugin), precision, trainer_clips_gradients(plugin), args.grad_clip)


def trainer_clips_gradients(plugin: Plugin) -> bool:
    """True for plugins that leave gradient clipping to the training loop (ddp); the others clip in `step`."""
    return isinstance(plugin, TorchDDPPlugin)
