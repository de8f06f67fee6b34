"""User-facing errors: scripts print them as one line and exit with status 2, no traceback."""
import functools
import sys
from typing import Callable, TypeVar

from coati.distributed.comm import is_local_rank_0

USAGE_EXIT_CODE = 2
T = TypeVar("T")


class CoatiUsageError(Exception):
    """A problem the user can fix (a flag, a path, a file's content); the message says how."""


def exit_on_usage_error(main: Callable[..., T]) -> Callable[..., T]:
    """Run `main`; a `CoatiUsageError` prints `error: ...` once per node and exits 2 on every rank.

    Ranks leave without waiting on peers, so torchrun stops the others instead of a collective hanging.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except CoatiUsageError as error:
            if is_local_rank_0():
                print(f"error: {error}", file=sys.stderr, flush=True)
            sys.exit(USAGE_EXIT_CODE)

    return wrapper
