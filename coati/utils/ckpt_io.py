"""Checkpoints through the booster, marked complete only after every rank finished writing.

Layout of `save_dir/epoch-{e}_step-{s}/`::

    modeling/                 model shards written by the booster (safetensors unless embeddings are tied)
    optimizer/ | optimizer.bin  optimizer states (sharded on GPU; one file on CPU, where colossalai
                                cannot load sharded optimizer states)
    lr_scheduler.pt           scheduler state
    running_states.json       epoch, optimizer step, samples seen, world size, the model's shape-deciding
                              config fields (master only)
    rng_state_rank{r}.pt      every rank's torch/CUDA/numpy/python RNG states
    <name>/                   the same modeling/optimizer/lr_scheduler files for each further model
                              (PPO's critic), when `extra_models` names one
    COMPLETE                  written last, after a barrier: without it the checkpoint is ignored

Weights that are not finite are never written (`NonFiniteWeightsError`). Loading first checks that every
file is intact and that the checkpoint was written for a model of the same shape (`verify_checkpoint`).
"""
import copy
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import coati.utils.lean_import  # noqa: F401  (before colossalai.booster: no compile-worker processes)
from colossalai.booster import Booster
from colossalai.checkpoint_io.utils import gather_distributed_param
from colossalai.cluster import DistCoordinator
from colossalai.tensor.d_tensor import is_customized_distributed_tensor, is_distributed_tensor
from colossalai.tensor.padded_tensor import is_padded_tensor, to_unpadded_tensor
from colossalai.zero import GeminiDDP

from coati.utils.comm import barrier, is_distributed, rank, world_size
from coati.utils.modules import inner_model
from coati.utils.errors import CoatiUsageError
from coati.utils.metrics_logger import set_aside
from coati.utils.file_checks import (CorruptFileError, check_weight_file, check_weights_dir, model_signature,
                                     read_json, signature_mismatch)

COMPLETE_MARKER = "COMPLETE"
RUNNING_STATE_FILE = "running_states.json"
_NAME = re.compile(r"^epoch-(\d+)_step-(\d+)$")
PathLike = Union[str, os.PathLike]
ModelState = Tuple[Booster, torch.nn.Module, Optional[torch.optim.Optimizer], Optional[Any]]
"""(booster, model, optimizer, lr_scheduler) of one trained model."""


def checkpoint_name(epoch: int, step: int) -> str:
    return f"epoch-{epoch}_step-{step}"


def is_complete(path: PathLike) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def list_checkpoints(save_dir: PathLike, complete_only: bool = True) -> List[Path]:
    """Checkpoint directories under `save_dir`, oldest first (by optimizer step, then epoch)."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir() and (is_complete(child) or not complete_only):
            found.append((int(match.group(2)), int(match.group(1)), child))
    return [path for _, _, path in sorted(found)]


def latest_checkpoint(save_dir: PathLike) -> Optional[Path]:
    """The newest complete checkpoint under `save_dir`, or None."""
    checkpoints = list_checkpoints(save_dir)
    return checkpoints[-1] if checkpoints else None


def set_aside_checkpoints(save_dir: PathLike) -> Optional[Path]:
    """Move an earlier run's checkpoints (complete or not) out of `save_dir`, into `previous_runs/<time>/` as the
    metrics logger does with its logs, so that a fresh run's checkpoints do not mix with them and a later
    `latest` resumes this run's; returns where they went."""
    return set_aside(list_checkpoints(save_dir, complete_only=False), Path(save_dir))


