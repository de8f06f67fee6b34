"""A worker's lifetime is its launcher's: when torchrun is killed (SIGKILL leaves it no chance to stop its
workers), each worker is killed too instead of training on, orphaned, for hours."""
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 1.0


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def follow_launcher() -> None:
    """Under torchrun, have the kernel send SIGKILL to this process when its parent (torchrun's agent)
    dies (Linux `PR_SET_PDEATHSIG`); elsewhere, or where prctl is missing, a daemon thread polls the
    parent and kills this process once it is gone. A parent that died while this was being set up is
    caught too."""
    if not launched_by_torchrun():
        return
    parent = os.getppid()
    if not _set_parent_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), name="launcher-watch", daemon=True).start()
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def ends_with_parent(sig: int = signal.SIGTERM) -> Optional[Callable[[], None]]:
    """A child process's `preexec_fn` that has the kernel send it `sig` when the process that starts it dies (Linux
    `PR_SET_PDEATHSIG`; resolved here, so that the forked child only calls it); None where prctl is missing."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()   # the process about to start the child

    def ask() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:   # the parent died before the signal was asked for
            os.kill(os.getpid(), sig)
    return ask


def _set_parent_death_signal() -> bool:
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def _prctl() -> Optional[Callable[..., int]]:
    """Linux's prctl, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGKILL)
