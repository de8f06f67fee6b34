"""The memory estimate (`coati.distributed.memory`): model shapes read from the folder as the loaded model has them,
LoRA's trainable count as peft makes it, each plugin's model states by its formula, and the refusal and warning."""
import os
import shutil

import pytest

from coati.config import LoraSettings, PluginConfig
from coati.distributed.memory import (GIB, Capacity, MemoryEstimate, activation_bytes, check_memory, model_shape,
                                      state_bytes)
from coati.utils.errors import CoatiUsageError
from coati.utils.file_checks import read_json


@pytest.fixture(scope="module")
def tiny_model(tiny_assets):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_assets["model"])


def _shape(folder, lora=LoraSettings()):
    return model_shape(str(folder), read_json(folder / "config.json", "config"), lora)


def test_shape_counts_the_parameters_the_model_loads_with(tiny_assets, tiny_model, tmp_path):
    loaded = sum(p.numel() for p in tiny_model.parameters())
    assert _shape(tiny_assets["model"]).params == loaded
    as_bin = tmp_path / "bin_model"   # no safetensors header: the count comes from the config's widths
    shutil.copytree(tiny_assets["model"], as_bin, ignore=shutil.ignore_patterns("model.safetensors"))
    tiny_model.save_pretrained(as_bin, safe_serialization=False)
    assert (as_bin / "pytorch_model.bin").is_file() and _shape(as_bin).params == loaded


def test_lora_count_is_what_peft_trains(tiny_assets, tiny_model):
    from peft import LoraConfig, get_peft_model

    for targets in (("all-linear",), ("q_proj", "v_proj")):
        names = "all-linear" if "all-linear" in targets else list(targets)
        peft_model = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=names))
        trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        peft_model.unload()
        shape = _shape(tiny_assets["model"], LoraSettings(lora_rank=4, lora_target_modules=targets))
        assert shape.lora_params == trained and shape.trainable(4) == trained and shape.trainable(0) == shape.params


P, T = 1000, 100


@pytest.mark.parametrize("parallel, half, device, host", [
    (PluginConfig("ddp"), 4, 4 * P + 8 * T + 8 * T, 0),                       # fp32 on the CPU; DDP's buckets
    (PluginConfig("ddp"), 2, 6 * P + 8 * T + 8 * T, 0),                       # + the autocast's bf16 copies
    (PluginConfig("zero2"), 2, 2 * P + (2 + 4 + 8) * T / 4, 0),
    (PluginConfig("zero2_cpu"), 2, 2 * P + 2 * T / 4, (4 + 4 + 8) * T / 4),
    (PluginConfig("gemini"), 2, (2 * P + 4 * T + 2 * T + 8 * T) / 4, 0),
    (PluginConfig("3d", tp=2), 2, (2 * P + (2 + 12) * T) / 2, 0),
    (PluginConfig("3d", tp=2, zero_stage=1, zero_cpu_offload=True), 2, (2 * P + 2 * T) / 2, 12 * T / 2 / 2),
])
def test_model_states_per_plugin(parallel, half, device, host):
    on_device, offloaded = state_bytes(P, T, parallel, half, world_size=4)
    assert sum(on_device.values()) == pytest.approx(device) and sum(offloaded.values()) == pytest.approx(host)


def test_activations_and_logits(tiny_assets):
    shape = _shape(tiny_assets["model"])
    full = activation_bytes(shape, 512, grad_checkpoint=False, half=2)
    per_layer = 22 * shape.hidden + 6 * shape.kv_width + 8 * shape.intermediate   # bf16 values, fp32 norm copies
    assert full["activations"] == 512 * shape.layers * per_layer and full["logits"] == 512 * shape.vocab * 4
    kept = activation_bytes(shape, 512, grad_checkpoint=True, half=2)
    assert kept["activations"] == 512 * (shape.layers * 2 * shape.hidden + per_layer) < full["activations"]
    fp32 = activation_bytes(shape, 512, grad_checkpoint=False, half=4)
    per_layer = 4 * (7 * shape.hidden + 3 * shape.kv_width + 4 * shape.intermediate)
    assert fp32["activations"] == 512 * shape.layers * per_layer and fp32["logits"] == 512 * shape.vocab * 8


def _estimate(states_gib, activations_gib=0.0, host_gib=0.0):
    third = states_gib * GIB / 3
    return MemoryEstimate({"weights": third, "gradients": third, "optimizer states": third,
                           "activations": activations_gib * GIB}, {"optimizer states": host_gib * GIB}, tokens=4096)


def test_states_that_cannot_fit_are_refused_with_the_estimate():
    with pytest.raises(CoatiUsageError, match=r"^this run cannot fit: before any activation it needs about 30.0 GiB per "
                                              r"process \(weights 10.0, gradients 10.0, optimizer states 10.0 GiB, "
                                              r"estimated for --plugin ddp before loading\) and each process has 12.0 "
                                              r"GiB, its share of the 24.0 GiB of CPU memory available to 2 processes; "
                                              r"this machine's memory cannot hold it: train LoRA adapters only "
                                              r"\(--lora_rank 16\).*; or --no_memory_check to start anyway$"):
        check_memory(_estimate(30), Capacity(None, 24 * GIB, 2), PluginConfig("ddp"), lora_rank=0)
    with pytest.raises(CoatiUsageError, match="30.0 GiB free on its GPU; train LoRA"):
        check_memory(_estimate(60), Capacity(30 * GIB, 500 * GIB, 8), PluginConfig("zero2"), lora_rank=0)
    with pytest.raises(CoatiUsageError, match=r"needs about 100.0 GiB .* for what --plugin zero2_cpu offloads; more GPUs"):
        check_memory(_estimate(9, host_gib=100), Capacity(30 * GIB, 400 * GIB, 8), PluginConfig("zero2_cpu"), 16)


