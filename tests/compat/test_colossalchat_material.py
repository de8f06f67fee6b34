"""ColossalChat's own material run against coati, as a ColossalChat user would (tests/colossalchat/NOTICE.md): its
data preparation and templating scripts as written, in a folder laid out as ColossalChat's, with a local model for
the hub ids; the training commands of its test_train.sh, launched with `colossalai run` as there, `--plugin ddp`."""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, SCRIPTS, child_env

CC = REPO / "tests" / "colossalchat"
HUB_IDS = ("hf-internal-testing/llama-tokenizer", "hpcai-tech/Colossal-LLaMA-2-7b-base", "THUDM/chatglm3-6b",
           "deepseek-ai/DeepSeek-V2-Lite", "01-ai/Yi-1.5-9B-Chat")
DATA_TYPES = ("sft", "preference", "prompt", "prompt_rlvr", "kto")


@pytest.fixture(scope="module")
def llama_like(tmp_path_factory) -> Path:
    """The local stand-in for the llama tokenizer and model the scripts name: a BPE trained on ColossalChat's test
    text, with a BOS token as llama's has (its templates render `bos_token`), and a tiny random Llama."""
    from coati.dataset.demo_data import tokenizer_corpus
    from coati.models.tiny import build_tiny_llama, train_tokenizer

    texts = [p.read_text() for p in sorted(CC.rglob("*.jsonl"))] + [(CC / "generate_dummy_datasets_for_testing.py").read_text()]
    tokenizer = train_tokenizer([*tokenizer_corpus(400), *texts], vocab_size=1024)
    tokenizer.add_special_tokens({"bos_token": "<s>"})
    out = tmp_path_factory.mktemp("llama_like")
    build_tiny_llama(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory, llama_like) -> Path:
    """ColossalChat's layout: `tests/` (its scripts, hub ids replaced by the local model), `conversation_template/`,
    and `examples/` being coati's."""
    base = tmp_path_factory.mktemp("ColossalChat")
    shutil.copytree(CC, base / "tests", ignore=shutil.ignore_patterns("conversation_template", "LICENSE", "NOTICE.md"))
    shutil.copytree(CC / "conversation_template", base / "conversation_template")
    (base / "examples").symlink_to(REPO / "examples")
    for script in (base / "tests").glob("*.sh"):
        text = script.read_text()
        for hub_id in HUB_IDS:
            text = text.replace(f'"{hub_id}"', f'"{llama_like}"')
        script.write_text(text)
    return base


def _bash(tree: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["bash", str(tree / "tests" / script)], capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL, env=child_env(PATH=path, **env), cwd=tree)


@pytest.fixture(scope="module")
def prepared(tree) -> Path:
    """ColossalChat's test_data_preparation.sh as written: raw data made by its own generator, then five
    preparations (3,003 rows each, at most 100 kept, one part) into `temp/rlhf_data`."""
    raw = {kind: tree / "raw" / kind for kind in DATA_TYPES}
    for folder in raw.values():
        folder.mkdir(parents=True)
    result = _bash(tree, "test_data_preparation.sh", SFT_DATASET=str(raw["sft"]), PROMPT_DATASET=str(raw["prompt"]),
                   PROMPT_RLVR_DATASET=str(raw["prompt_rlvr"]), PREFERENCE_DATASET=str(raw["preference"]),
                   KTO_DATASET=str(raw["kto"]))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return tree / "temp" / "rlhf_data"


@pytest.mark.slow
def test_data_preparation_script_writes_colossalchat_parts(prepared):
    from coati.dataset import load_prepared

    for kind in DATA_TYPES:
        arrow = prepared / f"tokenized_llama_{kind}" / "arrow"
        assert sorted(p.name for p in arrow.iterdir() if p.is_dir()) == ["part-00000"]
        assert len(load_prepared([arrow / "part-00000"])) == 100            # --num_samples_per_datafile 100
        assert (prepared / f"tokenized_llama_{kind}" / "jsonl" / "part-00000.jsonl").is_file()


@pytest.mark.slow
@pytest.mark.extended
def test_templating_script_passes_colossalchat_label_checks(tree):
    """Five templates x SFT, preference and KTO data, each checked by ColossalChat's verify_chat_data.py."""
    result = _bash(tree, "test_templating.sh")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert result.stdout.count("prepared ") == 15 and "Failed" not in result.stdout


LORA = str(REPO / "examples" / "training_scripts" / "lora_config.json")
SUPERVISED = {
    "sft": ("sft", ["--save_path", "{save}", "--config_file", "{config}", "--lora_config", LORA, "--plugin", "ddp",
                    "--batch_size", "2", "--max_epochs", "1", "--accumulation_steps", "2", "--tp", "1", "--pp", "1",
                    "--zero_stage", "0", "--sp", "1", "--sp_mode", "split_gather", "--lr", "2e-5",
                    "--grad_checkpoint", "--max_len", "400", "--use_flash_attn"]),
    "rm": ("preference", []), "dpo": ("preference", []), "orpo": ("preference", []),
    "kto": ("kto", ["--auto_weight", "--desirable_weight", "1.2"]),
}
"""test_train.sh's zero2 commands (the LoRA config is passed with zero2), --plugin swapped to ddp."""


