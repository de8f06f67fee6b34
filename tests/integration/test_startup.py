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


def test_the_training_stack_imports_without_compiling_or_compile_workers():
    """colossalai's booster wraps functions in torch.compile at import: coati's import defers those compilations to
    a first call that never comes, so torch's inductor is not loaded and no compile-worker pool is started."""
    probe = ("import sys, coati.cli.runner, torch._inductor.config as c; "
             "print('torch._inductor.compile_fx' in sys.modules, c.compile_threads)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=child_env(), cwd=REPO,
                          timeout=120)
    assert done.stdout.split() == ["False", "1"], done.stderr[-2000:]


def test_a_compilation_deferred_to_the_first_call_still_compiles_and_computes():
    import torch

    from coati.utils.lean_import import compile_on_first_call

    real = torch.compile
    with compile_on_first_call():
        double = torch.compile(lambda x: x * 2, backend="eager")

        @torch.compile(backend="eager")
        def add_one(x):
            return x + 1

        module = torch.compile(torch.nn.Identity(), backend="eager")
    assert torch.compile is real
    assert type(module).__name__ == "OptimizedModule"   # modules compile as usual
    assert double(torch.tensor(3.0)).item() == 6.0 and add_one(torch.tensor(1.0)).item() == 2.0
