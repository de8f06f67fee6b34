"""Run under torchrun: every rank fills a meter differently; rank 0 prints the reduced means as JSON."""
import json

from coati.distributed import rank
from coati.distributed.launch import init_distributed
from coati.utils import AccumulativeMeanMeter, all_reduce_meter

from leave import leave_together

init_distributed()
meter = AccumulativeMeanMeter()
r = rank()
meter.add("loss", 10.0 * (r + 1), 2 * (r + 1))   # rank 0: 10 over 2; rank 1: 20 over 4
if r == 1:
    meter.add("only_rank1", 9.0, 3)
reduced = all_reduce_meter(meter)
if r == 0:
    print("RESULT " + json.dumps(reduced))
leave_together()