def test_weights_that_alone_cannot_fit_are_told_to_be_sharded():
    weights = MemoryEstimate({"weights": 100 * GIB, "gradients": 1 * GIB, "optimizer states": 2 * GIB})
    with pytest.raises(CoatiUsageError, match=r"the weights alone need 100.0 GiB; shard them over GPUs \(--plugin "
                                              r"gemini or gemini_auto, or --plugin 3d --tp N\); or --no_memory_check"):
        check_memory(weights, Capacity(79 * GIB, 500 * GIB, 8), PluginConfig("zero2"), lora_rank=16)


def test_gemini_auto_may_use_gpu_and_cpu_memory_together(capsys):
    check_memory(_estimate(60), Capacity(40 * GIB, 200 * GIB, 8), PluginConfig("gemini_auto"), lora_rank=0)
    with pytest.raises(CoatiUsageError, match="40.0 GiB free on its GPU and 10.0 GiB, its share"):
        check_memory(_estimate(60), Capacity(40 * GIB, 80 * GIB, 8), PluginConfig("gemini_auto"), lora_rank=0)


def test_activations_that_may_not_fit_are_a_warning(capsys):
    check_memory(_estimate(20, activations_gib=5), Capacity(30 * GIB, 100 * GIB, 1), PluginConfig("zero2"), 0)
    assert capsys.readouterr().err == ""
    check_memory(_estimate(20, activations_gib=15), Capacity(30 * GIB, 100 * GIB, 1), PluginConfig("zero2"), 0)
    assert capsys.readouterr().err.startswith(
        "warning: this run may not fit: about 35.0 GiB per process (weights 6.7, gradients 6.7, optimizer states 6.7, "
        "activations 15.0 GiB; activations for 4096 tokens a micro-batch) and each process has 30.0 GiB free on its "
        "GPU; --grad_checkpoint, a smaller --batch_size or --max_length lower the activations")


def _run(command, *argv):
    from coati.cli.arguments import run_config_from
    from coati.cli.commands import command_parser

    parser = command_parser(command)
    return run_config_from(parser.parse_args(list(argv)), parser.run_config)


def test_micro_batch_tokens_read_the_cut_and_the_datas_longest_row(tiny_assets):
    from coati.dataset.prepare import load_prepared
    from coati.dataset.sampler import longest_sequence
    from coati.distributed.memory import micro_batch_tokens

    model, sft = str(tiny_assets["model"]), str(tiny_assets["sft_train"])
    longest = longest_sequence(load_prepared([sft]))
    assert 0 < longest <= 128   # prepared at 128 tokens
    plain = _run("sft", "--pretrain", model, "--dataset", sft, "--batch_size", "3")
    assert micro_batch_tokens(plain, longest) == 3 * longest and micro_batch_tokens(plain, 0) == 3 * 2048
    cut = _run("dpo", "--pretrain", model, "--dataset", sft, "--batch_size", "3", "--max_length", "40")
    assert micro_batch_tokens(cut, longest) == 2 * 3 * 40
    packed = _run("sft", "--pretrain", model, "--dataset", sft, "--packing", "--max_tokens_per_batch", "500")
    assert micro_batch_tokens(packed, longest) == 500
    grpo = _run("grpo", "--pretrain", model, "--prompt_dataset", sft, "--reward_fn", "math_answer", "--batch_size", "2",
                "--num_generations", "4", "--max_new_tokens", "16")
    assert micro_batch_tokens(grpo, 60) == 2 * 4 * (60 + 16)
    assert micro_batch_tokens(_with_train_batch(grpo, 3), 60) == 3 * (60 + 16)


def _with_train_batch(run, rows):
    """`run` with `--train_batch_size rows`."""
    from dataclasses import replace

    return replace(run, algorithm=replace(run.algorithm, train_batch_size=rows))


def test_before_a_launch_the_gpus_the_processes_will_take_are_read_with_nvidia_smi(tmp_path, monkeypatch):
    """The launcher reads free memory without a CUDA context: from `nvidia-smi`, on the first N GPUs this process
    sees (`CUDA_VISIBLE_DEVICES` by index or UUID), so a full GPU that the run will not use does not refuse it."""
    from coati.distributed.memory import _least_free_gpu

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-aaa, 81000'\necho '1, GPU-bbb, 12'\necho '2, GPU-ccc, 40000'\n"
                   "echo '3, GPU-ddd, 80000'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _least_free_gpu(1) == 81000 * 2**20 and _least_free_gpu(4) == 12 * 2**20
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-ccc")
    assert _least_free_gpu(1) == 80000 * 2**20 and _least_free_gpu(2) == 40000 * 2**20
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert _least_free_gpu(2) is None


def test_no_memory_check_starts_a_run_the_estimate_refuses(tiny_assets, tmp_path):
    """A 70B-shaped config (no weights: its shapes come from the config) is refused, and with --no_memory_check
    passes the check."""
    from transformers import LlamaConfig

    from coati.distributed.memory import check_run_memory

    LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8).save_pretrained(tmp_path)
    flags = ("--pretrain", str(tmp_path), "--dataset", str(tiny_assets["sft_train"]))
    with pytest.raises(CoatiUsageError, match="^this run cannot fit: .*; or --no_memory_check to start anyway$"):
        check_run_memory(_run("sft", *flags))
    assert check_run_memory(_run("sft", *flags, "--no_memory_check")) is None