def _rng_states() -> Dict[str, Any]:
    np_state = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _set_rng_states(states: Dict[str, Any]) -> None:
    python_state = states["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _write_json_atomic(path: Path, data: Dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _shard_optimizer() -> bool:
    return torch.cuda.is_available()


def whole_state_dict(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """`inner_model(model)`'s state dict with every parameter whole, on every rank: what an engine of its own loads.
    Gemini's chunks and tensor-parallel shards (vocabulary padding removed) are gathered, a collective that every
    rank must call; the other plugins' ranks hold whole parameters already and gather nothing."""
    if isinstance(model, GeminiDDP):
        return {_unprefixed(name): tensor for name, tensor in model.state_dict(only_rank_0=False).items()}
    weights = {}
    for name, tensor in inner_model(model).state_dict(keep_vars=True).items():
        whole = gather_distributed_param(tensor)
        weights[name] = to_unpadded_tensor(whole) if is_padded_tensor(whole) else whole
    return weights


def _unprefixed(name: str) -> str:
    return name[len("module."):] if name.startswith("module.") else name


def holds_whole_parameters(model: torch.nn.Module) -> bool:
    """Whether this rank's modules hold every parameter whole, so the unwrapped model can run a forward on its own
    (not under Gemini, nor with tensor parallelism)."""
    if isinstance(model, GeminiDDP):
        return False
    return not any(is_distributed_tensor(p) or is_customized_distributed_tensor(p) for p in model.parameters())


class NonFiniteWeightsError(CoatiUsageError):
    """A model about to be saved holds NaN or infinite weights; nothing is written."""


def check_finite_weights(model: torch.nn.Module, where: PathLike) -> None:
    """Refuse (on every rank alike) to write `model` to `where` when any rank's weights are not finite."""
    bad = next((name for name, p in model.named_parameters() if p.numel() and not torch.isfinite(p.data).all()), None)
    flag = torch.tensor([0.0 if bad is None else 1.0], device=next(model.parameters()).device)
    if is_distributed():
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    if flag.item():
        detail = f" (first: {bad})" if bad else " (on another rank)"
        raise NonFiniteWeightsError(f"the model has NaN or infinite weights{detail}; nothing was written to {where}")


def model_shape(model: torch.nn.Module) -> Dict[str, Any]:
    """The shape-deciding config fields of a (boosted, peft-wrapped) model; empty without a config."""
    config = getattr(inner_model(model), "config", None)
    return model_signature(config.to_dict()) if config is not None else {}


def _use_safetensors(model: torch.nn.Module) -> bool:
    """Safetensors, except for tied input/output embeddings, which colossalai's sharded safetensors
    writer rejects as shared memory; those models are written as torch shards instead."""
    config = getattr(inner_model(model), "config", None)
    return not getattr(config, "tie_word_embeddings", False)


def save_checkpoint(
    save_dir: PathLike,
    booster: Booster,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer],
    lr_scheduler: Optional[Any],
    epoch: int,
    step: int,
    batch_size: int,
    coordinator: DistCoordinator,
    sample_start_index: Optional[int] = None,
    keep_last: int = 0,
    extra_state: Optional[Dict[str, Any]] = None,
    extra_models: Optional[Dict[str, ModelState]] = None,
) -> Path:
    """Write a checkpoint on every rank (a collective) and return its directory once it is complete.

    `epoch` is the epoch to resume in and `step` the number of optimizer steps taken so far.
    `sample_start_index` is how many samples of `epoch` this rank has consumed (default
    `step * batch_size`, ColossalChat's convention). `keep_last` > 0 deletes older complete
    checkpoints, and any incomplete ones older than the new one, after the new one is complete.
    `extra_models` are further (booster, model, optimizer, scheduler) sets, each in a folder of its name.
    """
    path = Path(save_dir) / checkpoint_name(epoch, step)
    for state in [(booster, model, optimizer, lr_scheduler), *(extra_models or {}).values()]:
        check_finite_weights(state[1], path)
    if coordinator.is_master():
        shutil.rmtree(path, ignore_errors=True)   # what an interrupted write left here (temporary shards)
        path.mkdir(parents=True)
    barrier()
    _save_model_state(path, (booster, model, optimizer, lr_scheduler))
    for name, state in (extra_models or {}).items():
        _save_model_state(path / name, state)
    torch.save(_rng_states(), path / f"rng_state_rank{rank()}.pt")
    if coordinator.is_master():
        samples = step * batch_size if sample_start_index is None else sample_start_index
        state = {
            "epoch": epoch,
            "step": step,
            "sample_start_index": samples,
            "global_samples_in_epoch": samples * world_size(),
            "batch_size": batch_size,
            "world_size": world_size(),
            "model": model_shape(model),
            **(extra_state or {}),
        }
        _write_json_atomic(path / RUNNING_STATE_FILE, state)
    os.sync()
    barrier()
    if coordinator.is_master():
        _write_json_atomic(path / COMPLETE_MARKER, {"epoch": epoch, "step": step})
        _prune(Path(save_dir), keep_last, newest=path)
    barrier()
    return path


def _save_model_state(path: Path, state: ModelState) -> None:
    booster, model, optimizer, lr_scheduler = state
    booster.save_model(model, str(path / "modeling"), shard=True, use_safetensors=_use_safetensors(model))
    if optimizer is not None:
        shard = _shard_optimizer()
        booster.save_optimizer(optimizer, str(path / ("optimizer" if shard else "optimizer.bin")), shard=shard)
    if lr_scheduler is not None:
        booster.save_lr_scheduler(lr_scheduler, str(path / "lr_scheduler.pt"))


def _load_model_state(path: Path, state: ModelState) -> None:
    booster, model, optimizer, lr_scheduler = state
    booster.load_model(model, str(path / "modeling"))
    if optimizer is not None:
        sharded = path / "optimizer"
        booster.load_optimizer(optimizer, str(sharded if sharded.exists() else path / "optimizer.bin"))
    if lr_scheduler is not None and (path / "lr_scheduler.pt").exists():
        booster.load_lr_scheduler(lr_scheduler, str(path / "lr_scheduler.pt"))


def _prune(save_dir: Path, keep_last: int, newest: Path) -> None:
    """Older checkpoints beyond `keep_last` (0: none), and every incomplete one older than `newest`:
    an interrupted write can never be resumed from, and its files (shards, temporary files) only take space."""
    doomed = list_checkpoints(save_dir)[:-keep_last] if keep_last > 0 else []
    doomed += [p for p in list_checkpoints(save_dir, complete_only=False)
               if not is_complete(p) and _step_of(p) < _step_of(newest)]
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)


