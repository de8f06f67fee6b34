"""How scripts fail: a usage error or a lost peer prints one line and exits with its own status, no traceback."""
import functools
import sys
from typing import Callable, TypeVar

import torch.distributed as dist

from coati.distributed.comm import is_local_rank_0, rank

USAGE_EXIT_CODE = 2
PEER_LOST_EXIT_CODE = 3
T = TypeVar("T")

_PEER_FAILURE_MARKERS = ("gloo/transport", "Connection closed by peer", "Connection reset by peer",
                         "Timed out waiting", "NCCL communicator was aborted", "Broken pipe")
"""What the errors of a collective say when another rank died or cannot be reached (gloo raises plain
RuntimeErrors; NCCL raises `DistBackendError`)."""


class CoatiUsageError(Exception):
    """A problem the user can fix (a flag, a path, a file's content); the message says how."""


def is_peer_failure(error: BaseException) -> bool:
    """True for the error a collective raises when a peer process died, hung past the timeout or is unreachable."""
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in _PEER_FAILURE_MARKERS)


def peer_lost_message(error: BaseException) -> str:
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (f"error: rank {rank()} lost contact with the other ranks ({first_line}). Another process of this run "
            f"died or cannot be reached, so every rank stops. Resume from the last complete checkpoint with "
            f"--checkpoint_path latest.")


def exit_cleanly(main: Callable[..., T]) -> Callable[..., T]:
    """Run a script's `main`, turning the two failures a user meets into one line and an exit status.

    - `CoatiUsageError`: `error: ...` once per node, exit 2 on every rank.
    - A collective that fails because a peer died or timed out: the message above on each rank that
      sees it, exit 3, so the launcher stops the run instead of it hanging.
    Ranks leave without waiting on peers.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except CoatiUsageError as error:
            if is_local_rank_0():
                print(f"error: {error}", file=sys.stderr, flush=True)
            sys.exit(USAGE_EXIT_CODE)
        except Exception as error:
            if not is_peer_failure(error):
                raise
            print(peer_lost_message(error), file=sys.stderr, flush=True)
            sys.exit(PEER_LOST_EXIT_CODE)

    return wrapper