def _supervised_argv(script: str, data: Path, model: Path, save: Path) -> list:
    kind, extra = SUPERVISED[script]
    dataset = str(data / f"tokenized_llama_{kind}" / "arrow" / "part-00000")
    common = ["--pretrain", str(model), "--tokenizer_dir", str(model), "--dataset", dataset]
    if script == "sft":
        return [*common, "--eval_dataset", dataset, *[a.format(save=save, config=save.parent / "models_config" /
                                                             "config.jsonl") for a in extra]]
    return [*common, "--eval_dataset", dataset, "--save_dir", str(save), "--config_file",
            str(save.parent / "models_config" / "config.jsonl"), "--lora_config", LORA, "--plugin", "ddp",
            "--batch_size", "2", "--max_epochs", "1", "--accumulation_steps", "2", "--tp", "1", "--lr", "2e-5",
            *extra, "--grad_checkpoint", "--max_len", "400", "--use_flash_attn"]


def _on_policy_argv(script: str, reward: str, data: Path, model: Path, save: Path, tree: Path) -> list:
    """test_train.sh's GRPO and PPO commands ('nn': a neural reward model; 'vr': gsm8k_reward_fn), the stray blank
    argument of its GRPO command included (`colossalai run` joins the arguments into one shell line, which drops
    it; `test_a_blank_argument_is_dropped_with_a_warning` covers a direct launch)."""
    prompts = data / f"tokenized_llama_{'prompt_rlvr' if reward == 'vr' else 'prompt'}" / "arrow" / "part-00000"
    ptx = data / "tokenized_llama_sft" / "arrow" / "part-00000"
    grpo = script == "grpo"
    reward_model = [] if grpo and reward == "vr" else ["--rm_pretrain", str(model)]
    argv = ["--pretrain", str(model), *reward_model, "--tokenizer_dir", str(model), "--conversation_template_config",
            str(tree / "tests" / "llama.json"), "--prompt_dataset", str(prompts), "--ptx_dataset", str(ptx),
            "--ptx_batch_size", "1", *(["--num_generations", "2"] if grpo else []), "--ptx_coef", "0.2",
            "--save_path", str(save), "--lora_config", LORA, "--plugin", "ddp", "--num_episodes", "5",
            "--num_collect_steps", "1", "--num_update_steps", "1", "--experience_batch_size", "1" if grpo else "2",
            "--train_batch_size", "2", "--accumulation_steps", "2", "--lr", "9e-6", "--mixed_precision", "bf16",
            "--grad_clip", "1.0", "--tp", "1", "--lr", "2e-5", "--grad_checkpoint",
            "--max_len", "200" if grpo else "400", *([" "] if grpo else []), "--max_seq_len", "10"]
    if reward == "vr":
        argv += ["--reward_functions", "gsm8k_reward_fn", *([] if grpo else ["--no_neural_reward_model"])]
    return argv


IN_CI = ("sft", "grpo-vr")
"""One supervised and one on-policy command run in `make test`; the rest in `make test-extended`."""
COMMANDS = [pytest.param(c, marks=() if c in IN_CI else pytest.mark.extended)
            for c in [*SUPERVISED, "grpo-nn", "grpo-vr", "ppo-nn", "ppo-vr"]]


def _free_port() -> int:
    """A port for the run's rendezvous (ColossalChat's commands pin 31332, which a run left over would hold)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_colossalchat_training_command_runs_with_ddp(command, prepared, llama_like, tree, tmp_path):
    script, _, reward = command.partition("-")
    save = tmp_path / "rlhf_models"
    argv = (_on_policy_argv(script, reward, prepared, llama_like, save, tree) if reward
            else _supervised_argv(script, prepared, llama_like, save))
    launcher = [str(Path(sys.executable).parent / "colossalai"), "run", "--nproc_per_node", "2", "--master_port",
                str(_free_port())]
    result = subprocess.run([*launcher, str(SCRIPTS / f"train_{script}.py"), *argv], capture_output=True, text=True,
                            timeout=900, env=child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"),
                            cwd=tree)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert (save / "modeling" / "config.json").is_file()                    # the final model where ColossalChat puts it
    assert (tmp_path / "models_config" / "config.jsonl").is_file() or reward


def test_colossalchat_lora_config_is_taken_whole(world_of_one, tiny_assets):
    """PiSSA and an adapted embedding (ColossalChat's shipped lora_config.json) through the booster:
    the adapted model computes what the plain one does until it trains, and merges back into a plain model."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import TorchDDPPlugin
    from transformers import AutoModelForCausalLM

    from coati.models.lora import LoraConfig, enable_lora, export_adapter_and_merge

    config = LoraConfig.from_file(LORA)
    assert (config.peft_bias, config.peft_init) == ("all", "pissa") and "embed_tokens" in config.target_modules
    plain = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    adapted = enable_lora(booster, plugin, "ddp", model, 8, config.lora_alpha, 0.0, config.target_modules,
                          config.peft_bias, config.peft_init)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    assert torch.allclose(adapted(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-4)
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert any("embed_tokens.lora_embedding_A" in n for n in trainable)
    assert export_adapter_and_merge(booster, adapted, "unused") is None     # PiSSA: no adapter-only export
    assert torch.allclose(adapted.get_base_model()(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-4)
