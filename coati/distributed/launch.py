"""Process-group start-up for training scripts, under torchrun, `colossalai run`, or plain `python`."""
import contextvars
import os
from datetime import timedelta

from coati.config import DEFAULT_DIST_TIMEOUT_S as DEFAULT_TIMEOUT_S

LAUNCH: contextvars.ContextVar = contextvars.ContextVar("coati_launch", default=(1, 1))
"""The (world size, processes on this node) of the launch the `coati` command checks a run's flags for, before it
starts the processes (`coati.cli.commands.check_flags`)."""


def launched_world_size() -> int:
    """The processes the run trains on: WORLD_SIZE in a launched process, else the launch being checked, else 1."""
    return int(os.environ.get("WORLD_SIZE") or LAUNCH.get()[0])


def init_distributed(seed: int = 42, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Start the process group (gloo on CPU, NCCL on GPU, as colossalai's accelerator says) and seed every RNG.

    What colossalai's `launch_from_torch` does, plus a collective timeout: a rank whose peer hangs or
    becomes unreachable fails after `timeout_s` seconds instead of waiting forever. A script started
    with plain `python` runs as a world of one whose store listens on a port the OS picks as it binds
    (a port chosen beforehand can be taken by another process in between: EADDRINUSE). A group that exists already
    (a second run in the same process) is kept.
    """
    import torch.distributed as dist
    from colossalai.accelerator import get_accelerator
    from colossalai.utils import set_seed

    accelerator = get_accelerator()
    if not dist.is_initialized():
        _start_process_group(accelerator.communication_backend, timedelta(seconds=timeout_s))
    if accelerator.support_set_device:
        accelerator.set_device(int(os.environ["LOCAL_RANK"]))
    set_seed(seed)


def seed_each_rank(seed: int, data_rank: int) -> None:
    """Seed every RNG with `seed + data_rank`, once the models are built alike on every rank. `data_rank` is the
    rank's place in the data split: ranks given other prompts sample their own completions (TRL's device-specific
    seed) instead of drawing the same noise, while the ranks of one tensor- or pipeline-parallel group, which share
    their data and must generate alike, keep one stream. A resumed run's checkpoint restores each rank's states."""
    from colossalai.utils import set_seed

    set_seed(seed + data_rank)


def _start_process_group(backend: str, timeout: timedelta) -> None:
    """torchrun's group from the environment; without torchrun, a world of one on a store at an OS-picked port."""
    import torch.distributed as dist

    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
        return
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout)   # port 0: the OS picks a free one
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(store.port))
    dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timeout)
