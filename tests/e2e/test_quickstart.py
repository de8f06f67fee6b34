"""The README's quickstart, run as a user runs it: its shell blocks, verbatim, in a fresh home folder with the `coati`
command on the path (`make install` and `source .venv/bin/activate`)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, child_env


def quickstart_script() -> str:
    """The README's quickstart section's bash blocks, in order, as one script that stops at the first failure."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Quickstart"):]
    section = section[:section.index("\n## ", 1)]
    return "set -euo pipefail\n" + "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))


@pytest.mark.slow
def test_the_readme_quickstart_runs_sft_then_grpo_from_trl_style_configs(tmp_path):
    env = child_env(HOME=str(tmp_path), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("OMP_NUM_THREADS")   # as a user's shell has it
    env.pop("COATI_CACHE")   # the user's own cache, in the fresh home
    done = subprocess.run(["bash", "-c", quickstart_script()], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    run = tmp_path / "coati-quickstart"
    for stage in ("sft", "grpo"):
        out = run / "out" / stage
        assert (out / "model" / "config.json").is_file() and (out / "run_config.yaml").is_file()
        assert (out / "run_info.json").is_file() and list((out / "logs" / "tensorboard").iterdir())
        assert (out / "logs" / "metrics.jsonl").read_text().count("\n") >= 2
    screen = done.stdout
    assert re.search(r"step \d+/\d+ \| epoch \S+ \| loss \S+ \| lr \S+ \| \S+ s/step", screen)   # SFT's lines
    assert re.search(r"step 10/10 \| epoch \S+ \| loss \S+ \| reward \S+ ± \S+ \| lr \S+ \| \S+ s/step", screen)   # GRPO's
    assert re.search(r"step 10/10 \| eval/reward \S+ \| eval/rewards/accuracy \S+", screen)
    assert screen.rstrip().splitlines()[-1] == "saved HF model to out/grpo/model"
    assert (tmp_path / ".cache" / "coati" / "prepared").is_dir()   # raw JSONL prepared into the user's cache
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = run / "out" / "grpo" / "model"   # what a user does next, with Hugging Face's own calls
    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    question = [{"role": "user", "content": "Sam has 2 apples and gets 3 more. How many apples does Sam have?"}]
    inputs = tokenizer.apply_chat_template(question, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert set(inputs) == {"input_ids", "attention_mask"}
    assert model.generate(**inputs, max_new_tokens=4, min_new_tokens=1).shape[1] > inputs["input_ids"].shape[1]
