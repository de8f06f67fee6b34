"""`benchmarks/verl_examples.py`, the count of verl's launch scripts `coati` takes as written: a script's variables
are filled in as the shell would (its own assignments, `${NAME:-default}`, quoted lists), and a script passes or is
refused by the flag check `coati` runs before it starts any process."""
import importlib.util

from conftest import REPO

BENCH = REPO / "benchmarks" / "verl_examples.py"
SCRIPT = """set -x
n_resp=${N_RESP:-4}
save_contents="['model', 'optimizer', 'extra']"
lr=1e-6
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/train.parquet \\
    data.train_batch_size=16 \\
    actor_rollout_ref.model.path=Qwen/Qwen3-8B \\
    actor_rollout_ref.actor.optim.lr=${lr} \\
    actor_rollout_ref.actor.checkpoint.save_contents="${save_contents}" \\
    actor_rollout_ref.rollout.n=${n_resp} \\
    actor_rollout_ref.rollout.name=ROLLOUT \\
    trainer.n_gpus_per_node=${GPUS} $@
"""


def _bench():
    spec = importlib.util.spec_from_file_location("verl_examples", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_scripts_overrides_are_read_as_the_shell_fills_them_and_checked(tiny_assets, monkeypatch):
    from coati.cli import commands

    bench = _bench()
    tokens = bench.overrides(SCRIPT.replace("ROLLOUT", "hf"))
    assert tokens[:4] == ["algorithm.adv_estimator=grpo", "data.train_files=X/data/train.parquet",
                          "data.train_batch_size=16",
                          "actor_rollout_ref.model.path=Qwen/Qwen3-8B"]   # a variable it does not set stays X
    assert "actor_rollout_ref.actor.optim.lr=1e-6" in tokens and "actor_rollout_ref.rollout.n=4" in tokens
    assert "actor_rollout_ref.actor.checkpoint.save_contents=['model', 'optimizer', 'extra']" in tokens
    assert "trainer.n_gpus_per_node=4" in tokens   # unset: a placeholder of its kind
    monkeypatch.setattr(commands, "check_paths", lambda parsed: {})
    assert bench.check(tokens, str(tiny_assets["model"]), 2) == "ok"
    refused = bench.check(bench.overrides(SCRIPT.replace("ROLLOUT", "sglang")), str(tiny_assets["model"]), 2)
    assert refused.startswith("error: ") and "actor_rollout_ref.rollout.name=sglang has no counterpart here" in refused
