from .comm import barrier, is_distributed, is_local_rank_0, is_rank_0, rank, world_size
from .launch import init_distributed
from .plugins import CUDA_ONLY, PLUGINS, BoostSetup, add_plugin_args, build_booster, check_plugin_available

__all__ = [
    "barrier", "is_distributed", "is_local_rank_0", "is_rank_0", "rank", "world_size", "init_distributed",
    "CUDA_ONLY", "PLUGINS", "BoostSetup", "add_plugin_args", "build_booster", "check_plugin_available",
]