def _step_of(path: Path) -> Tuple[int, int]:
    match = _NAME.match(path.name)
    return int(match.group(2)), int(match.group(1))


def read_running_state(load_dir: PathLike) -> Dict[str, Any]:
    """The running state of a complete checkpoint; a clear error for a missing or incomplete one."""
    path = Path(load_dir)
    if not path.is_dir():
        raise CoatiUsageError(f"checkpoint {path} does not exist")
    if not is_complete(path):
        raise CoatiUsageError(_not_resumable(path))
    return read_json(path / RUNNING_STATE_FILE, "the checkpoint's running state")


def _not_resumable(path: Path) -> str:
    """Why `path`, which has no COMPLETE marker, cannot be resumed from, naming the checkpoints near it."""
    for folder in (path, path / "checkpoints"):      # a save_dir, or a run's output folder with its checkpoints
        if list_checkpoints(folder, complete_only=False):
            newest = latest_checkpoint(folder)
            hint = f" (the newest complete one is {newest})" if newest else ""
            return (f"{path} holds checkpoints but is not one: pass one of the checkpoint folders in {folder}{hint}, "
                    f"or --checkpoint_path latest --save_dir {folder} (TRL: resume_from_checkpoint: true)")
    if not _NAME.match(path.name):
        return f"{path} is not a checkpoint (a folder epoch-E_step-S that a run saved, with a {COMPLETE_MARKER} marker)"
    latest = latest_checkpoint(path.parent)
    hint = f"; the newest complete one is {latest}" if latest else ""
    return (f"checkpoint {path} is incomplete (no {COMPLETE_MARKER} marker: it was interrupted while being written) "
            f"and cannot be resumed from{hint}")


