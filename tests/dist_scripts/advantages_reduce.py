"""Run under torchrun with 2 ranks: REINFORCE++ advantages of each rank's rewards, and an adaptive KL controller
fed each rank's own KL; rank 0 prints every rank's advantages and controller values."""
import json
from types import SimpleNamespace

import torch

from coati.distributed import rank
from coati.utils.comm import gather_lists
from coati.distributed.launch import init_distributed
from coati.experience.advantages import AdvantageConfig
from coati.utils.registry import ADVANTAGE_ESTIMATORS
from coati.experience.controllers import KLController

from leave import leave_together

init_distributed()
rewards = [torch.tensor([0.0, 2.0]), torch.tensor([4.0, 6.0])][rank()]
advantages = ADVANTAGE_ESTIMATORS.get("reinforce_pp")(rewards, AdvantageConfig(2))
# per-token KL of 2 completions per rank: summed per completion rank 0 [1, 3], rank 1 [5, 7] -> global mean 4
kl = [torch.tensor([[0.5, 0.5], [1.0, 2.0]]), torch.tensor([[5.0, 0.0], [3.0, 4.0]])][rank()]
controller = KLController(0.1, target=5.0, horizon=100)
controller.observe([SimpleNamespace(kl=kl)], 2)
every = gather_lists([(advantages.tolist(), controller.value)])
if rank() == 0:
    print("RESULT " + json.dumps({"rank0": every[0][0], "rank1": every[1][0],
                                  "kl_values": [every[0][1], every[1][1]]}), flush=True)
leave_together()
