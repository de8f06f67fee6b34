"""Supervised fine-tuning built from coati's parts in Python, with a callback of yours that ends the run early.

    coati tiny-model model   # or your model's folder
    python examples/library/sft_with_callback.py model sft.jsonl out   # torchrun --nproc_per_node N ... also works

`sft.jsonl` holds TRL's SFT rows (`messages`, or `prompt` and `completion`); the model is saved to `out/model`.
"""
import sys

import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.dataset import SupervisedCollator, load_prepared, prepare_sft
from coati.distributed.launch import init_distributed
from coati.trainer import Callback, SFTTrainer


class StopBelow(Callback):
    """Ends training at the first logged loss under `floor`."""

    def __init__(self, floor: float) -> None:
        self.floor, self.stop_training = floor, False

    def on_log(self, step: int, metrics: dict) -> None:
        self.stop_training = metrics.get("train/loss", float("inf")) < self.floor


def main(model_dir: str, data_file: str, out_dir: str) -> None:
    init_distributed(seed=0)   # one process under python; the launched ones under torchrun
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prepare_sft([data_file], tokenizer, 256, f"{out_dir}/data")   # validated and tokenized with the chat template
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    loader = plugin.prepare_dataloader(load_prepared([f"{out_dir}/data"]), batch_size=8, shuffle=True,
                                       collate_fn=SupervisedCollator(tokenizer.pad_token_id))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model, optimizer, *_ = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    stop = StopBelow(2.0)
    trainer = SFTTrainer(booster, 20, model, optimizer, plugin, log_interval=5, callbacks=[stop])
    trainer.fit(loader)
    booster.save_model(model, f"{out_dir}/model", shard=True, use_safetensors=True)   # from_pretrained reads it
    tokenizer.save_pretrained(f"{out_dir}/model")
    print(f"stopped at step {trainer.step} with the loss {'under' if stop.stop_training else 'still over'} 2")


if __name__ == "__main__":
    main(*sys.argv[1:4])
