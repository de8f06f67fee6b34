"""How many of verl's example launch scripts `coati` takes as written: each script's `main_ppo` overrides through
`coati grpo`'s (or, for `adv_estimator=gae`, `coati ppo`'s) flag check, as `coati` runs it before starting any
process.

    python benchmarks/verl_examples.py PATH/TO/verl --out output/verl_examples

Shell variables are read from the script's own assignments (`NAME=value`, `NAME=${NAME:-value}`); one still unset
becomes a placeholder the check takes (4, 0.2, 1e-6, a name). Every `*model.path` is a tiny model built here (so
the memory check runs), the data and reward paths are not checked, and every script is checked for `--world`
processes (a script sized for another GPU count can fail its batch sizes). Prints the count and each refusal with its scripts;
writes `results.json` to `--out`. A compatibility count, not a test.
"""
import argparse
import collections
import contextlib
import io
import json
import re
import shlex
from pathlib import Path
from typing import Dict, List, Optional

VARIABLE = re.compile(r"\$\{?(\w+)(?:\[@\])?(?::-[^}]*)?\}?")


def assignments(text: str) -> Dict[str, str]:
    """The script's `NAME=value` lines (a `${NAME:-default}` value read as its default)."""
    found = {}
    for match in re.finditer(r"^\s*(?:export\s+)?(\w+)=(.*)$", text, re.M):
        try:
            value = " ".join(shlex.split(match.group(2), comments=True))   # the value the shell assigns
        except ValueError:
            continue
        default = re.fullmatch(r"\$\{\w+:-([^}]*)\}", value)
        found[match.group(1)] = default.group(1) if default else value
    return found


def overrides(text: str) -> Optional[List[str]]:
    """The `key=value` arguments of the script's `main_ppo` command, its variables filled in where it sets them."""
    known = assignments(text)
    text = re.sub(r"\\\n", " ", text)
    for _ in range(3):   # a variable defined by others
        text = VARIABLE.sub(lambda m: known[m.group(1)] if m.group(1) in known and "$(" not in known[m.group(1)]
                            else m.group(0), text)
    command = re.search(r"main_ppo\b([^\n]*)", text)
    if command is None:
        return None
    try:
        tokens = shlex.split(VARIABLE.sub("X", command.group(1).replace("$@", "")), comments=True)
    except ValueError:
        return None
    return [placeholder(token) for token in tokens if "=" in token and not token.startswith((">", "2>", "|"))]


def placeholder(token: str) -> str:
    """`key=value` with a value still holding an unset variable (X) replaced by one of the key's kind."""
    key, _, value = token.partition("=")
    if "X" not in value or not re.fullmatch(r"[X\d*/+ ()-]+", value):
        return token
    name = key.rsplit(".", 1)[-1]
    if any(word in key for word in ("path", "files", "dir", "name", "logger", "project", "experiment")):
        return f"{key}=x"
    if name.endswith("lr"):
        return f"{key}=1e-6"
    if any(word in name for word in ("ratio", "coef", "utilization")):
        return f"{key}=0.2"
    if name in ("enable", "use_kl_loss", "use_kl_in_reward", "use_dynamic_bsz", "param_offload", "optimizer_offload"):
        return f"{key}=False"
    return f"{key}=4"


def check(tokens: List[str], model: str, world: int) -> str:
    """'ok', or the flag check's one error line for the script's overrides."""
    from coati.cli import commands

    estimator = next((t.split("=", 1)[1] for t in tokens if t.startswith("algorithm.adv_estimator=")), "gae")
    argv = [f"{t.split('=', 1)[0]}={model}" if t.split("=", 1)[0].endswith("model.path") else t for t in tokens
            if not t.startswith(("trainer.n_gpus_per_node=", "trainer.nnodes="))]
    for key, value in (("actor_rollout_ref.model.path", model), ("data.train_files", "train.parquet")):
        if not any(t.startswith(f"{key}=") for t in argv):
            argv.append(f"{key}={value}")
    if not any(t.startswith("custom_reward_function.path=") for t in argv):
        argv += ["--reward_fn", "math_answer"]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            commands.check_flags("ppo" if estimator == "gae" else "grpo", argv, (world, world))
    except SystemExit:
        errors = [line for line in said.getvalue().splitlines() if line.startswith("error")]
        return errors[-1] if errors else "exit without an error line"
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("verl", help="a checkout of verl (its examples/ folder is read)")
    parser.add_argument("--out", default="output/verl_examples")
    parser.add_argument("--world", type=int, default=8, help="processes each script is checked for")
    args = parser.parse_args()
    from coati.cli import commands
    from coati.dataset.demo_data import tokenizer_corpus
    from coati.models.tiny import write_tiny_model

    out = Path(args.out)
    model = str(write_tiny_model(out / "model", tokenizer_corpus(100)))
    commands.check_paths = lambda parsed: {}   # the scripts' data, reward and config files are not here
    scripts = sorted(Path(args.verl, "examples").rglob("*.sh"))
    results, refusals = collections.Counter(), collections.defaultdict(list)
    for script in scripts:
        tokens = overrides(script.read_text(errors="replace"))
        if tokens is None:
            continue
        outcome = check(tokens, model, args.world)
        results["ok" if outcome == "ok" else "refused"] += 1
        if outcome != "ok":
            refusals[outcome].append(str(script.relative_to(args.verl)))
    (out / "results.json").write_text(json.dumps({"counts": results, "refusals": refusals}, indent=1))
    print(f"{results['ok']} of {sum(results.values())} scripts pass the flag check ({len(scripts)} scripts read)")
    for line, names in sorted(refusals.items(), key=lambda item: -len(item[1])):
        print(f"{len(names):3d}  {line[:200]}\n     {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}")


if __name__ == "__main__":
    main()
