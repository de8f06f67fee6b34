"""The demo pipeline on tiny built-in defaults: local tiny model and task data, then supervised training.

    python applications/demo/run_demo.py --out output/demo

Each stage prints one line when it starts and ends, with its wall time. Training stages run the
real `examples/training_scripts` under `torchrun --nproc_per_node 2 --plugin ddp`.
"""
import argparse
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from transformers import AutoTokenizer

from coati.dataset.demo_data import generate_problems, sft_records, tokenizer_corpus, write_jsonl
from coati.dataset.prepare import prepare_sft
from coati.models.tiny import MODEL_SIZES, write_tiny_model

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "training_scripts"


@contextmanager
def stage(name: str):
    """Print the stage's start and end lines with its wall time."""
    print(f"[demo] {name}: start", flush=True)
    start = time.perf_counter()
    yield
    print(f"[demo] {name}: done in {time.perf_counter() - start:.1f}s", flush=True)


def torchrun(script: str, nproc: int, *flags: str) -> None:
    """Run a training script under torchrun; a failure stops the demo with the script's exit status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(SCRIPTS / script), *flags]
    result = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        sys.exit(f"[demo] {script} failed with exit status {result.returncode}")


def build_assets(out: Path, size: str, num_train: int, num_eval: int) -> Path:
    model_dir = write_tiny_model(out / "model_init", tokenizer_corpus(), size=size)
    write_jsonl(sft_records(generate_problems(num_train, "train")), out / "raw" / "sft_train.jsonl")
    write_jsonl(sft_records(generate_problems(num_eval, "eval")), out / "raw" / "sft_eval.jsonl")
    return model_dir


def prepare(out: Path, model_dir: Path, max_length: int) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for split in ("train", "eval"):
        counts = prepare_sft([out / "raw" / f"sft_{split}.jsonl"], tokenizer, max_length, out / "data" / f"sft_{split}")
        print(f"[demo] sft_{split}: {counts['kept']} rows kept, {counts['dropped']} dropped", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="output/demo", help="output directory for every stage")
    parser.add_argument("--steps", type=int, default=60, help="SFT optimizer steps")
    parser.add_argument("--model_size", default="tiny", choices=tuple(MODEL_SIZES))
    parser.add_argument("--nproc", type=int, default=2, help="processes per stage")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    batch_size = 16
    num_train = args.steps * batch_size * args.nproc
    with stage("build tiny model and task data"):
        model_dir = build_assets(out, args.model_size, num_train, 256)
    with stage("prepare datasets"):
        prepare(out, model_dir, max_length=128)
    with stage("sft"):
        torchrun("train_sft.py", args.nproc, "--pretrain", str(model_dir), "--plugin", "ddp",
                 "--dataset", str(out / "data" / "sft_train"), "--eval_dataset", str(out / "data" / "sft_eval"),
                 "--batch_size", str(batch_size), "--lr", "3e-3", "--warmup_steps", "5", "--log_interval", "5",
                 "--save_dir", str(out / "sft" / "checkpoints"), "--output_dir", str(out / "sft"),
                 "--log_dir", str(out / "sft" / "logs"))
    print(f"[demo] finished: outputs in {out} (model in {out / 'sft' / 'model'}, metrics in "
          f"{out / 'sft' / 'logs' / 'metrics.jsonl'})", flush=True)


if __name__ == "__main__":
    main()
