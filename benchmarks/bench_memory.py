"""Peak memory of one DPO step and one GRPO policy step on a model with a realistic vocabulary.

    python benchmarks/bench_memory.py                          # this checkout
    python benchmarks/bench_memory.py --compare OLD_CHECKOUT   # and another (e.g. a `git worktree` of an older commit)

A random Llama (`base` sizes, `--vocab` 32,000 by default, fp32 on the CPU) takes one step of each, in a fresh
process per measurement: DPO (the policy's forward and backward over `--pairs` chosen and rejected rows of
`--prompt_tokens` + `--response_tokens`, through `pair_sequence_logps` and `DPOLoss`, reference log-probs given)
and GRPO's policy loss (the `PolicyGradient` objective on as many completions, with the entropy term). Reported: the step's peak
resident memory above what the process held before it (`ru_maxrss`), in MiB, and the step's seconds.
A benchmark, not a test.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, resource, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
from coati.models.tiny import MODEL_SIZES
task, vocab, pairs, prompt, response = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
torch.set_num_threads(2)
model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, max_position_embeddings=prompt + response + 8, **MODEL_SIZES["base"]))
rows, width = 2 * pairs, prompt + response
ids = torch.randint(4, vocab, (rows, width))
mask = torch.ones(rows, width, dtype=torch.long)
if task == "dpo":
    from coati.models.logprobs import pair_sequence_logps
    from coati.models.loss import DPOLoss
    labels = ids.clone()
    labels[:, :prompt] = -100
    batch = {f"{side}_{key}": value[:pairs] if side == "chosen" else value[pairs:]
             for side in ("chosen", "rejected") for key, value in (("input_ids", ids), ("attention_mask", mask), ("labels", labels))}
    def step():
        logps, _ = pair_sequence_logps(model, batch)
        out = DPOLoss()(logps[:pairs], logps[pairs:], torch.zeros(pairs), torch.zeros(pairs))
        out.losses.sum().backward()
else:
    from coati.experience.experience import Experience
    from coati.models.loss import PolicyLoss
    from coati.trainer.components import ObjectiveConfig, PolicyGradient
    action = torch.ones(rows, response, dtype=torch.bool)
    experience = Experience(ids, mask, action, prompt, None, torch.zeros(rows), torch.randn(rows))
    objective = PolicyGradient(ObjectiveConfig(PolicyLoss(), 0.01))
    def step():
        objective(model, experience).loss.backward()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
step()
seconds = time.perf_counter() - start
print(json.dumps({"peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, "seconds": seconds}))
'''


def measure(checkout: str, task: str, args: argparse.Namespace) -> dict:
    """One step of `task` in a fresh process that imports coati from `checkout` (its working folder, which `-c`
    puts first on the path)."""
    env = {**os.environ, "PYTHONPATH": checkout, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", CHILD, task, str(args.vocab), str(args.pairs), str(args.prompt_tokens),
                          str(args.response_tokens)], env=env, cwd=checkout, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--compare", default=None, help="another checkout of coati to measure the same way")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--pairs", type=int, default=8, help="preference pairs (GRPO: half the completions)")
    parser.add_argument("--prompt_tokens", type=int, default=192)
    parser.add_argument("--response_tokens", type=int, default=64)
    args = parser.parse_args()
    checkouts = {"this": str(Path(__file__).resolve().parents[1])}
    if args.compare:
        checkouts["compared"] = str(Path(args.compare).resolve())
    print("| checkout | DPO step peak MiB | DPO step s | GRPO policy step peak MiB | GRPO policy step s |\n|---|---|---|---|---|")
    for name, checkout in checkouts.items():
        dpo, grpo = measure(checkout, "dpo", args), measure(checkout, "grpo", args)
        print(f"| {name} | {dpo['peak_mb']:.0f} | {dpo['seconds']:.2f} | {grpo['peak_mb']:.0f} | {grpo['seconds']:.2f} |")


if __name__ == "__main__":
    main()
