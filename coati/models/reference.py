"""The frozen reference policy of DPO-style losses, live or as log-probs computed once.

`--precompute_ref_logps` runs the reference model over each prepared preference folder once and
stores the summed log-probs of chosen and rejected beside the data, in
`<folder>/reference_logps/<key>/` (arrow), keyed by the reference model's path and `--max_length`.
Later runs reuse them, and training never holds the reference model in memory.
"""
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from datasets import Dataset, concatenate_datasets, load_from_disk
from tqdm import tqdm
from transformers import PreTrainedModel

from coati.dataset.collators import batch_rows
from coati.utils.comm import barrier, is_distributed, is_rank_0, rank, world_size

from .logprobs import pair_sequence_logps
from .vision import auto_model_class

PathLike = Union[str, Path]
REF_COLUMNS = ("chosen_ref_logps", "rejected_ref_logps")


def load_reference_model(path: str, device: torch.device, dtype: torch.dtype = torch.float32,
                         trust_remote_code: bool = False) -> PreTrainedModel:
    """The reference policy, frozen, in eval mode, on `device`."""
    model = auto_model_class(path).from_pretrained(path, torch_dtype=dtype, trust_remote_code=trust_remote_code)
    model.requires_grad_(False)
    return model.to(device).eval()


@torch.no_grad()
def pair_logps(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Summed label log-probs of the chosen and rejected rows of a preference batch, one forward."""
    pairs = batch_rows(batch)
    logps, _ = pair_sequence_logps(model, batch)
    return {REF_COLUMNS[0]: logps[:pairs], REF_COLUMNS[1]: logps[pairs:]}


def _cache_dir(folder: PathLike, ref_path: str, max_length: int) -> Path:
    key = hashlib.sha1(f"{os.path.realpath(ref_path)}|{max_length}".encode()).hexdigest()[:12]
    return Path(folder) / "reference_logps" / key


def _compute(model: torch.nn.Module, dataset: Dataset, collator: Callable, batch_size: int,
             device: torch.device) -> Dict[str, List[float]]:
    """Reference log-probs of every row: each rank scores rows rank, rank + world, ..., then all gather."""
    indices = list(range(rank(), len(dataset), world_size()))
    found: Dict[int, Tuple[float, float]] = {}
    for start in tqdm(range(0, len(indices), batch_size), desc="reference log-probs", disable=not is_rank_0()):
        chunk = indices[start:start + batch_size]
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                 for k, v in collator([dataset[i] for i in chunk]).items()}
        scores = pair_logps(model, batch)
        found.update(zip(chunk, zip(*(scores[c].tolist() for c in REF_COLUMNS))))
    if is_distributed():
        parts: List[Dict[int, Tuple[float, float]]] = [{} for _ in range(world_size())]
        dist.all_gather_object(parts, found)
        found = {k: v for part in parts for k, v in part.items()}
    return {c: [found[i][n] for i in range(len(dataset))] for n, c in enumerate(REF_COLUMNS)}


def with_reference_logps(folders: Sequence[PathLike], load: Callable[[Sequence[PathLike]], Dataset],
                         ref_path: str, model_loader: Callable[[], torch.nn.Module], collator: Callable,
                         max_length: int, batch_size: int, device: torch.device) -> Dataset:
    """The prepared `folders`, each with its stored reference log-prob columns, computing (and storing)
    those that are missing; the reference model is loaded only then, and freed after."""
    parts, model = [], None
    for folder in folders:
        data = load([folder])
        cache = _cache_dir(folder, ref_path, max_length)
        if not (cache / "info.json").is_file():
            model = model or model_loader()
            columns = _compute(model, data, collator, batch_size, device)
            if is_rank_0():
                Dataset.from_dict(columns).save_to_disk(str(cache))
                (cache / "info.json").write_text(json.dumps({"reference": os.path.realpath(ref_path),
                                                             "max_length": max_length, "rows": len(data)}))
            barrier()
        stored = load_from_disk(str(cache))
        parts.append(concatenate_datasets([data, stored], axis=1))
    return concatenate_datasets(parts)
