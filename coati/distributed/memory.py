"""The memory a run needs, estimated before anything loads from the model folders (their config and the
safetensors headers), the plugin and the micro-batch; a run whose model states (and runtime) cannot fit is refused in
one line with the estimate, and one whose activations may not is warned about (`check_run_memory`).

Model states per process, for P parameters of which T train (all of them, or LoRA's adapters), D data-parallel
processes and h bytes per half-precision value (4 where training is in fp32):
- ddp: fp32 weights 4P (and, with bf16 autocast, its bf16 copies 2P), gradients 4T, DDP's gradient buckets 4T, Adam 8T;
- zero2: working weights hP, gradients hT/D, fp32 master weights 4T/D and Adam 8T/D; zero2_cpu keeps the master
  weights, fp32 gradients 4T/D and Adam in CPU memory;
- gemini (static placement): hP/D + hT/D + 12T/D on the GPU; gemini_auto may place any of it in CPU memory;
- 3d: ddp's layout over tensor x pipeline shards (tp·pp), the master weights and Adam sharded over D too with
  --zero_stage (in CPU memory with --zero_cpu_offload).
Frozen models (the reference, a reward model, a teacher) take h bytes a parameter, and each process its runtime
(`RUNTIME_BYTES`). Activations are those a decoder layer keeps for backward: 7H + 3K + 4I values a token (H hidden,
K key-value and I MLP width), and in half precision the norms' fp32 copies, 8H bytes; the layer's input alone under
--grad_checkpoint, plus one layer recomputed. The logits of the micro-batch and their gradient take 2·h bytes a token
and vocabulary entry. How close this comes to measured runs is in docs/guides/plugins.md."""
from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from coati.config import PREPARE_MAX_LENGTH, LoraSettings, PluginConfig
from coati.utils.errors import CoatiUsageError, warn_user
from coati.utils.file_checks import CONFIG_FILE, read_json, weight_shapes

GIB = 2**30
STATE_PARTS = ("weights", "gradients", "gradient buckets", "optimizer states", "frozen models", "runtime")
"""What a process holds whatever its micro-batch: a run whose parts these cannot fit is refused."""
ACTIVATION_PARTS = ("activations", "logits")
RUNTIME_BYTES = 0.75 * GIB
"""A process's own memory besides the model's: its libraries in CPU memory (a tiny model's SFT run peaks at 0.83 GiB
RSS on a CPU), or its CUDA context and kernels on a GPU."""
PAIRED_COMMANDS = ("dpo", "orpo")
"""Trainers whose rows are a chosen and a rejected sequence, both in each forward."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of one model folder: its parameters, those the run's LoRA settings would train, and the
    widths its activations scale with."""

    params: int
    lora_params: int
    hidden: int
    layers: int
    intermediate: int
    kv_width: int
    vocab: int

    def trainable(self, lora_rank: int) -> int:
        return self.lora_params if lora_rank else self.params


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes each process needs, by part: on its GPU (`device`; on a machine without one, in CPU memory) and in CPU
    memory besides (`host`, what a plugin offloads), for a micro-batch of `tokens` tokens, which `batch_flag` sets."""

    device: Dict[str, float]
    host: Dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    batch_flag: str = "--batch_size"


# ---- the model -------------------------------------------------------------------------------------------------------
def model_shape(folder: str, config: Dict[str, Any], lora: LoraSettings) -> Optional[ModelShape]:
    """The shape of the model in `folder` (its config dict `config`): parameters from its safetensors headers, else
    from a dense decoder's config fields; None where neither says."""
    widths = _widths(config)
    if widths is None:
        return None
    shapes = weight_shapes(Path(folder))
    if shapes is None:
        shapes = _decoder_shapes(config, *widths)
    params = sum(math.prod(shape) for shape in shapes.values())
    hidden, layers, intermediate, kv_width, vocab = widths
    return ModelShape(params, _lora_params(shapes, lora), hidden, layers, intermediate, kv_width, vocab)


