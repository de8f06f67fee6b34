"""One rank of a TRL run for benchmarks/bench_training.py, run by TRL's own environment (`make trl-env`) under its
torchrun: the same model, rows, batch size, learning rate and seed as coati's run of the task, at TRL's best correct
setting per task, on the CPU or (`--gpu`) the GPU in bf16 (padding-free SFT; padded reward modelling and DPO, whose padding-free mode TRL 1.16 refuses or
lacks; GRPO with HF generation, one update per batch). Writes `rank{r}.json` with each step's end time, tokens and
peak RSS, as the hand-written loop does.

SFT and RM train on coati's prepared rows as they are (token ids and loss labels); DPO and GRPO take the raw
conversations, which TRL tokenizes with the same tokenizer and chat template.
"""
import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch.distributed as dist
from datasets import Dataset, load_dataset, load_from_disk
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

REPO = Path(__file__).resolve().parents[1]


class StepTimes(TrainerCallback):
    """Each optimizer step's end time, and the tokens TRL counted in it where it logs them (`num_tokens`)."""

    def __init__(self) -> None:
        self.times, self.tokens, self._seen = [], [], 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.time())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "num_tokens" in logs:
            self.tokens.append(logs["num_tokens"] - self._seen)
            self._seen = logs["num_tokens"]


def _common(args: argparse.Namespace) -> dict:
    device = dict(bf16=True) if args.gpu else dict(use_cpu=True, ddp_backend="gloo")
    return dict(output_dir=args.worker_out, per_device_train_batch_size=args.batch_size, learning_rate=1e-5, seed=0,
                num_train_epochs=1, max_steps=args.steps or -1, logging_steps=1, save_strategy="no", report_to=[],
                lr_scheduler_type="constant_with_warmup", dataloader_num_workers=0, disable_tqdm=True, **device)


def _sft(args, tokenizer, callback):
    from trl import SFTConfig, SFTTrainer

    data = load_from_disk(args.data)
    config = SFTConfig(**_common(args), padding_free=True, max_length=None)
    return SFTTrainer(AutoModelForCausalLM.from_pretrained(args.model), args=config, train_dataset=data,
                      processing_class=tokenizer, callbacks=[callback])


def _rm(args, tokenizer, callback):
    from trl import RewardConfig, RewardTrainer

    data = load_from_disk(args.data).select_columns(["chosen_input_ids", "rejected_input_ids"])
    data = data.rename_columns({"chosen_input_ids": "chosen_ids", "rejected_input_ids": "rejected_ids"})
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    config = RewardConfig(**_common(args), max_length=None, center_rewards_coefficient=None)
    return RewardTrainer(model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[callback])


def _raw(args, name: str) -> Dataset:
    return load_dataset("json", data_files=str(Path(args.data).parent / "raw" / name), split="train")


def _dpo(args, tokenizer, callback):
    from trl import DPOConfig, DPOTrainer

    data = _raw(args, "pref.jsonl").rename_column("context", "prompt")
    config = DPOConfig(**_common(args), max_length=None, beta=0.1)
    return DPOTrainer(AutoModelForCausalLM.from_pretrained(args.model), args=config, train_dataset=data,
                      processing_class=tokenizer, callbacks=[callback])


def _grpo(args, tokenizer, callback):
    sys.path.insert(0, str(REPO))
    from coati.rewards.math import math_answer   # plain Python: no colossalai in TRL's environment
    from trl import GRPOConfig, GRPOTrainer

    def correct(prompts, completions, gt_answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return list(math_answer([str(p) for p in prompts], texts, gt_answer).values)

    data = _raw(args, "prompt.jsonl").rename_column("messages", "prompt")
    config = GRPOConfig(**{**_common(args), "per_device_train_batch_size": args.prompts * args.num_generations},
                        num_generations=args.num_generations, max_completion_length=args.max_new_tokens,
                        steps_per_generation=1, beta=args.beta, temperature=1.0)
    return GRPOTrainer(args.model, reward_funcs=correct, args=config, train_dataset=data, processing_class=tokenizer,
                       callbacks=[callback])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--task", choices=["sft", "rm", "dpo", "grpo"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="coati's prepared dataset of the task (raw rows beside it)")
    parser.add_argument("--worker_out", required=True)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps (0: one epoch)")
    parser.add_argument("--prompts", type=int, default=2, help="GRPO: prompts per rank per step")
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--beta", type=float, default=0.0, help="GRPO: KL weight (above 0: a reference model)")
    parser.add_argument("--gpu", action="store_true", help="train on the GPU in bf16 (default: the CPU, fp32, gloo)")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    callback = StepTimes()
    trainer = {"sft": _sft, "rm": _rm, "dpo": _dpo, "grpo": _grpo}[args.task](args, tokenizer, callback)
    trainer.train()
    rank = dist.get_rank() if dist.is_initialized() else 0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (Path(args.worker_out) / f"rank{rank}.json").write_text(json.dumps(
        {"times": callback.times, "tokens": callback.tokens or [0] * len(callback.times), "peak_rss_mb": peak_mb}))


if __name__ == "__main__":
    main()
