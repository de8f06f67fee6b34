"""Run under torchrun with 2 ranks: each rank records different stats; rank 0 prints the export as JSON."""
import json

import torch

from coati.distributed import rank
from coati.distributed.launch import init_distributed
from coati.utils.stats_tracker import StatsTracker

from leave import leave_together

init_distributed()
r = rank()
stats = StatsTracker()
# rank 0: rewards [1, 0, 1], lengths [4, 9, 6]; rank 1: rewards [0, 0], lengths [3, 12]
rewards = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0])][r]
lengths = [torch.tensor([4.0, 9.0, 6.0]), torch.tensor([3.0, 12.0])][r]
with stats.scope("rollout"):
    stats.scalar(reward=rewards.mean().item())
    stats.denominator(correct=rewards > 0, wrong=rewards <= 0)
    stats.stat(denominator="correct", length=lengths)
    stats.stat(denominator="wrong", length=lengths)
    if r == 1:
        stats.scalar(only_rank1=5.0)
reduced = stats.export()   # a collective: every rank calls it

window = StatsTracker()    # a log window of two steps, each closed with end_step
# step 1: rank 0 loss 10, rank 1 loss 2 (mean 6); step 2: rank 0 three losses of 1, rank 1 one of 4 (mean 1.75)
for total in ([10.0], [2.0])[r]:
    window.add("loss", total)
window.minimum(low=[0.3, 0.1][r])
window.end_step()
for total in ([1.0, 1.0, 1.0], [4.0])[r]:
    window.add("loss", total)
window.scalar(only_step2=7.0)
window.maximum(high=[0.5, 0.9][r])
reduced["window"] = window.export()
if r == 0:
    print("RESULT " + json.dumps(reduced), flush=True)
leave_together()
