from .collators import COLLATORS, KTOCollator, PreferenceCollator, PromptCollator, SupervisedCollator, pad_sequences
from .prepare import load_prepared, load_rows, prepare_dataset, prepare_preference, prepare_sft
from .sampler import StatefulDistributedSampler
from .tokenization import IGNORE_INDEX, tokenize_conversation, tokenize_kto, tokenize_preference

__all__ = [
    "COLLATORS", "KTOCollator", "PreferenceCollator", "PromptCollator", "SupervisedCollator", "pad_sequences", "load_prepared", "load_rows", "prepare_dataset", "prepare_preference",
    "prepare_sft", "StatefulDistributedSampler", "IGNORE_INDEX", "tokenize_conversation", "tokenize_kto", "tokenize_preference",
]
