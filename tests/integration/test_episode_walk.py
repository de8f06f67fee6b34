"""The walk of one multi-turn GRPO episode (`tests/episode_walk.py`) is what `docs/concepts/episode-walk.md` shows,
and its moves between files do not grow: the run-config refactor (issue 48) shortened the way to at most half of
the 77 moves traced on the code before it (`0a34dbd`, the same tracer), 38."""
import json
import os
import subprocess
import sys

from conftest import REPO, child_env
from episode_walk import PAGE, Step, moves, render

MOVES_CEILING = 38


def test_the_docs_show_the_episode_walk_the_code_takes_and_it_does_not_grow_longer():
    result = subprocess.run([sys.executable, str(REPO / "tests" / "episode_walk.py"), "--json"], capture_output=True,
                            text=True, timeout=600, cwd=REPO, env=child_env(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")])))
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("WALK "))
    steps = [Step(*step) for step in json.loads(line[len("WALK "):])]
    assert steps[0] == Step("coati/trainer/onpolicy.py", "OLTrainer._episode")
    assert "apply_gradients" in {step.function for step in steps}   # the optimizer step ends the walk
    assert {"coati/rollout/multiturn.py", "coati/rollout/tools.py", "coati/rewards/math.py",
            "coati/models/loss.py"} <= {step.file for step in steps}   # turns, the tool, the rewards, the loss
    assert PAGE.read_text() == render(steps), "the walk changed: PYTHONPATH=tests .venv/bin/python tests/episode_walk.py"
    assert moves(steps)["moves"] <= MOVES_CEILING, f"the walk grew longer: {moves(steps)}"
