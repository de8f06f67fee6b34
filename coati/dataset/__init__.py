from .collators import SupervisedCollator, pad_sequences
from .prepare import load_prepared, load_raw, prepare_sft
from .sampler import StatefulDistributedSampler
from .tokenization import IGNORE_INDEX, tokenize_conversation

__all__ = [
    "SupervisedCollator", "pad_sequences", "load_prepared", "load_raw", "prepare_sft",
    "StatefulDistributedSampler", "IGNORE_INDEX", "tokenize_conversation",
]
