"""Process-group start-up for training scripts, under torchrun, `colossalai run`, or plain `python`."""
import os
from datetime import timedelta

from coati.config import DEFAULT_DIST_TIMEOUT_S as DEFAULT_TIMEOUT_S


def init_distributed(seed: int = 42, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Start the process group (gloo on CPU, NCCL on GPU, as colossalai's accelerator says) and seed every RNG.

    What colossalai's `launch_from_torch` does, plus a collective timeout: a rank whose peer hangs or
    becomes unreachable fails after `timeout_s` seconds instead of waiting forever. A script started
    with plain `python` runs as a world of one whose store listens on a port the OS picks as it binds
    (a port chosen beforehand can be taken by another process in between: EADDRINUSE).
    """
    import torch.distributed as dist
    from colossalai.accelerator import get_accelerator
    from colossalai.utils import set_seed

    accelerator = get_accelerator()
    timeout = timedelta(seconds=timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend=accelerator.communication_backend, init_method="env://", timeout=timeout)
    else:
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout)   # port 0: the OS picks a free one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
        dist.init_process_group(backend=accelerator.communication_backend, store=store, rank=0, world_size=1,
                                timeout=timeout)
    if accelerator.support_set_device:
        accelerator.set_device(int(os.environ["LOCAL_RANK"]))
    set_seed(seed)
