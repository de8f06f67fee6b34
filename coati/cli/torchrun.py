"""torchrun as the `coati` command starts it, ending as a single-process run ends: with the failing process's own
lines and exit status, not torchrun's failure report and traceback.

- A Ctrl-C or SIGTERM, which torchrun passes on to the training processes, ends it with the signal's status and the
  `error: interrupted ...` line, which says how to resume, last: the processes' own on a Ctrl-C, this one's on a
  SIGTERM or SIGHUP (the processes end at it without a word: torchrun stops the healthy ones that way when another
  fails, and their line would then hide the failure).
- A training process that fails has said why itself (its `error:` line on the node's first process, or its
  traceback); that line is said again only where the first process did not say it, and a process killed by a
  signal (the out-of-memory killer's SIGKILL) is named in one line.
"""
import logging
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main

from coati.utils.errors import interrupted_line


def failure_line(failed: ChildFailedError) -> str:
    """What to add to the failing processes' own output about the first failure ('' where they said it all)."""
    rank, failure = failed.get_first_failure()
    if failure.exitcode < 0:
        return (f"error: the training process of rank {rank} was killed by {failure.signal_name()} (an out-of-memory "
                "kill is a SIGKILL); the others were stopped")
    message = str(failure.message).strip().splitlines()
    said_by_first_process = failure.local_rank == 0 or not message or not message[-1].startswith("error: ")
    return "" if said_by_first_process else message[-1]


def exit_status(failed: ChildFailedError) -> int:
    """The first failing process's exit status (128 + N for signal N), as a single-process run exits."""
    _, failure = failed.get_first_failure()
    return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode


QUIET_LOGGERS = ("torch.distributed.elastic.multiprocessing.api",
                 "torch.distributed.elastic.multiprocessing.errors.error_handler")
"""torchrun's notes as it stops the processes ('Sending process ... closing signal', 'failed (exitcode: 2)', 'no error
file defined for parent'), which would follow the processes' own last line."""

if __name__ == "__main__":
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        main()
    except SignalException as stop:
        if stop.sigval != signal.SIGINT:   # from the line's start: a stopped process's bar may have left it open
            print(f"\r{interrupted_line()}", file=sys.stderr, flush=True)
        sys.exit(128 + int(stop.sigval))
    except ChildFailedError as failed:
        line = failure_line(failed)
        if line:
            print(line, file=sys.stderr, flush=True)
        sys.exit(exit_status(failed))
