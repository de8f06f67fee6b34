"""GSM8K-style RLVR: GRPO with the verifiable math reward on local GSM8K-format files. coati's `Saver` writes a
checkpoint every `--save_every` episodes (and every `--save_every_secs` seconds, if set); its `Evaluator`
measures held-out accuracy every `--eval_every` episodes (and after every `--eval_every_epochs` passes over the
training questions, if set).

    torchrun-free entry point; it launches train_grpo.py itself:
    python applications/gsm8k_rlvr/run_gsm8k.py --pretrain SFT_MODEL \
        --train_file gsm8k/main/train-00000-of-00001.parquet --test_file gsm8k/main/test-00000-of-00001.parquet \
        --out output/gsm8k --episodes 200 --save_every 50 --eval_every 25

The files are openai/gsm8k's (`question`, `answer` ending in `#### N`; parquet or JSONL, or folders of
them). `--async_rollout K` generates in a Ray actor up to K episodes ahead of training (train_grpo.py's
`--async_rollout --max_staleness K`). Flags after `--` go to train_grpo.py unchanged (e.g. `-- --lr 1e-6`).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from coati.dataset.prepare import prepare_dataset
from coati.dataset.tokenization import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
TRAIN_GRPO = REPO / "examples" / "training_scripts" / "train_grpo.py"


def prepare_prompts(args: argparse.Namespace, out: Path) -> None:
    """GSM8K files -> prompt datasets (question as the user turn, `gt_answer` from `#### N`)."""
    tokenizer = load_tokenizer(args.pretrain)
    for split, source in (("train", args.train_file), ("test", args.test_file)):
        counts = prepare_dataset([source], "prompt", tokenizer, args.max_prompt_length, out / "data" / split)
        print(f"[gsm8k] {split}: {counts['kept']} prompts from {source}", flush=True)


def grpo_command(args: argparse.Namespace, out: Path, extra: list) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
            str(TRAIN_GRPO), "--pretrain", args.pretrain, "--prompt_dataset", str(out / "data" / "train"),
            "--eval_dataset", str(out / "data" / "test"), "--reward_fn", "math_answer", "answer_format=0.1",
            "--num_episodes", str(args.episodes), "--save_interval", str(args.save_every),
            "--eval_interval", str(args.eval_every), "--save_freq_secs", str(args.save_every_secs),
            "--eval_freq_epochs", str(args.eval_every_epochs), "--save_dir", str(out / "checkpoints"),
            "--log_dir", str(out / "logs"), "--output_dir", str(out), "--checkpoint_path", "latest",
            *(["--async_rollout", "--max_staleness", str(args.async_rollout)] if args.async_rollout is not None else []),
            *extra]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--pretrain", required=True, help="policy to start from (an SFT model), from_pretrained format")
    parser.add_argument("--train_file", required=True, help="GSM8K-format training questions")
    parser.add_argument("--test_file", required=True, help="GSM8K-format held-out questions")
    parser.add_argument("--out", default="output/gsm8k")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--save_every", type=int, default=50, help="checkpoint every N episodes (resumable)")
    parser.add_argument("--save_every_secs", type=float, default=0, help="also checkpoint every S seconds (0: off)")
    parser.add_argument("--eval_every", type=int, default=25, help="held-out accuracy every M episodes")
    parser.add_argument("--eval_every_epochs", type=int, default=0,
                        help="also measure it after every E passes over the training questions (0: off)")
    parser.add_argument("--max_prompt_length", type=int, default=512)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--async_rollout", type=int, default=None, metavar="K",
                        help="asynchronous rollouts with at most K episodes of staleness (default: synchronous)")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = Path(args.out).resolve()
    prepare_prompts(args, out)
    result = subprocess.run(grpo_command(args, out, extra), env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        sys.exit(f"[gsm8k] train_grpo.py failed with exit status {result.returncode}")
    history = json.loads((out / "eval_results.json").read_text())
    for episode, metrics in history.items():
        print(f"[gsm8k] episode {episode}: held-out accuracy {metrics['eval/rewards/math_answer']:.3f}", flush=True)


if __name__ == "__main__":
    main()