def verify_checkpoint(load_dir: PathLike, shape: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Check a checkpoint before loading it: complete, every weight/optimizer/state file intact, the model
    folder holding weights, and (given `shape`, see `model_shape`) written for a model of that shape.
    Returns its running state; a problem is one `CoatiUsageError` naming the file."""
    state = read_running_state(load_dir)
    path = Path(load_dir)
    if not (path / "modeling").is_dir():
        raise CorruptFileError(f"{path / 'modeling'} is missing: {path} holds no model weights")
    for modeling in path.rglob("modeling"):
        check_weights_dir(modeling)
    for file in sorted(path.rglob("*")):
        if file.suffix in (".bin", ".pt") and file.parent.name != "modeling":
            check_weight_file(file)
    mismatch = signature_mismatch(state.get("model", {}), shape or {})
    if mismatch:
        raise CoatiUsageError(f"checkpoint {path} was written for a model of another shape ({mismatch}: checkpoint "
                              "vs this run's model); resume with the model it was trained from")
    return state


def load_checkpoint(
    load_dir: PathLike,
    booster: Booster,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer],
    lr_scheduler: Optional[Any],
    extra_models: Optional[Dict[str, ModelState]] = None,
) -> Tuple[int, int, int]:
    """Restore model, optimizer, scheduler (and `extra_models`, as saved) and this rank's RNG; return
    (epoch, step, sample_start_index).

    `sample_start_index` is per rank for the current world size: the same number that was saved
    when the world size is unchanged.
    """
    state = verify_checkpoint(load_dir, model_shape(model))
    path = Path(load_dir)
    _load_model_state(path, (booster, model, optimizer, lr_scheduler))
    for name, extra in (extra_models or {}).items():
        _load_model_state(path / name, extra)
    rng_file = path / f"rng_state_rank{rank()}.pt"
    if state["world_size"] == world_size() and rng_file.exists():
        _set_rng_states(torch.load(rng_file, weights_only=True))
    barrier()
    return resume_position(state)


def resume_position(state: Dict[str, Any]) -> Tuple[int, int, int]:
    """(epoch, optimizer step, samples of the epoch each rank has consumed) of a checkpoint's running state, for this
    run's number of processes (the number saved where it is unchanged)."""
    return state["epoch"], state["step"], state["global_samples_in_epoch"] // world_size()


def with_tokenizer_ids(tokenizer: Any, config: Any, generation: Any) -> None:
    """`config` and `generation` (the model's configs, or None) naming the tokenizer's EOS and padding, where the run
    set them (TRL's eos_token and pad_token, a --chat_template folder's EOS), as TRL's clone_chat_template does: the
    model config's EOS is the tokenizer's; generation stops there and at the ids it stopped at before."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos is not None:
        config.eos_token_id = eos
    if pad is not None:
        config.pad_token_id = pad
    if generation is None:
        return
    before = generation.eos_token_id
    stops = list(before) if isinstance(before, (list, tuple)) else [] if before is None else [before]
    if eos is not None and eos not in stops:
        generation.eos_token_id = [eos, *stops] if stops else eos
    if pad is not None:
        generation.pad_token_id = pad


def save_hf_model(
    save_dir: PathLike, booster: Booster, model: torch.nn.Module, tokenizer: Any, coordinator: DistCoordinator
) -> Path:
    """Export the model (safetensors, with its config) and tokenizer so `from_pretrained(save_dir)` loads them; the
    configs name the tokenizer's EOS and padding (`with_tokenizer_ids`)."""
    path = Path(save_dir)
    check_finite_weights(model, path)
    booster.save_model(model, str(path), shard=True, use_safetensors=_use_safetensors(model))
    if coordinator.is_master():
        unwrapped = inner_model(model)
        config = copy.deepcopy(unwrapped.config)
        config._attn_implementation_autoset = False   # as `save_pretrained` does: a reload picks SDPA, not eager
        generation = copy.deepcopy(getattr(unwrapped, "generation_config", None))
        if tokenizer is not None:
            with_tokenizer_ids(getattr(tokenizer, "tokenizer", tokenizer), config, generation)
        config.save_pretrained(path)
        if generation is not None:
            generation.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    barrier()
    return path
