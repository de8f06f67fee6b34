"""A sweep of bad inputs a new user gives: flags out of range, wrong paths, broken models, checkpoints and data
files. Each must end with exit status 2 and our one `error:` line before anything is loaded: no traceback,
no hang. Every case runs in-process through the script's `main` (the code path of the command line); a
sample of them also runs as a real process under plain `python` and under `torchrun`, where torchrun's
failure summary must name our error."""
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import HISTORY_REWRITING, REPO, SCRIPTS, checkpoint_names, child_env, torchrun
from support import run_main

PREPARE = REPO / "examples" / "data_preparation_scripts" / "prepare_dataset.py"


@lru_cache(maxsize=None)
def _script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bad(tiny_assets, tmp_path_factory):
    """The good assets plus broken ones: paths by name."""
    from coati.models.tiny import write_tiny_model
    from coati.dataset.demo_data import tokenizer_corpus

    root = tmp_path_factory.mktemp("bad")
    paths = {k: str(v) for k, v in tiny_assets.items()}
    paths["sft_train_raw"] = str(Path(tiny_assets["sft_train"]).parent / "sft_train.jsonl")
    (root / "empty").mkdir()
    paths["empty"] = str(root / "empty")
    (root / "a_file").write_text("not a directory\n")
    paths["file"] = str(root / "a_file")
    truncated = root / "truncated_model"
    shutil.copytree(tiny_assets["model"], truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    paths["truncated_model"] = str(truncated)
    bad_config = root / "bad_config_model"
    shutil.copytree(tiny_assets["model"], bad_config)
    (bad_config / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,\n')
    paths["bad_config_model"] = str(bad_config)
    no_weights = root / "no_weights_model"
    shutil.copytree(tiny_assets["model"], no_weights)
    (no_weights / "model.safetensors").unlink()
    paths["no_weights_model"] = str(no_weights)
    (root / "bad_rubric.txt").write_text("Grade {answer}: {completion}\n")
    paths["bad_rubric"] = str(root / "bad_rubric.txt")
    paths["other_vocab_model"] = str(write_tiny_model(root / "other_vocab_model", tokenizer_corpus(400), vocab_size=300))
    paths["small_model"] = str(write_tiny_model(root / "small_model", tokenizer_corpus(400), size="small"))
    paths.update(_checkpoints(root, tiny_assets))
    paths.update(_raw_files(root, tiny_assets))
    paths.update(_agent_assets(root, tiny_assets))
    paths["model_70b"] = sparse_model(root / "model_70b", tiny_assets["model"], SHAPE_70B)
    return paths


SHAPE_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8}
"""Llama-2-70B's widths (69 billion parameters at the tiny model's vocabulary): more than any machine's memory
holds in fp32, so that the refusal does not depend on the machine running the test."""


def sparse_model(folder: Path, tiny_model: str, widths: dict) -> str:
    """The tiny model's tokenizer and config at `widths`, with a bf16 safetensors file whose header declares every
    weight of that shape and whose size is theirs, but sparse: on disk it takes a few kB, and nothing can read it
    without noticing. What a large model looks like to every check made before loading."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.copytree(tiny_model, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    config = AutoConfig.from_pretrained(folder)
    for name, value in widths.items():
        setattr(config, name, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.save_pretrained(folder)
    with torch.device("meta"):
        state = AutoModelForCausalLM.from_config(config).state_dict()
    header, offset = {}, 0
    for name, tensor in state.items():
        size = tensor.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        f.truncate(8 + len(head) + offset)
    return str(folder)


def _agent_assets(root: Path, assets) -> dict:
    """A model whose chat template cannot show tools, and prompts whose `tools` column names a tool nobody made."""
    from coati.dataset.prepare import load_prepared

    plain = root / "no_tools_template_model"
    shutil.copytree(assets["model"], plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    rewriting = root / "history_rewriting_template_model"   # drops earlier turns' reasoning, as R1-style ones do
    shutil.copytree(assets["model"], rewriting)
    config["chat_template"] = HISTORY_REWRITING
    (rewriting / "tokenizer_config.json").write_text(json.dumps(config))
    rows = load_prepared([assets["prompt_train"]], "prompt").select(range(4))
    rows.add_column("tools", ['[{"type": "function", "function": {"name": "search"}}]'] * 4).save_to_disk(
        root / "prompts_unknown_tool")
    return {"no_tools_template_model": str(plain), "prompts_unknown_tool": str(root / "prompts_unknown_tool"),
            "history_rewriting_template_model": str(rewriting)}


def _checkpoints(root: Path, assets) -> dict:
    """A complete checkpoint of the tiny model, one of another size, a truncated and an incomplete copy."""
    result = torchrun(SCRIPTS / "train_sft.py", 1, "--pretrain", str(assets["model"]), "--dataset",
                      str(assets["sft_train"]), "--batch_size", "16", "--max_steps", "1", "--save_dir",
                      str(root / "ckpt"), "--plugin", "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    good = root / "ckpt" / checkpoint_names(root / "ckpt")[0]
    other = root / "other_size_run"
    result = torchrun(SCRIPTS / "train_sft.py", 1, "--pretrain", str(root / "small_model"), "--dataset",
                      str(assets["sft_train"]), "--batch_size", "16", "--max_steps", "1", "--save_dir", str(other),
                      "--plugin", "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    truncated = root / "ckpt_truncated" / good.name
    shutil.copytree(good, truncated)
    optimizer = truncated / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    incomplete = root / "ckpt_incomplete" / good.name
    shutil.copytree(good, incomplete)
    (incomplete / "COMPLETE").unlink()
    return {"ckpt": str(good), "ckpt_dir": str(root / "ckpt"), "ckpt_other_size": str(other / checkpoint_names(other)[0]),
            "ckpt_truncated": str(truncated), "ckpt_incomplete": str(incomplete)}


def _raw_files(root: Path, assets) -> dict:
    raw = {"binary": root / "binary.jsonl", "latin1": root / "latin1.jsonl", "malformed": root / "malformed.jsonl",
           "missing_field": root / "missing_field.jsonl", "template_bad_json": root / "template.json",
           "template_no_field": root / "template_no_field.json", "prm_no_labels": root / "prm_no_labels.jsonl"}
    raw["binary"].write_bytes(bytes(range(256)) * 4)
    raw["latin1"].write_bytes('{"messages": [{"role": "user", "content": "caf\xe9"}]}\n'.encode("latin-1"))
    raw["malformed"].write_text('{"messages": [}\n')
    raw["missing_field"].write_text('{"msgs": []}\n')
    raw["template_bad_json"].write_text('{"chat_template": "{{ x }}",\n "end_of_turn_token": }\n')
    raw["template_no_field"].write_text('{"chat_template": 5, "end_of_turn_token": "</s>"}\n')
    raw["prm_no_labels"].write_text('{"prompt": "1 + 1?", "completions": ["1 + 1 = 2.", "#### 2"]}\n')
    (root / "raw_dir").mkdir()
    (root / "raw_dir" / "notes.xyz").write_text("no data here\n")
    paths = {k: str(v) for k, v in raw.items()}
    paths["raw_dir"] = str(root / "raw_dir")
    return paths


def _sft(p, *extra):
    return ("train_sft", ["--pretrain", p["model"], "--dataset", p["sft_train"], *extra])


def _grpo(p, *extra):
    return ("train_grpo", ["--pretrain", p["model"], "--prompt_dataset", p["prompt_train"],
                           "--reward_fn", "math_answer", *extra])


def _ppo(p, *extra):
    return ("train_ppo", ["--pretrain", p["model"], "--prompt_dataset", p["prompt_train"], "--reward_fn", "math_answer",
                          *extra])


def _pref(script, p, *extra):
    return (script, ["--pretrain", p["model"], "--dataset", p["pref_train"], *extra])


def _prep(p, *extra, data="sft_train_raw", kind="sft"):
    inputs = p.get(data, data)
    return ("prepare_dataset", ["--type", kind, "--data_input_dirs", inputs, "--tokenizer_dir", p["model"],
                                "--data_output_dirs", str(Path(p["empty"]).parent / "prep_out"), *extra])


# (case id, builder(paths) -> (script, argv), text the error line must contain)
CASES = [
    ("batch_size_0", lambda p: _sft(p, "--batch_size", "0"), "--batch_size: must be >= 1"),
    ("lr_negative", lambda p: _sft(p, "--lr", "-1"), "--lr: must be > 0"),
    ("lr_not_a_number", lambda p: _sft(p, "--lr", "abc"), "--lr: expected a number"),
    ("lr_nan", lambda p: _sft(p, "--lr", "nan"), "--lr: expected a finite number"),
    ("accumulation_0", lambda p: _sft(p, "--accumulation_steps", "0"), "--accumulation_steps: must be >= 1"),
    ("max_length_negative", lambda p: _sft(p, "--max_length", "-5"), "--max_length: must be >= 0"),
    ("max_steps_negative", lambda p: _sft(p, "--max_steps", "-2"), "--max_steps: must be >= -1"),
    ("max_tokens_negative", lambda p: _sft(p, "--packing", "--max_tokens_per_batch", "-1"),
     "--max_tokens_per_batch: must be >= 0"),
    ("max_tokens_without_packing", lambda p: _sft(p, "--max_tokens_per_batch", "512"),
     "--max_tokens_per_batch fills packed micro-batches; add --packing"),
    ("max_epochs_0", lambda p: _sft(p, "--max_epochs", "0"), "--max_epochs: must be > 0"),
    ("lora_rank_negative", lambda p: _sft(p, "--lora_rank", "-1"), "--lora_rank: must be >= 0"),
    ("lora_dropout_1", lambda p: _sft(p, "--lora_dropout", "1"), "--lora_dropout: must be in [0, 1)"),
    ("warmup_negative", lambda p: _sft(p, "--warmup_steps", "-3"), "--warmup_steps: must be >= 0"),
    ("save_interval_negative", lambda p: _sft(p, "--save_interval", "-1"), "--save_interval: must be >= 0"),
    ("keep_last_negative", lambda p: _sft(p, "--keep_last", "-2"), "--keep_last: must be >= 0"),
    ("log_interval_0", lambda p: _sft(p, "--log_interval", "0"), "--log_interval: must be >= 1"),
    ("grad_clip_negative", lambda p: _sft(p, "--grad_clip", "-1"), "--grad_clip: must be >= 0"),
    ("weight_decay_negative", lambda p: _sft(p, "--weight_decay", "-0.1"), "--weight_decay: must be >= 0"),
    ("tp_0", lambda p: _sft(p, "--tp", "0"), "--tp: must be >= 1"),
    ("dist_timeout_0", lambda p: _sft(p, "--dist_timeout", "0"), "--dist_timeout: must be > 0"),
    ("skip_nonfinite_negative", lambda p: _sft(p, "--skip_nonfinite", "-1"), "--skip_nonfinite: must be >= 0"),
    ("unknown_plugin", lambda p: _sft(p, "--plugin", "nosuch"), "--plugin: invalid choice"),
    ("cuda_plugin_on_cpu", lambda p: _sft(p, "--plugin", "zero2"), "--plugin zero2 needs CUDA"),
    ("unknown_flag", lambda p: _sft(p, "--bacth_size", "8"), "unknown flag --bacth_size (did you mean --batch_size"),
    ("missing_required", lambda p: ("train_sft", ["--dataset", p["sft_train"]]), "the following arguments are required: --pretrain"),
    ("num_generations_0", lambda p: _grpo(p, "--num_generations", "0"), "--num_generations: must be >= 2"),
    ("tools_unknown", lambda p: _grpo(p, "--tools", "search"), "unknown tool 'search'; expected one of calculator, python"),
    ("max_turns_0", lambda p: _grpo(p, "--tools", "calculator", "--max_turns", "0"), "--max_turns: must be >= 1"),
    ("tools_template_cannot_show_them", lambda p: ("train_grpo", ["--pretrain", p["no_tools_template_model"],
                                                                  "--prompt_dataset", p["prompt_train"], "--tools",
                                                                  "calculator", "--reward_fn", "math_answer"]),
     "does not render tools (the prompt does not name 'calculator')"),
    ("tools_template_rewrites_history", lambda p: ("train_grpo", ["--pretrain", p["history_rewriting_template_model"],
                                                                  "--prompt_dataset", p["prompt_train"], "--tools", "calculator",
                                                                  "--reward_fn", "math_answer"]),
     "does not render a conversation by appending turns"),
    ("chat_template_missing", lambda p: _grpo(p, "--tools", "calculator", "--chat_template", p["empty"] + "/none.jinja"),
     "none.jinja: neither a readable Jinja file nor a tokenizer folder"),
    ("tools_column_names_an_unknown_tool", lambda p: _grpo(p, "--tools", "calculator", "--prompt_dataset",
                                                            p["prompts_unknown_tool"]),
     "--prompt_dataset row 0: the row's tools name 'search', which --tools does not implement (calculator)"),
    ("agent_not_importable", lambda p: _grpo(p, "--agent", "no_such_module:solve"),
     "--agent: agent 'no_such_module:solve' cannot be imported: No module named 'no_such_module'"),
    ("agent_plain_name", lambda p: _grpo(p, "--agent", "solve"), "unknown agent 'solve'; expected package.module:function"),
    ("agent_with_tools", lambda p: _grpo(p, "--agent", "json:dumps", "--tools", "calculator"),
     "--agent runs your own agent program, which calls its own tools; leave out --tools"),
    ("num_generations_1", lambda p: _grpo(p, "--num_generations", "1"), "argument --num_generations: must be >= 2, got 1"),
    ("max_new_tokens_0", lambda p: _grpo(p, "--max_new_tokens", "0"), "--max_new_tokens: must be >= 1"),
    ("temperature_0", lambda p: _grpo(p, "--temperature", "0"), "--temperature: must be > 0"),
    ("top_p_0", lambda p: _grpo(p, "--top_p", "0"), "--top_p: must be in (0, 1]"),
    ("top_p_above_1", lambda p: _grpo(p, "--top_p", "1.5"), "--top_p: must be in (0, 1]"),
    ("num_episodes_0", lambda p: _grpo(p, "--num_episodes", "0"), "--num_episodes: must be >= 1"),
    ("rl_max_steps", lambda p: _grpo(p, "--max_steps", "3", "--num_episodes", "3"),
     "--num_episodes and --max_steps set the same thing; give one"),
    ("save_freq_secs_without_save_dir", lambda p: _grpo(p, "--save_freq_secs", "60"), "--save_freq_secs needs --save_dir"),
    ("colossalchat_refused", lambda p: _grpo(p, "--max_tokens_thinking", "4"),
     "--max_tokens_thinking is ColossalChat's and coati does not take it: use --max_new_tokens"),
    ("rl_max_epochs", lambda p: _grpo(p, "--max_epochs", "2"), "unknown flag --max_epochs"),
    ("kl_coef_negative", lambda p: _grpo(p, "--kl_coef", "-0.1"), "--kl_coef: must be >= 0"),
    ("kl_target_without_kl_coef", lambda p: _grpo(p, "--kl_target", "6"), "--kl_target 6.0 adapts --kl_coef, which must start above 0"),
    ("dynamic_sampling_async", lambda p: _grpo(p, "--dynamic_sampling", "--async_rollout"),
     "--dynamic_sampling works with synchronous rollouts only"),
    ("vllm_python_missing", lambda p: _ppo(p, "--rollout_backend", "vllm", "--vllm_python", "/nonexistent/python"),
     "--rollout_backend vllm: no Python interpreter at /nonexistent/python; build vLLM's environment with"),
    ("vllm_with_zero2", lambda p: _grpo(p, "--rollout_backend", "vllm", "--vllm_python", sys.executable, "--plugin", "zero2"),
     "--plugin zero2 needs CUDA GPUs and this machine has none"),
    ("vllm_with_gemini", lambda p: _grpo(p, "--rollout_backend", "vllm", "--vllm_python", sys.executable, "--plugin", "gemini"),
     "--plugin gemini needs CUDA GPUs and this machine has none"),
    ("vllm_with_3d", lambda p: _grpo(p, "--rollout_backend", "vllm", "--vllm_python", sys.executable, "--plugin", "3d",
                                     "--tp", "2"), "--plugin 3d needs CUDA GPUs and this machine has none"),
    ("vllm_cpu_small_heads", lambda p: _grpo(p, "--rollout_backend", "vllm", "--vllm_python", sys.executable),
     "vLLM on the CPU takes attention heads of 32 and up, and --pretrain"),
    ("vllm_adapters_over_moved_base", lambda p: _grpo(p, "--rollout_backend", "vllm", "--vllm_python", sys.executable,
                                                       "--lora_rank", "4", "--lora_init", "pissa",
                                                       "--vllm_lora_sync", "adapter"),
     "--vllm_lora_sync adapter: --lora_init pissa moves the base weights, so vLLM cannot serve the policy as adapters"),
    ("rollout_backend_unknown", lambda p: _grpo(p, "--rollout_backend", "sglang"),
     "argument --rollout_backend: invalid choice: 'sglang'"),
    ("overlong_buffer_too_long", lambda p: _grpo(p, "--reward_shaping", "overlong", "--max_new_tokens", "8",
                                                 "--overlong_buffer_len", "9"), "--overlong_buffer_len 9 must be at most"),
    ("unknown_reward_shaper", lambda p: _grpo(p, "--reward_shaping", "short"), "unknown reward shaper 'short'"),
    ("maxent_target_entropy_above_1", lambda p: _grpo(p, "--maxent_target_entropy", "1.5"),
     "--maxent_target_entropy: must be in [0, 1]"),
    ("reward_timeout_0", lambda p: _grpo(p, "--reward_timeout", "0"), "--reward_timeout: must be > 0"),
    ("clip_eps_low_above_1", lambda p: _grpo(p, "--clip_eps_low", "1.5"), "--clip_eps_low: must be in [0, 1)"),
    ("max_staleness_negative", lambda p: _grpo(p, "--max_staleness", "-1"), "--max_staleness: must be >= 0"),
    ("unknown_reward_fn", lambda p: _grpo(p, "--reward_fn", "nosuch"), "unknown reward function 'nosuch'"),
    ("unimportable_reward_fn", lambda p: _grpo(p, "--reward_fn", "no_such_pkg.mod:fn"), "cannot be imported"),
    ("reward_weight_not_a_number", lambda p: _grpo(p, "--reward_fn", "math_answer=abc"), "is not a number"),
    ("prm_data_without_step_labels", lambda p: _prep(p, data="prm_no_labels", kind="prm"),
     "prm_no_labels.jsonl:1: field 'labels': missing: a process reward model needs a label per step"),
    ("prm_pretrain_not_a_prm", lambda p: _ppo(p, "--prm_pretrain", p["model"]),
     "is not a process reward model (a token classifier, as train_prm.py exports one)"),
    ("process_estimator_without_prm", lambda p: _grpo(p, "--adv_estimator", "process"),
     "--adv_estimator process needs step scores: --prm_pretrain"),
    ("prm_packing", lambda p: ("train_prm", ["--pretrain", p["model"], "--dataset", p["sft_train"], "--packing"]),
     "--packing is not for train_prm.py"),
    ("distill_loss_without_teacher", lambda p: _grpo(p, "--distill_loss", "gkd"),
     "--distill_loss needs a teacher: --teacher_model or --teacher_url"),
    ("teacher_url_unreachable", lambda p: _grpo(p, "--teacher_url", "http://127.0.0.1:9/v1"),
     "--teacher_url http://127.0.0.1:9/v1 did not answer after 1 attempt in 0 s (Connection refused); is the teacher "
     "being served?"),
    ("teacher_model_and_url", lambda p: _grpo(p, "--teacher_model", p["small_model"], "--teacher_url",
                                              "http://127.0.0.1:9/v1"), "--teacher_model and --teacher_url: give one"),
    ("teacher_with_another_vocabulary", lambda p: _grpo(p, "--teacher_model", p["other_vocab_model"]),
     "its tokenizer's vocabulary differs from the policy's"),
    ("teacher_not_used", lambda p: _grpo(p, "--teacher_model", p["small_model"], "--distill_coef", "0"),
     "the teacher would not be used"),
    ("gkd_beta_above_1", lambda p: _grpo(p, "--gkd_beta", "2"), "--gkd_beta: must be in [0.0, 1.0]"),
    ("judge_without_a_judge", lambda p: _grpo(p, "--reward_fn", "judge"), "--reward_fn judge needs one judge: "
     "--judge_url (an OpenAI-compatible API) or --judge_model (a model folder coati serves)"),
    ("judge_url_without_judge", lambda p: _grpo(p, "--judge_url", "http://127.0.0.1:9/v1"),
     "--judge_url is for the judge reward: add `judge` to --reward_fn"),
    ("judge_url_not_a_url", lambda p: _grpo(p, "--reward_fn", "judge", "--judge_url", "localhost:8000"),
     "--judge_url localhost:8000: expected an http(s):// URL"),
    ("judge_model_not_a_model", lambda p: _ppo(p, "--reward_fn", "judge", "--judge_model", p["empty"]),
     "is not a model folder (no config.json)"),
    ("judge_rubric_unknown_field", lambda p: _grpo(p, "--reward_fn", "judge", "--judge_url", "http://127.0.0.1:9/v1",
                                                   "--judge_rubric", p["bad_rubric"]), "has the unknown field(s) {answer}"),
    ("rl_save_interval_without_save_dir", lambda p: _grpo(p, "--save_interval", "2"), "--save_interval needs --save_dir"),
    ("ppo_gamma_above_1", lambda p: _ppo(p, "--gamma", "1.5"), "--gamma: must be in [0, 1]"),
    ("ppo_lam_negative", lambda p: _ppo(p, "--lam", "-0.1"), "--lam: must be in [0, 1]"),
    ("ppo_value_clip_0", lambda p: _ppo(p, "--value_clip", "0"), "--value_clip: must be > 0"),
    ("ppo_critic_lr_0", lambda p: _ppo(p, "--critic_lr", "0"), "--critic_lr: must be > 0"),
    ("sapo_option_not_a_number", lambda p: _grpo(p, "--policy_loss", "sapo", "--policy_loss_option", "temperature_neg=abc"),
     "--policy_loss_option: policy loss 'sapo': option temperature_neg='abc' must be a number above 0"),
    ("policy_loss_unknown_option", lambda p: _ppo(p, "--policy_loss_option", "temperatur_neg=1.1"),
     "--policy_loss_option: policy loss 'ppo' takes no option 'temperatur_neg'; its options: dual_clip"),
    ("dual_clip_not_above_one", lambda p: _ppo(p, "--policy_loss_option", "dual_clip=0.9"),
     "--policy_loss_option dual_clip=0.9: the dual clip bounds the loss of a token with a negative advantage at "
     "dual_clip x |A|, and must be above 1"),
    ("partial_rollouts_without_async", lambda p: _grpo(p, "--partial_rollout_tokens", "4"),
     "--partial_rollout_tokens needs --async_rollout"),
    ("behaviour_correction_unknown_option",
     lambda p: _grpo(p, "--behaviour_correction", "icepop", "--behaviour_correction_option", "cap=2"),
     "--behaviour_correction_option: behaviour correction 'icepop' takes no option 'cap'; its options: low, high"),
    ("ppo_without_reward", lambda p: ("train_ppo", ["--pretrain", p["model"], "--prompt_dataset", p["prompt_train"]]),
     "PPO needs a reward"),
    ("grpo_without_reward", lambda p: ("train_grpo", ["--pretrain", p["model"], "--prompt_dataset", p["prompt_train"]]),
     "GRPO needs a reward"),
    ("ppo_rm_missing", lambda p: _ppo(p, "--rm_pretrain", p["empty"] + "/nope"), "--rm_pretrain"),
    ("dpo_beta_0", lambda p: _pref("train_dpo", p, "--beta", "0"), "--beta: must be > 0"),
    ("dpo_label_smoothing", lambda p: _pref("train_dpo", p, "--label_smoothing", "0.7"), "--label_smoothing: must be in [0, 0.5)"),
    ("dpo_ref_empty", lambda p: _pref("train_dpo", p, "--ref_pretrain", p["empty"]), "config.json: file not found"),
    ("kto_weight_0", lambda p: _pref("train_kto", p, "--desirable_weight", "0"), "--desirable_weight: must be > 0"),
    ("orpo_lam_negative", lambda p: _pref("train_orpo", p, "--lam", "-1"), "--lam: must be >= 0"),
    ("rm_unknown_loss", lambda p: _pref("train_rm", p, "--loss_fn", "nope"), "--loss_fn: invalid choice"),
    ("pretrain_missing", lambda p: ("train_sft", ["--pretrain", p["empty"] + "/nope", "--dataset", p["sft_train"]]),
     "--pretrain"),
    ("model_name_or_path_missing", lambda p: ("train_sft", ["--model_name_or_path", p["empty"] + "/nope", "--dataset_name",
                                                            p["sft_train"]]),
     "error: model_name_or_path (--pretrain) "),
    ("dataset_name_missing", lambda p: _grpo(p, "--dataset_name", p["empty"] + "/nope.jsonl"),
     "error: dataset_name (--prompt_dataset) "),
    ("pretrain_empty_dir", lambda p: ("train_sft", ["--pretrain", p["empty"], "--dataset", p["sft_train"]]),
     "config.json: file not found"),
    ("model_too_big_for_memory", lambda p: _sft(p, "--pretrain", p["model_70b"]),
     "this run cannot fit: before any activation it needs about 1275.9 GiB per process (weights 255.0, gradients "
     "255.0, gradient buckets 255.0, optimizer states 510.1, runtime 0.8 GiB, estimated for --plugin ddp before "
     "loading) and each process has "),
    ("grpo_too_big_for_memory", lambda p: _grpo(p, "--pretrain", p["model_70b"], "--lora_rank", "16"),
     "this run cannot fit: before any activation it needs about 258.9 GiB per process (weights 255.0, gradients 0.8, "
     "gradient buckets 0.8, optimizer states 1.5, runtime 0.8 GiB, estimated for --plugin ddp before loading) and "
     "each process has the "),
    ("pretrain_truncated_weights", lambda p: ("train_sft", ["--pretrain", p["truncated_model"], "--dataset", p["sft_train"]]),
     "model.safetensors is truncated"),
    ("pretrain_bad_config", lambda p: ("train_sft", ["--pretrain", p["bad_config_model"], "--dataset", p["sft_train"]]),
     "config.json:2: invalid JSON"),
    ("pretrain_no_weights", lambda p: ("train_sft", ["--pretrain", p["no_weights_model"], "--dataset", p["sft_train"]]),
     "holds no model weights"),
    ("pretrain_is_a_file", lambda p: ("train_sft", ["--pretrain", p["file"], "--dataset", p["sft_train"]]),
     "is not a directory"),
    ("tokenizer_dir_missing", lambda p: _sft(p, "--tokenizer_dir", p["empty"] + "/nope"), "--tokenizer_dir"),
    ("dataset_missing", lambda p: ("train_sft", ["--pretrain", p["model"], "--dataset", p["empty"] + "/nope"]),
     "--dataset"),
    ("prompt_dataset_missing", lambda p: ("train_grpo", ["--pretrain", p["model"], "--prompt_dataset", p["file"],
                                                         "--reward_fn", "math_answer"]), "--prompt_dataset"),
    ("eval_dataset_missing", lambda p: _sft(p, "--eval_dataset", p["empty"] + "/nope"), "--eval_dataset"),
    ("output_dir_under_file", lambda p: _sft(p, "--output_dir", p["file"] + "/out"), "is a file"),
    ("save_dir_under_file", lambda p: _sft(p, "--save_dir", p["file"] + "/ckpt"), "is a file"),
    ("log_dir_under_file", lambda p: _sft(p, "--log_dir", p["file"] + "/logs"), "is a file"),
    ("output_dir_is_file", lambda p: _sft(p, "--output_dir", p["file"]), "is a file, not a directory"),
    ("save_interval_without_save_dir", lambda p: _sft(p, "--save_interval", "5"), "--save_interval needs --save_dir"),
    ("latest_without_save_dir", lambda p: _sft(p, "--checkpoint_path", "latest"), "needs --save_dir"),
    ("checkpoint_missing", lambda p: _sft(p, "--checkpoint_path", p["empty"] + "/nope"), "does not exist"),
    ("checkpoint_is_the_save_dir", lambda p: _sft(p, "--checkpoint_path", p["ckpt_dir"]),
     "holds checkpoints but is not one"),
    ("dataset_not_prepared", lambda p: ("train_sft", ["--pretrain", p["model"], "--dataset", p["model"]]),
     "is not a prepared dataset (no state.json)"),
    ("checkpoint_incomplete", lambda p: _sft(p, "--checkpoint_path", p["ckpt_incomplete"]), "is incomplete"),
    ("checkpoint_truncated", lambda p: _sft(p, "--checkpoint_path", p["ckpt_truncated"]), "optimizer.bin is not a complete torch file"),
    ("checkpoint_other_size", lambda p: _sft(p, "--checkpoint_path", p["ckpt_other_size"]),
     "was written for a model of another shape (hidden_size 128 vs 64"),
    ("prep_max_length_negative", lambda p: _prep(p, "--max_length", "-5"), "--max_length: must be >= 1"),
    ("prep_unknown_type", lambda p: _prep(p, kind="nosuch"), "--type: invalid choice"),
    ("prep_input_missing", lambda p: _prep(p, data=p["empty"] + "/nope.jsonl"), "data input not found"),
    ("prep_binary_file", lambda p: _prep(p, data="binary"), "binary.jsonl:1: field '<line>'"),
    ("prep_invalid_utf8", lambda p: _prep(p, data="latin1"), "latin1.jsonl:1: field '<line>': not valid UTF-8"),
    ("prep_malformed_json", lambda p: _prep(p, data="malformed"), "malformed.jsonl:1: field '<line>': invalid JSON"),
    ("prep_missing_field", lambda p: _prep(p, data="missing_field"), "missing_field.jsonl:1: field 'messages': missing"),
    ("prep_empty_folder", lambda p: _prep(p, data="empty"), "the data input folder is empty"),
    ("prep_unreadable_folder", lambda p: _prep(p, data="raw_dir"), "neither JSONL files nor a dataset folder"),
    ("prep_template_missing", lambda p: _prep(p, "--conversation_template_config", p["empty"] + "/t.json"),
     "t.json: file not found (--conversation_template_config)"),
    ("prep_template_bad_json", lambda p: _prep(p, "--conversation_template_config", p["template_bad_json"]),
     "template.json:2: invalid JSON"),
    ("prep_template_no_field", lambda p: _prep(p, "--conversation_template_config", p["template_no_field"]),
     "field 'chat_template' is not a string"),
    ("prep_everything_truncated", lambda p: _prep(p, "--max_length", "3"), "all 96 rows were dropped by truncation"),
    ("prep_tokenizer_missing", lambda p: ("prepare_dataset", ["--type", "sft", "--data_input_dirs", p["sft_train_raw"],
                                                              "--tokenizer_dir", p["empty"] + "/nope",
                                                              "--data_output_dirs", p["empty"] + "/o"]),
     "tokenizer directory"),
    ("prep_tokenizer_empty", lambda p: ("prepare_dataset", ["--type", "sft", "--data_input_dirs", p["sft_train_raw"],
                                                            "--tokenizer_dir", p["empty"],
                                                            "--data_output_dirs", p["empty"] + "/o"]),
     "no tokenizer could be loaded"),
    ("prep_output_under_file", lambda p: ("prepare_dataset", ["--type", "sft", "--data_input_dirs", p["sft_train_raw"],
                                                              "--tokenizer_dir", p["model"],
                                                              "--data_output_dirs", p["file"] + "/o"]),
     "--data_output_dirs"),
]


def _script_path(name: str) -> Path:
    return PREPARE if name == "prepare_dataset" else SCRIPTS / f"{name}.py"


def _check_error_line(err: str, expected: str, under_torchrun: bool = False) -> str:
    """Our `error:` line is printed once and names the problem; no traceback frame is ours. Without torchrun
    (whose own report follows) there is no traceback at all and our line is the last one (progress bars may
    come before it). Returns the line."""
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and expected in ours[0], err[-3000:]
    assert not re.search(r'File ".*/(coati|examples)/', err), err[-3000:]
    if not under_torchrun:
        assert "Traceback" not in err and err.strip().splitlines()[-1] == ours[0], err[-3000:]
    return ours[0]


def test_the_sweep_has_at_least_60_cases():
    assert len(CASES) >= 60 and len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_error_line_and_status_2(bad, case, capsys):
    name, build, expected = case
    script, argv = build(bad)
    with pytest.raises(SystemExit) as exited:
        _script(_script_path(script)).main(argv)
    assert exited.value.code == 2
    _check_error_line(capsys.readouterr().err, expected)


LATE_CASES = [   # found once the run has started, its process group up: each runs as a process of its own
    ("prm_on_sft_data", lambda p: ("train_prm", ["--pretrain", p["model"], "--dataset", p["sft_train"]]),
     "was prepared as sft data; this script needs prm data (prepare_dataset.py --type prm)"),
    ("judge_unreachable", lambda p: _grpo(p, "--reward_fn", "judge", "--judge_url", "http://127.0.0.1:9/v1",
                                          "--judge_retries", "0", "--num_episodes", "1", "--batch_size", "2",
                                          "--max_new_tokens", "4"),
     "judge http://127.0.0.1:9/v1 did not answer after 1 attempt"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", LATE_CASES, ids=[c[0] for c in LATE_CASES])
def test_bad_input_found_once_the_run_started_gives_one_error_line_and_status_2(bad, case):
    _, build, expected = case
    script, argv = build(bad)
    result = subprocess.run([sys.executable, str(_script_path(script)), *argv], capture_output=True, text=True,
                            timeout=300, env=child_env(), cwd=REPO)
    assert result.returncode == 2
    _check_error_line(result.stderr, expected)


AS_PROCESSES = ["batch_size_0", "num_generations_1", "rl_max_steps", "output_dir_under_file", "model_too_big_for_memory",
                "pretrain_truncated_weights", "checkpoint_other_size", "prep_binary_file"]


def _case(name: str):
    return next(c for c in CASES if c[0] == name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["batch_size_0", "prep_binary_file"])
def test_bad_input_as_a_python_process(bad, name):
    """A plain `python` launch (the torchrun cases below check the same exit status 2, as the worker's)."""
    _, build, expected = _case(name)
    script, argv = build(bad)
    result = subprocess.run([sys.executable, str(_script_path(script)), *argv], capture_output=True, text=True,
                            timeout=300, env=child_env(), cwd=REPO)
    assert result.returncode == 2
    _check_error_line(result.stderr, expected)


UNDER_TORCHRUN_IN_CI = ("batch_size_0", "checkpoint_other_size")
"""One error found before the process group starts and one found after it; the others under torchrun are `extended`
(the in-process sweep checks each one's line)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", [n if n in UNDER_TORCHRUN_IN_CI else pytest.param(n, marks=pytest.mark.extended)
                                  for n in AS_PROCESSES if n != "prep_binary_file"])
def test_bad_input_under_torchrun_names_our_error_in_the_summary(bad, name):
    """torchrun exits 1 with its own failure report; our line is printed once (by local rank 0), and the
    report's root cause is our line, not 'To enable traceback see ...'. No traceback comes from our code."""
    _, build, expected = _case(name)
    script, argv = build(bad)
    result = torchrun(_script_path(script), 2, *argv, timeout=300)
    assert result.returncode == 1
    line = _check_error_line(result.stderr, expected, under_torchrun=True)
    assert f"traceback : {line}" in result.stderr and "exitcode  : 2" in result.stderr
    assert "To enable traceback" not in result.stderr


@pytest.mark.slow
def test_a_launch_refuses_a_run_that_cannot_fit_before_starting_any_process(bad):
    """`coati sft ... --nproc_per_node 2` with a model whose states cannot fit: one line and status 2 from the launcher,
    the memory shared by the two processes it would start, and no torchrun report."""
    result = subprocess.run([sys.executable, "-m", "coati.cli.main", "sft", "--pretrain", bad["model_70b"], "--dataset",
                             bad["sft_train"], "--nproc_per_node", "2"], capture_output=True, text=True, cwd=REPO,
                            env=child_env(), timeout=120)
    assert result.returncode == 2
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: this run cannot fit: before any activation it needs about "
                                                   "1275.9 GiB per process"), lines
    assert re.search(r"each process has [0-9.]+ GiB, its share of the [0-9.]+ GiB of CPU memory available to 2 "
                     r"processes; this machine's memory cannot hold it: the weights alone need 255.8 GiB; shard them "
                     r"over GPUs", lines[0]), lines[0]


BAD_REWARDS = '''import math
import time

NOT_CALLABLE = 3


def raises(prompts, completions, **fields):
    raise KeyError("gt")


def wrong_length(prompts, completions, **fields):
    return [1.0]


def nan_value(prompts, completions, **fields):
    return [math.nan] * len(completions)


def hangs(prompts, completions, **fields):
    time.sleep(3600)
'''

REWARD_CASES = [
    ("raises", "reward function bad_rewards:raises raised KeyError: 'gt'"),
    ("wrong_length", "reward function bad_rewards:wrong_length returned 1 values for 4 completions"),
    ("nan_value", "reward function bad_rewards:nan_value returned a NaN or infinite value"),
    ("hangs", "reward function bad_rewards:hangs did not return within --reward_timeout 2 s"),
    ("NOT_CALLABLE", "reward function 'bad_rewards:NOT_CALLABLE' is not callable"),
]


@pytest.mark.parametrize("name,expected", REWARD_CASES, ids=[c[0] for c in REWARD_CASES])
def test_a_broken_reward_function_ends_the_run_with_one_line(bad, tmp_path, name, expected, world_of_one, monkeypatch):
    """Found once the run has started: GRPO runs in this process, on a world of one, as train_grpo.py would."""
    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["--pretrain", bad["model"], "--prompt_dataset", bad["prompt_train"], "--batch_size", "2",
            "--num_generations", "2", "--max_new_tokens", "8", "--num_episodes", "2", "--reward_timeout", "2",
            "--reward_fn", f"bad_rewards:{name}"]
    result = run_main(_script(SCRIPTS / "train_grpo.py").main, argv)
    assert result.returncode == 2
    if name == "raises":   # the function's own frames (its file and line), then the one line
        assert "Traceback (the reward function's frames):" in result.stderr, result.stderr[-3000:]
        assert re.search(r'File ".*/bad_rewards.py", line \d+, in raises', result.stderr), result.stderr[-3000:]
        _check_error_line(result.stderr, expected, under_torchrun=True)
        assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    else:
        _check_error_line(result.stderr, expected)


def test_help_shows_each_flags_range(capsys):
    with pytest.raises(SystemExit) as exited:
        _script(SCRIPTS / "train_grpo.py").main(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "prompts per rank per collect step (default: 4) [>= 1]" in text
    assert "reaches P (default: 1.0) [in (0, 1]]" in text and "sampling temperature (default: 1.0) [> 0]" in text
