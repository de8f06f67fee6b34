"""A Hugging Face model id where a model folder is expected, resolved from the local HF cache as
`from_pretrained` resolves it."""
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, SCRIPTS, child_env


def _python(script, *args, env):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600,
                          env=child_env(**env), cwd=REPO)


@pytest.mark.slow
def test_pretrain_takes_a_model_id_from_the_local_hugging_face_cache(tiny_assets, tmp_path):
    """`--pretrain org/name` resolves like `from_pretrained`: here from a cache in a temporary HF_HOME, offline."""
    repo = tmp_path / "hf" / "hub" / "models--coati-test--tiny"
    shutil.copytree(tiny_assets["model"], repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = _python(SCRIPTS / "train_sft.py", "--pretrain", "coati-test/tiny", "--dataset", str(tiny_assets["sft_train"]),
                     "--max_steps", "1", "--output_dir", str(tmp_path / "out"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "out" / "model" / "config.json").is_file()
    result = _python(SCRIPTS / "train_sft.py", "--pretrain", "coati-test/absent", "--dataset",
                     str(tiny_assets["sft_train"]), env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: --pretrain coati-test/absent is neither a directory nor a model in the Hugging Face cache")
