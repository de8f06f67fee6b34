"""Distributed helpers. Import the plugin factory from `coati.distributed.plugins` and process-group
start-up from `coati.distributed.launch`; this package itself stays light (no colossalai import)."""
from coati.utils.comm import barrier, is_distributed, is_local_rank_0, is_rank_0, rank, world_size

__all__ = ["barrier", "is_distributed", "is_local_rank_0", "is_rank_0", "rank", "world_size"]