def head_dim(config: Dict[str, Any]) -> int:
    """The attention head size of a decoder config (its `text_config` for a multimodal one)."""
    config = config.get("text_config") or config
    return int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))


def _widths(config: Dict[str, Any]) -> Optional[Tuple[int, int, int, int, int]]:
    """hidden, layers, MLP width, key-value width and vocabulary of a decoder config (its `text_config` for a
    multimodal one); None where a field is missing."""
    config = config.get("text_config") or config
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        kv_width = int(config.get("num_key_value_heads") or heads) * head_dim(config)
        layers, intermediate = int(config["num_hidden_layers"]), int(config["intermediate_size"])
        return hidden, layers, intermediate, kv_width, int(config["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None


def _decoder_shapes(config: Dict[str, Any], hidden: int, layers: int, intermediate: int, kv_width: int,
                    vocab: int) -> Dict[str, List[int]]:
    """The weight shapes of a Llama-style decoder of these widths (for weights that are not safetensors)."""
    config = config.get("text_config") or config
    q_width = head_dim(config) * int(config["num_attention_heads"])
    shapes: Dict[str, List[int]] = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = [vocab, hidden]
    for i in range(layers):
        layer = f"model.layers.{i}."
        matrices = {"self_attn.q_proj": [q_width, hidden], "self_attn.k_proj": [kv_width, hidden],
                    "self_attn.v_proj": [kv_width, hidden], "self_attn.o_proj": [hidden, q_width],
                    "mlp.gate_proj": [intermediate, hidden], "mlp.up_proj": [intermediate, hidden],
                    "mlp.down_proj": [hidden, intermediate], "input_layernorm": [hidden],
                    "post_attention_layernorm": [hidden]}
        shapes.update({f"{layer}{name}.weight": shape for name, shape in matrices.items()})
    return shapes


def _lora_params(shapes: Dict[str, List[int]], lora: LoraSettings) -> int:
    """Parameters of rank-`lora_rank` adapters on the linear layers `lora_target_modules` names ('all-linear': every
    matrix but the embeddings and the output head, as peft takes it); 0 without LoRA."""
    rank = lora.lora_rank
    targets = set(lora.lora_target_modules)
    total = 0
    for name, shape in shapes.items():
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        if module is None or len(shape) != 2:
            continue
        last = module.rsplit(".", 1)[-1]
        if ("all-linear" in targets and not re.search(r"embed|lm_head|wte|wpe", module)) or last in targets:
            total += rank * (shape[0] + shape[1])
    return total


# ---- the estimate ----------------------------------------------------------------------------------------------------
def state_bytes(params: int, trainable: int, parallel: PluginConfig, half: int, world_size: int
                ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """(on the GPU, in CPU memory) bytes of one process's weights, gradients and optimizer states of a model of
    `params` parameters, `trainable` of them trained with Adam, on `parallel`'s plugin over `world_size` processes;
    `half` is the bytes of the training precision's values (4: fp32)."""
    plugin, shards = parallel.plugin, max(world_size, 1)
    if plugin == "ddp":
        weights = 4 * params + (2 * params if half == 2 else 0)
        return {"weights": weights, "gradients": 4 * trainable, "gradient buckets": 4 * trainable,
                "optimizer states": 8 * trainable}, {}
    if plugin in ("zero2", "zero2_cpu"):
        device = {"weights": half * params, "gradients": half * trainable / shards}
        master = {"weights": 4 * trainable / shards, "optimizer states": 8 * trainable / shards}
        if plugin == "zero2":
            return _merged(device, master), {}
        return device, _merged(master, {"gradients": 4 * trainable / shards})
    if plugin in ("gemini", "gemini_auto"):
        return {"weights": (half * params + 4 * trainable) / shards, "gradients": half * trainable / shards,
                "optimizer states": 8 * trainable / shards}, {}
    model_shards = parallel.tp * parallel.pp
    data_shards = max(shards // model_shards, 1) if parallel.zero_stage else 1
    device = {"weights": half * params / model_shards, "gradients": half * trainable / model_shards}
    master = {"weights": 4 * trainable / model_shards / data_shards,
              "optimizer states": 8 * trainable / model_shards / data_shards}
    if parallel.zero_stage and parallel.zero_cpu_offload:
        return device, master
    return _merged(device, master), {}


def _merged(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
    return {part: a.get(part, 0.0) + b.get(part, 0.0) for part in dict.fromkeys([*a, *b])}


def activation_bytes(shape: ModelShape, tokens: int, grad_checkpoint: bool, half: int, model_shards: int = 1
                     ) -> Dict[str, float]:
    """Bytes of what one micro-batch of `tokens` tokens keeps for backward: each layer's activations (only its input
    under `grad_checkpoint`, plus one layer recomputed), and the logits with their gradient."""
    per_layer = (7 * shape.hidden + 3 * shape.kv_width + 4 * shape.intermediate) * half
    if half == 2:
        per_layer += 8 * shape.hidden
    if grad_checkpoint:
        per_token = shape.layers * shape.hidden * half + per_layer
    else:
        per_token = shape.layers * per_layer
    return {"activations": tokens * per_token / model_shards, "logits": tokens * shape.vocab * 2 * half / model_shards}


def micro_batch_tokens(run: Any, longest: int = 0) -> int:
    """Tokens of one learning micro-batch on each rank: supervised, `--batch_size` rows of `--max_length` tokens (or of
    the data's `longest` sequence where shorter; or `--max_tokens_per_batch` packed; two sequences a row for DPO and
    ORPO); on-policy, `--train_batch_size` completions (else the collect step's batch x `--num_generations`) of such
    a prompt plus `--max_new_tokens`."""
    known = [n for n in (run.data.max_length, longest) if n]
    length = min(known) if known else PREPARE_MAX_LENGTH
    rollout = getattr(run, "rollout", None)
    if rollout is None:
        batching = run.batching
        if batching.packing and batching.max_tokens_per_batch:
            return batching.max_tokens_per_batch
        return run.optim.batch_size * length * (2 if run.command in PAIRED_COMMANDS else 1)
    rows = run.algorithm.train_batch_size or run.optim.batch_size * rollout.num_generations
    return rows * (length + rollout.sampling.max_new_tokens)


def held_models(run: Any) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(trained, frozen): the model folders the run holds in memory, by the flag naming each."""
    trained = {"--pretrain": run.model.pretrain}
    frozen: Dict[str, str] = {}
    reference = getattr(run, "reference", None)
    kl = getattr(run, "kl", None)
    if reference is not None and not reference.precompute_ref_logps and (kl is None or kl.kl_coef > 0):
        frozen["--ref_pretrain"] = reference.ref_pretrain or run.model.pretrain
    if getattr(run, "reward", None) is not None and run.reward.rm_pretrain:
        frozen["--rm_pretrain"] = run.reward.rm_pretrain
    if getattr(run, "process_reward", None) is not None and run.process_reward.prm_pretrain:
        frozen["--prm_pretrain"] = run.process_reward.prm_pretrain
    if getattr(run, "distillation", None) is not None and run.distillation.teacher_model:
        frozen["--teacher_model"] = run.distillation.teacher_model
    if run.command == "ppo":
        trained["--critic_pretrain"] = run.critic.critic_pretrain or run.reward.rm_pretrain or run.model.pretrain
    return trained, frozen


def estimate_run(run: Any, shapes: Dict[str, ModelShape], half: int, world_size: int, longest: int = 0
                 ) -> MemoryEstimate:
    """The estimate for `run` (a run config) whose model folders have `shapes` (by folder), training at `half` bytes a
    value over `world_size` processes, on data whose longest sequence has `longest` tokens (0: unknown)."""
    trained, frozen = held_models(run)
    device: Dict[str, float] = {}
    host: Dict[str, float] = {}
    for folder in trained.values():
        shape = shapes[folder]
        on_device, offloaded = state_bytes(shape.params, shape.trainable(run.lora.lora_rank), run.parallel, half,
                                           world_size)
        device, host = _merged(device, on_device), _merged(host, offloaded)
    device["frozen models"] = sum(half * shapes[folder].params for folder in frozen.values())
    device["runtime"] = RUNTIME_BYTES
    tokens = micro_batch_tokens(run, longest)
    model_shards = run.parallel.tp * run.parallel.sp if run.parallel.plugin == "3d" else 1
    device.update(activation_bytes(shapes[run.model.pretrain], tokens, run.model.grad_checkpoint, half, model_shards))
    return MemoryEstimate(device, host, tokens, _batch_flag(run))


def _batch_flag(run: Any) -> str:
    """The flag that sizes `run`'s learning micro-batch."""
    if getattr(run, "rollout", None) is not None:
        return "--train_batch_size"
    return "--max_tokens_per_batch" if run.batching.packing and run.batching.max_tokens_per_batch else "--batch_size"


def training_bytes(parallel: PluginConfig) -> int:
    """Bytes of a value in the training precision: 2 in half precision on CUDA, 4 in fp32 (a machine without CUDA
    trains in fp32)."""
    import torch

    return 2 if parallel.mixed_precision != "fp32" and torch.cuda.is_available() else 4


def check_run_memory(run: Any, longest: int = 0, launch: Optional[Tuple[int, int]] = None) -> None:
    """`run`'s estimate (on data whose longest sequence has `longest` tokens) against the free memory
    (`check_memory`), before anything loads: this process's, from torchrun's environment; or, given `launch` (the
    world size and the processes on this node), before `coati --nproc_per_node N` starts them. Skipped where a model's
    shape cannot be read from its folder (no estimate beats a wrong one), and with `--no_memory_check`."""
    if not run.parallel.memory_check:
        return
    trained, frozen = held_models(run)
    shapes = {}
    for flag, folder in {**trained, **frozen}.items():
        shape = model_shape(folder, read_json(Path(folder) / CONFIG_FILE, f"the model config of {flag}"), run.lora)
        if shape is None:
            return
        shapes[folder] = shape
    world, local = launch or (int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    capacity = free_capacity(local, before_launch=launch is not None)
    if capacity is not None:
        estimate = estimate_run(run, shapes, training_bytes(run.parallel), world, longest)
        check_memory(estimate, capacity, run.parallel, run.lora.lora_rank)


# ---- the check -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Capacity:
    """What one process may use: its GPU's free bytes (None without CUDA) and its share of the node's available CPU
    memory (the node's `host` bytes over its `processes`)."""

    device: Optional[float]
    host: float
    processes: int

    @property
    def host_share(self) -> float:
        return self.host / max(self.processes, 1)


def free_capacity(processes: int, before_launch: bool = False) -> Optional[Capacity]:
    """The `Capacity` of each of the node's `processes`: the node's available CPU memory shared by them, and the free
    memory of this process's GPU (`LOCAL_RANK`'s), or before a launch the least free on the GPUs the processes will
    take, read with `nvidia-smi` so that the launcher makes no CUDA context (None where it cannot be read then)."""
    import psutil
    import torch

    device = None
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = _least_free_gpu(processes) if before_launch else float(torch.cuda.mem_get_info(local_rank)[0])
        if device is None:
            return None
    return Capacity(device, float(psutil.virtual_memory().available), processes)


def _least_free_gpu(count: int) -> Optional[float]:
    """Bytes free on the fullest of the first `count` GPUs this process sees (`CUDA_VISIBLE_DEVICES`, by index or
    UUID, else all), from `nvidia-smi` (None without it)."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [[field.strip() for field in line.split(",")] for line in listed.stdout.splitlines() if line.count(",") == 2]
    free = {key: float(row[2]) for row in rows if row[2].replace(".", "", 1).isdigit() for key in row[:2]}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    keys = [key.strip() for key in visible.split(",")] if visible else [row[0] for row in rows]
    used = [free[key] for key in keys[:max(count, 1)] if key in free]
    return min(used) * 2**20 if listed.returncode == 0 and used else None


def check_memory(estimate: MemoryEstimate, capacity: Capacity, parallel: PluginConfig, lora_rank: int) -> None:
    """Refuse a run whose model states and runtime cannot fit where the plugin puts them; warn about one whose
    activations at this micro-batch may not."""
    both = _merged(estimate.device, estimate.host)
    if capacity.device is None:
        room = _share(capacity)
        _refuse_if(both, capacity.host_share, room, parallel, lora_rank, on_gpu=False)
        _warn_if(both, capacity.host_share, room, estimate)
    elif parallel.plugin == "gemini_auto":
        _refuse_if(both, capacity.device + capacity.host_share,
                   f"{_gib(capacity.device)} free on its GPU and {_share(capacity)} together", parallel, lora_rank)
    else:
        _refuse_if(estimate.device, capacity.device, f"{_gib(capacity.device)} free on its GPU", parallel, lora_rank)
        _refuse_if(estimate.host, capacity.host_share,
                   f"{_share(capacity)} for what --plugin {parallel.plugin} offloads", parallel, lora_rank)
        _warn_if(estimate.device, capacity.device, f"{_gib(capacity.device)} free on its GPU", estimate)


def _states(parts: Dict[str, float]) -> float:
    return sum(parts.get(part, 0.0) for part in STATE_PARTS)


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _listed(parts: Dict[str, float], names: Iterable[str]) -> str:
    """'weights 13.5, gradients 13.5, ...' in GiB."""
    return ", ".join(f"{name} {parts[name] / GIB:.1f}" for name in names if parts.get(name))


def _share(capacity: Capacity) -> str:
    """This process's CPU memory, in words."""
    available = f"{_gib(capacity.host)} of CPU memory available"
    if capacity.processes > 1:
        return f"{_gib(capacity.host_share)}, its share of the {available} to {capacity.processes} processes"
    return f"the {available}"


def _refuse_if(parts: Dict[str, float], room: float, where: str, parallel: PluginConfig, lora_rank: int,
               on_gpu: bool = True) -> None:
    if _states(parts) > room:
        raise CoatiUsageError(f"this run cannot fit: before any activation it needs about {_gib(_states(parts))} per "
                              f"process ({_listed(parts, STATE_PARTS)} GiB, estimated for --plugin {parallel.plugin} "
                              f"before loading) and each process has {where}; "
                              f"{_advice(parts, room, parallel, lora_rank, on_gpu)}; or --no_memory_check to start "
                              "anyway")


def _warn_if(parts: Dict[str, float], room: float, where: str, estimate: MemoryEstimate) -> None:
    total = sum(parts.values())
    if total > room:
        listed = _listed(parts, STATE_PARTS + ACTIVATION_PARTS)
        warn_user(f"this run may not fit: about {_gib(total)} per process ({listed} GiB; activations for "
                  f"{estimate.tokens} tokens a micro-batch) and each process has {where}; --grad_checkpoint, a smaller "
                  f"{estimate.batch_flag} or --max_length lower the activations")


def _advice(parts: Dict[str, float], room: float, parallel: PluginConfig, lora_rank: int, on_gpu: bool) -> str:
    """What would make the states fit: where the weights alone (trained and frozen) do not, only sharding them over
    GPUs does; else fewer trained parameters (LoRA), optimizer states in CPU memory, or more GPUs."""
    prefix = "" if on_gpu else "this machine's memory cannot hold it: "
    weights = sum(parts.get(part, 0.0) for part in ("weights", "frozen models", "runtime"))
    if weights > room:
        return (f"{prefix}the weights alone need {_gib(weights)}; shard them over GPUs (--plugin gemini or "
                "gemini_auto, or --plugin 3d --tp N)")
    ways = [] if lora_rank else ["train LoRA adapters only (--lora_rank 16)"]
    if parallel.plugin in ("ddp", "zero2", "gemini", "3d"):
        ways.append("on GPUs, --plugin zero2_cpu (optimizer states in CPU memory) or gemini_auto (parameters too)")
    ways.append("more GPUs (zero2 and gemini shard the states over them)")
    return prefix + "; or ".join(ways)
