"""The scripts answer `--help` and flag errors before the training stack loads: torch, colossalai and transformers
are imported only once the flags are read (the import is what takes seconds, not the answer)."""
import subprocess
import sys

import pytest

from conftest import REPO, SCRIPTS, child_env

PROBE = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as stop:
    print("exit", stop.code)
print("loaded", sorted(m for m in ("torch", "colossalai", "transformers") if m in sys.modules))
"""


def _probe(script, *argv):
    done = subprocess.run([sys.executable, "-c", PROBE, str(script), *argv], capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=120)
    return done.stdout.strip().splitlines()[-2:], done.stderr


@pytest.mark.parametrize("name", ["sft", "rm", "dpo", "orpo", "kto", "ppo", "grpo"])
def test_help_answers_without_the_training_stack(name):
    (code, loaded), _ = _probe(SCRIPTS / f"train_{name}.py", "--help")
    assert (code, loaded) == ("exit 0", "loaded []")


def test_a_flag_error_answers_without_the_training_stack():
    (code, loaded), err = _probe(SCRIPTS / "train_grpo.py", "--pretrain", "m", "--prompt_dataset", "d",
                                 "--loss_agg", "nope")
    assert (code, loaded) == ("exit 2", "loaded []")
    assert "--loss_agg" in err and "token-mean" in err


def test_data_preparation_answers_help_without_the_stack():
    (code, loaded), _ = _probe(REPO / "examples" / "data_preparation_scripts" / "prepare_dataset.py", "--help")
    assert (code, loaded) == ("exit 0", "loaded []")
