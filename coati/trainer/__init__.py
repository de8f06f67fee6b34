"""Trainers: the two loops (`SLTrainer`, `OLTrainer`) and one class per algorithm, under ColossalChat's names."""
from .base import BatchResult, SLTrainer
from .callbacks import Callback, PerformanceEvaluator
from .dpo import DPOTrainer, ORPOTrainer
from .grpo import GRPOTrainer
from .kto import KTOTrainer
from .onpolicy import OLTrainer
from .ppo import PPOTrainer
from .rm import RewardModelTrainer
from .sft import SFTTrainer

__all__ = ["BatchResult", "OLTrainer", "SLTrainer", "Callback", "PerformanceEvaluator", "DPOTrainer", "ORPOTrainer",
           "GRPOTrainer", "KTOTrainer", "PPOTrainer", "RewardModelTrainer", "SFTTrainer"]
