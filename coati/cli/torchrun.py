"""torchrun as the `coati` command starts it: a Ctrl-C or SIGTERM, which torchrun passes on to the training
processes, ends it with the signal's exit status and without a traceback of its own, so that the processes'
`error: interrupted ...` line, which says how to resume, is the last one on the screen."""
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException as stop:
        sys.exit(128 + int(stop.sigval))
