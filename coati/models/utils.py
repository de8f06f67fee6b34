"""Small model helpers ColossalChat's scripts import from `coati.models`."""
import torch


def disable_dropout(model: torch.nn.Module) -> None:
    """Every dropout layer of `model` off (p = 0), so log-probs of the same tokens agree between the rollout and
    the update (ColossalChat does this to PPO's actor and critic)."""
    if model is None:
        return
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
