"""ColossalChat's LoRA merge switch, `coati.models.lora_manager`."""
from dataclasses import dataclass


@dataclass
class LoraManager:
    """ColossalChat's switch: with `able_to_merge`, its LoRA layers fold the adapter into the weight on `eval()` (a
    speed-up with the same outputs) and unfold it on `train()`; its GRPO and PPO scripts turn it off. coati's
    adapters (peft's layers) compute the weight and the adapter apart in every mode, as ColossalChat's do with the
    switch off, so here it is kept for the scripts that set it and changes no output."""

    able_to_merge: bool = True


lora_manager = LoraManager()
"""The one switch ColossalChat's scripts set (`lora_manager.able_to_merge = False`)."""
