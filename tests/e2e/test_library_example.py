"""The library page's whole run (`examples/library/sft_with_callback.py`) as a user runs it: a process of its own that
prepares the data, trains until its callback stops it, and saves a model `from_pretrained` loads."""
import re
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import REPO, child_env


@pytest.mark.slow
def test_the_library_pages_sft_script_trains_until_its_callback_stops_it(tiny_assets, tmp_path):
    raw = tiny_assets["model"].parent / "sft_train.jsonl"
    result = subprocess.run([sys.executable, str(REPO / "examples" / "library" / "sft_with_callback.py"),
                             str(tiny_assets["model"]), str(raw), str(tmp_path / "out")], capture_output=True, text=True,
                            env=child_env(), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    stopped = re.search(r"stopped at step (\d+) with the loss under 2", result.stdout)
    assert stopped and int(stopped.group(1)) < 20 * 12, result.stdout[-2000:]   # before its 20 epochs of 12 steps
    AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "model")
    AutoTokenizer.from_pretrained(tmp_path / "out" / "model")
