"""Plugin selection: CUDA-only plugins are refused on a CPU machine with one line and exit status 2."""
import argparse
import re
import subprocess
import sys

import pytest
import torch

from coati.cli.options import add_settings, settings_from
from coati.config import PluginConfig
from coati.distributed.plugins import CUDA_ONLY, PLUGINS, build_booster, check_plugin_available
from coati.utils import CoatiUsageError
from conftest import REPO, SCRIPTS, child_env

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_settings(parser, PluginConfig)
    return parser.parse_args(list(argv))


def test_every_plugin_is_offered():
    assert set(PLUGINS) == {"ddp", "zero2", "zero2_cpu", "gemini", "gemini_auto", "3d"}
    assert CUDA_ONLY == set(PLUGINS) - {"ddp"}


@needs_no_cuda
@pytest.mark.parametrize("name", sorted(CUDA_ONLY))
def test_cuda_only_plugins_are_refused_on_cpu(name):
    with pytest.raises(CoatiUsageError, match=f"--plugin {name} needs CUDA GPUs .* use --plugin ddp"):
        check_plugin_available(name)


@needs_no_cuda
def test_gemini_on_cpu_exits_2_with_one_line_before_loading_anything(tiny_assets):
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "train_sft.py"), "--pretrain", str(tiny_assets["model"]), "--dataset",
         str(tiny_assets["sft_train"]), "--plugin", "gemini"],
        capture_output=True, text=True, cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --plugin gemini needs CUDA GPUs and this machine has none; use --plugin ddp to train on the CPU")
    assert "Traceback" not in result.stderr


def test_parallel_sizes_only_apply_to_3d(world_of_one):
    with pytest.raises(CoatiUsageError, match="apply to --plugin 3d only"):
        build_booster(settings_from(_args("--plugin", "ddp", "--tp", "2"), PluginConfig))


def test_ddp_booster_clips_in_the_trainer_and_uses_fp32_on_cpu(world_of_one):
    setup = build_booster(settings_from(_args("--plugin", "ddp", "--mixed_precision", "fp32", "--grad_clip", "0.5"), PluginConfig))
    assert setup.trainer_clips_grad and setup.grad_clip == 0.5
    assert setup.precision == "fp32"


def test_a_refused_plugin_is_the_only_line_printed_even_with_python_warnings_on(tiny_assets):
    """What a user sees, with Python's default warning filters: no third-party import notes before our line."""
    env = {k: v for k, v in child_env().items() if k != "PYTHONWARNINGS"}
    result = subprocess.run([sys.executable, str(SCRIPTS / "train_rm.py"), "--pretrain", str(tiny_assets["model"]),
                             "--dataset", str(tiny_assets["pref_train"]), "--plugin", "gemini"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        "error: --plugin gemini needs CUDA GPUs and this machine has none; use --plugin ddp to train on the CPU"]


@pytest.mark.parametrize("trainer", ["kto", "ppo", "grpo"])
def test_gemini_auto_is_refused_where_the_first_forward_has_no_gradients(trainer):
    """Gemini's automatic placement traces memory over a first iteration that must begin with a training forward
    (seen on an H200: colossalai's `You should run a completed iteration as your warmup iter`)."""
    from coati.distributed.plugins import check_first_forward
    from coati.trainer import KTOTrainer, OLTrainer

    first = (KTOTrainer if trainer == "kto" else OLTrainer).no_grad_forward_first
    with pytest.raises(CoatiUsageError, match=f"gemini_auto .* runs {re.escape(first)} first; use --plugin gemini"):
        check_first_forward("gemini_auto", first)
    check_first_forward("gemini", first)


def test_gemini_auto_is_kept_for_trainers_that_begin_with_a_training_forward():
    from coati.distributed.plugins import check_first_forward
    from coati.trainer import DPOTrainer, ORPOTrainer, RewardModelTrainer, SFTTrainer

    for trainer in (SFTTrainer, RewardModelTrainer, DPOTrainer, ORPOTrainer):
        assert trainer.no_grad_forward_first is None
        check_first_forward("gemini_auto", trainer.no_grad_forward_first)


def test_3d_shards_a_token_classification_critic_by_its_backbone_policy():
    """shardformer has no policy for `LlamaForTokenClassification` (PPO's critic): its backbone's is used."""
    from colossalai.shardformer.policies.llama import LlamaModelPolicy
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

    from coati.distributed.plugins import shard_policy

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=1)
    assert isinstance(shard_policy(LlamaForTokenClassification(config)), LlamaModelPolicy)
    assert shard_policy(LlamaForCausalLM(config)) is None


def test_the_gpu_check_prints_every_case_in_one_table(tmp_path):
    """`tests/gpu/table.py` puts every case of `tests/e2e/test_cuda_plugins.py` in a cell of its (check, plugin) table,
    as pass, FAIL or skip with its seconds."""
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "tests/e2e/test_cuda_plugins.py"], capture_output=True, text=True, cwd=REPO, env=child_env())
    names = [line.split("::")[1] for line in collected.stdout.splitlines() if "::" in line]
    assert len(names) > 50, collected.stdout[-2000:]
    outcomes = {"test_trainer_on_plugin_trains_checkpoints_exports_and_resumes[sft-zero2]": '<failure message="x"/>',
                "test_lora_on_plugin_trains_and_exports_the_adapter[grpo-3d]": ""}
    cases = "".join(f'<testcase classname="tests.test_cuda_plugins" name="{name}" time="41.4">'
                    f'{outcomes.get(name, "<skipped/>")}</testcase>' for name in names)
    junit = tmp_path / "junit.xml"
    junit.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    table = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "table.py"), str(junit)], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert table[0] == "| check | ddp | zero2 | zero2_cpu | gemini | gemini_auto | 3d |"
    assert "| sft | skip 41s | FAIL 41s | skip 41s | skip 41s | skip 41s | skip 41s |" in table
    assert "| grpo, LoRA | skip 41s | skip 41s | skip 41s | skip 41s |  | pass 41s |" in table
    assert "| grpo, packed | skip 41s | skip 41s | skip 41s | skip 41s |  | skip 41s |" in table
    assert "| tools, grpo, images | skip 41s | skip 41s |  |  |  |  |" in table
    assert table[-1] == f"1 pass, 1 FAIL, {len(names) - 2} skip"


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where there is no GPU")
def test_a_launch_refuses_a_cuda_plugin_once_before_starting_any_process(tiny_assets):
    """`coati ... --nproc_per_node 2 --plugin zero2` on a CPU: one line and status 2 from the launcher itself, not the
    line on every rank under torchrun's failure report (and its status 1)."""
    result = subprocess.run([sys.executable, "-m", "coati.cli.main", "sft", "--pretrain", str(tiny_assets["model"]),
                             "--dataset", str(tiny_assets["sft_train"]), "--plugin", "zero2", "--nproc_per_node", "2"],
                            capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=120)
    assert result.returncode == 2
    assert (result.stdout + result.stderr).strip().splitlines() == [
        "error: --plugin zero2 needs CUDA GPUs and this machine has none; use --plugin ddp to train on the CPU"]
