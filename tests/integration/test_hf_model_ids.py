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


@pytest.mark.slow
def test_dataset_name_takes_a_dataset_id_from_the_local_hugging_face_cache(tiny_assets, tmp_path):
    """`dataset_name: org/name` (TRL's usual value) resolves to the dataset's snapshot in the HF cache, here offline,
    and its files are read by split (`data/train-*.parquet`, `data/test-*.parquet`) as TRL's load_dataset reads them."""
    from datasets import Dataset

    from coati.dataset.demo_data import generate_problems, sft_records

    snapshot = tmp_path / "hf" / "hub" / "datasets--coati-test--math" / "snapshots" / "0123abc"
    (snapshot / "data").mkdir(parents=True)
    for split, n in (("train", 32), ("test", 8)):
        Dataset.from_list(sft_records(generate_problems(n, "eval" if split == "test" else split))).to_parquet(
            str(snapshot / "data" / f"{split}-00000-of-00001.parquet"))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abc")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "COATI_CACHE": str(tmp_path / "prepared")}
    result = _python(SCRIPTS / "train_sft.py", "--pretrain", str(tiny_assets["model"]), "--dataset_name",
                     "coati-test/math", "--dataset_test_split", "test", "--max_steps", "1", "--batch_size", "4",
                     "--output_dir", str(tmp_path / "out"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "32 of 32 rows kept" in said and "8 of 8 rows kept" in said


def test_a_dataset_id_in_no_cache_is_one_line_and_a_data_file_name_is_never_an_id(monkeypatch, tmp_path):
    from coati.utils.errors import CoatiUsageError
    from coati.utils.file_checks import resolve_dataset_id

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CoatiUsageError, match="--dataset coati-test/absent is neither a directory nor a dataset in the "
                                              "Hugging Face cache .*HF_HUB_OFFLINE is set"):
        resolve_dataset_id("coati-test/absent", "--dataset")
    assert resolve_dataset_id("data/missing.jsonl", "--dataset") == "data/missing.jsonl"   # left to the path check
