"""Run under torchrun with 2 ranks: REINFORCE++ advantages of each rank's rewards; rank 0 prints its own."""
import json

import torch

from coati.distributed import rank
from coati.distributed.comm import barrier, gather_lists
from coati.distributed.launch import init_distributed
from coati.experience.advantages import ADVANTAGE_ESTIMATORS

init_distributed()
rewards = [torch.tensor([0.0, 2.0]), torch.tensor([4.0, 6.0])][rank()]
advantages = ADVANTAGE_ESTIMATORS.get("reinforce_pp")(rewards, 2)
every = gather_lists([advantages.tolist()])
if rank() == 0:
    print("RESULT " + json.dumps({"rank0": every[0], "rank1": every[1]}), flush=True)
barrier()
