"""How a test's distributed script ends once its result is printed."""
import os
import sys

from coati.utils.comm import barrier


def leave_together() -> None:
    """Wait for every rank, then exit at once: the result is already out, and gloo's teardown (destroyed or left to
    the interpreter) once aborted a rank (SIGABRT) and once hung past the test's timeout under CI load."""
    barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
