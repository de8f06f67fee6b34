"""Process-group start-up for training scripts, under torchrun, `colossalai run`, or plain `python`."""
import os
import socket

import colossalai


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(seed: int = 42) -> None:
    """Start colossalai's process group (gloo on CPU, NCCL on GPU) and seed every RNG.

    A script started with plain `python` runs as a world of one on a free local port.
    """
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    colossalai.launch_from_torch(seed=seed)
