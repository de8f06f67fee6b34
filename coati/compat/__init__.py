"""What ColossalChat's own scripts import from `coati` that coati itself has no use for: its verifiable rewards
(`coati.utils.reward_score`), its LoRA merge switch (`coati.models.lora_manager`) and its raw-conversation dataset
(`coati.dataset.loader.RawConversationDataset`). Those import paths re-export from here, so the scripts of
ColossalChat's main branch import as they are; the core does not use these. It imports nothing of coati's, so any layer
may re-export from it."""
