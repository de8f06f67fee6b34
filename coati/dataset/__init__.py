from .collators import COLLATORS, KTOCollator, PreferenceCollator, PromptCollator, SupervisedCollator, pad_sequences
from .conversation import Conversation, setup_conversation_template
from .loader import (DataCollatorForKTODataset, DataCollatorForPreferenceDataset, DataCollatorForPromptDataset,
                     DataCollatorForSupervisedDataset, load_tokenized_dataset)
from .prepare import load_prepared, load_rows, prepare_dataset, prepare_preference, prepare_sft
from .sampler import StatefulDistributedSampler
from .tokenization import IGNORE_INDEX, tokenize_conversation, tokenize_preference
from .tokenization_utils import tokenize_kto, tokenize_prompt, tokenize_rlhf, tokenize_sft

__all__ = [
    "COLLATORS", "KTOCollator", "PreferenceCollator", "PromptCollator", "SupervisedCollator", "pad_sequences",
    "Conversation", "setup_conversation_template", "DataCollatorForKTODataset", "DataCollatorForPreferenceDataset",
    "DataCollatorForPromptDataset", "DataCollatorForSupervisedDataset", "load_tokenized_dataset", "load_prepared",
    "load_rows", "prepare_dataset", "prepare_preference", "prepare_sft", "StatefulDistributedSampler", "IGNORE_INDEX",
    "tokenize_conversation", "tokenize_preference", "tokenize_kto", "tokenize_prompt", "tokenize_rlhf", "tokenize_sft",
]
