"""How scripts fail: a usage error or a lost peer prints one line and exits with its own status, no traceback.

Under torchrun each worker also records that line in the error file torchrun names
(`TORCHELASTIC_ERROR_FILE`), so the root-cause section of torchrun's failure summary shows our message
instead of "To enable traceback see ...". A worker started by torchrun exits when torchrun itself dies.
"""
import errno
import functools
import json
import os
import sys
import time
import traceback
from typing import Callable, Dict, NoReturn, Optional, TypeVar

USAGE_EXIT_CODE = 2
PEER_LOST_EXIT_CODE = 3
INTERRUPTED_EXIT_CODE = 130
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
T = TypeVar("T")

_PEER_FAILURE_MARKERS = ("gloo/transport", "Connection closed by peer", "Connection reset by peer",
                         "Timed out waiting", "NCCL communicator was aborted", "Broken pipe")
"""What the errors of a collective say when another rank died or cannot be reached (gloo raises plain
RuntimeErrors; NCCL raises `DistBackendError`)."""


class CoatiUsageError(Exception):
    """A problem the user can fix (a flag, a path, a file's content); the message says how."""


class NonFiniteError(CoatiUsageError):
    """Training diverged: a loss, gradient norm or model output is NaN or infinite; the message says where."""


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _is_local_rank_0() -> bool:
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def is_peer_failure(error: BaseException) -> bool:
    """True for the error a collective raises when a peer process died, hung past the timeout or is unreachable."""
    import torch.distributed as dist

    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in _PEER_FAILURE_MARKERS)


def first_line(error: BaseException) -> str:
    """The first line of `error`'s message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def peer_lost_message(error: BaseException) -> str:
    return (f"error: rank {_rank()} lost contact with the other ranks ({first_line(error)}). Another process of this run "
            f"died or cannot be reached, so every rank stops; {resume_hint()}")


def record_error(message: str) -> None:
    """Write `message` where torchrun's failure summary reads a worker's error (no-op outside torchrun)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    record = {"message": message, "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}
    try:
        with open(path, "w") as f:
            json.dump({"message": record}, f)
    except OSError:
        pass


def _close_progress_bars() -> None:
    """End open tqdm bars now, so a bar cut short is not left mid-line or redrawn after our message."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def warn_user(message: str) -> None:
    """One `warning: ...` line on stderr, once per node: a fact the user should know that does not stop the run."""
    if _is_local_rank_0():
        print(f"warning: {message}", file=sys.stderr, flush=True)


def note_user(message: str) -> None:
    """One `note: ...` line on stderr, once per node: what coati took a value to mean."""
    if _is_local_rank_0():
        print(f"note: {message}", file=sys.stderr, flush=True)


def fail(message: str, code: int, every_rank: bool = False) -> NoReturn:
    """Print `message` (one line, the last this process prints; on one process per node unless
    `every_rank`), record it for torchrun, and exit with `code`."""
    record_error(message)
    _close_progress_bars()
    if every_rank or _is_local_rank_0():
        sys.stdout.flush()
        print(message, file=sys.stderr, flush=True)
    else:
        time.sleep(QUIET_RANK_GRACE_S)
    sys.exit(code)


_RUN: Dict[str, Optional[str]] = {}
"""The --save_dir of the run this process trains (`remember_save_dir`), for `resume_hint`."""


def remember_save_dir(save_dir: Optional[str]) -> None:
    """Say that this process trains a run that keeps its checkpoints in `save_dir` (None: keeps none)."""
    _RUN["save_dir"] = save_dir


def resume_hint() -> str:
    """How a run stopped now goes on: from its newest complete checkpoint, or from the start where it has none. A
    process that knows no run (the launcher) says what holds for any."""
    if "save_dir" not in _RUN:
        return "the complete checkpoints in --save_dir, if any, are kept (resume with --checkpoint_path latest)"
    save_dir = _RUN["save_dir"]
    if not save_dir:
        return "this run keeps no checkpoint (no --save_dir): run it again from the start"
    from coati.utils.ckpt_io import latest_checkpoint

    found = latest_checkpoint(save_dir)
    if found is None:
        return f"no complete checkpoint in {save_dir} yet: run it again from the start"
    return f"complete checkpoints in {save_dir} are kept (resume from {found.name} with --checkpoint_path latest)"


def interrupted_line() -> str:
    """What a run stopped by Ctrl-C (or, launched, by SIGTERM) says last."""
    return f"error: interrupted; {resume_hint()}"


QUIET_RANK_GRACE_S = 3.0
"""How long a rank that does not print the error waits before it exits: torchrun stops every rank as soon as one
fails, and on a loaded machine the printing rank may not have printed yet."""



def exit_cleanly(main: Callable[..., T]) -> Callable[..., T]:
    """Run a script's `main`, turning the failures a user meets into one line and an exit status.

    - `CoatiUsageError`: `error: ...` once per node, exit 2 on every rank.
    - A collective that fails because a peer died or timed out: the message above on each rank that
      sees it, exit 3, so the launcher stops the run instead of it hanging.
    - A full disk: one line naming the file, exit 2. Ctrl-C: one line, exit 130.
    - Anything else keeps its traceback, and its last line goes to torchrun's error file.
    Ranks leave without waiting on peers. A worker of torchrun dies with it (`follow_launcher`).
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        from coati.utils.lifetime import follow_launcher

        follow_launcher()
        try:
            return main(*args, **kwargs)
        except CoatiUsageError as error:
            details = getattr(error, "details", "")
            if details and _is_local_rank_0():
                print(details.rstrip("\n"), file=sys.stderr, flush=True)
            fail(f"error: {error}", USAGE_EXIT_CODE)
        except KeyboardInterrupt:
            fail(interrupted_line(), INTERRUPTED_EXIT_CODE)
        except Exception as error:
            if is_peer_failure(error):
                fail(peer_lost_message(error), PEER_LOST_EXIT_CODE, every_rank=True)
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
                fail(f"error: no space left on the device while writing {error.filename or 'a file'}; free space: "
                     f"{resume_hint()}", USAGE_EXIT_CODE)
            record_error(traceback.format_exc())
            raise

    return wrapper
