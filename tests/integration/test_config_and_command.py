"""The way in as a TRL user takes it: the `coati` command, `--config` files in TRL's names (each TRL name's meaning
pinned), unknown keys and flags refused with the nearest names before anything heavy loads, and a run that saves its
resolved config, from which it reruns with the same metrics (launched on 2 processes: e2e/test_config_and_command_e2e.py)."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SCRIPTS, child_env, parsed_args, train_records
from coati.cli.main import launch_options, launched_processes, launcher_command, rendezvous_note
from support import run_coati as _run_coati


def _parse(command: str, argv, monkeypatch, config=None, tmp_path=None):
    """`parsed_args`, with `config` (a dict) written as the --config file first."""
    if config is not None:
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = ["--config", str(path), *argv]
    return parsed_args(command, argv, monkeypatch)


def _refused(command: str, argv, monkeypatch, capsys, config=None, tmp_path=None) -> str:
    with pytest.raises(SystemExit) as stop:
        _parse(command, argv, monkeypatch, config, tmp_path)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


MODEL_AND_DATA = ["--pretrain", "m", "--prompt_dataset", "d"]
GRPO = [*MODEL_AND_DATA, "--reward_fn", "math_answer"]
SFT = ["--pretrain", "m", "--dataset", "d"]


@pytest.mark.parametrize("trl, value, setting, expected", [
    ("model_name_or_path", "org/model", "pretrain", "org/model"),
    ("learning_rate", 3e-6, "lr", 3e-6),
    ("gradient_accumulation_steps", 4, "accumulation_steps", 4),
    ("num_train_epochs", 3, "max_epochs", 3),
    ("num_train_epochs", 0.5, "max_epochs", 0.5),
    ("max_steps", 7, "max_steps", 7),
    ("lr_scheduler_type", "linear", "lr_scheduler", "linear"),
    ("warmup_ratio", 0.1, "warmup_ratio", 0.1),
    ("weight_decay", 0.01, "weight_decay", 0.01),
    ("max_grad_norm", 0.5, "grad_clip", 0.5),
    ("seed", 7, "seed", 7),
    ("gradient_checkpointing", True, "grad_checkpoint", True),
    ("save_total_limit", 2, "keep_last", 2),
    ("logging_steps", 5, "log_interval", 5),
    ("per_device_train_batch_size", 16, "batch_size", 16),
    ("save_steps", 50, "save_interval", 50),
    ("max_length", 512, "max_length", 512),
    ("output_dir", "out/x", "output_dir", "out/x"),
    ("dataset_name", ["data/a"], "dataset", ["data/a"]),
    ("dataset_train_split", "training", "dataset_train_split", "training"),
    ("dataset_test_split", "validation", "dataset_test_split", "validation"),
    ("per_device_eval_batch_size", 16, "eval_batch_size", 16),
    ("eval_steps", 25, "eval_interval", 25),
    ("lora_r", 8, "lora_rank", 8),
    ("lora_alpha", 32, "lora_alpha", 32),
    ("lora_dropout", 0.05, "lora_dropout", 0.05),
    ("lora_target_modules", ["q_proj", "v_proj"], "lora_target_modules", ["q_proj", "v_proj"]),
    ("bf16", False, "mixed_precision", "fp32"),
    ("fp16", True, "mixed_precision", "fp16"),
    ("resume_from_checkpoint", True, "checkpoint_path", "latest"),
    ("resume_from_checkpoint", "ckpt/epoch-0_step-4", "checkpoint_path", "ckpt/epoch-0_step-4"),
    ("assistant_only_loss", False, "disable_loss_mask", True),
    ("completion_only_loss", True, "disable_loss_mask", False),
    ("lr_scheduler_type", "constant", "lr_scheduler", "constant"),
    ("adam_beta1", 0.8, "adam_beta1", 0.8),
    ("run_name", "sft-lr3e-3", "run_name", "sft-lr3e-3"),
    ("adam_beta2", 0.95, "adam_beta2", 0.95),
    ("adam_epsilon", 1e-6, "adam_epsilon", 1e-6),
    ("lr_scheduler_kwargs", {"num_cycles": 1.5}, "lr_scheduler_option", [("num_cycles", 1.5)]),
    ("padding_free", True, "packing", True),
    ("logging_dir", "tb", "log_dir", "tb"),
    ("eos_token", "<|im_end|>", "eos_token", "<|im_end|>"),
    ("pad_token", "<|pad|>", "pad_token", "<|pad|>"),
    ("chat_template_path", "t.jinja", "chat_template", "t.jinja"),
    ("disable_dropout", True, "disable_dropout", True),
    ("tf32", True, "tf32", True),
    ("truncation_mode", "keep_start", "max_length", 0),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_trl_name_in_a_supervised_config_sets_coatis_setting_with_trls_meaning(trl, value, setting, expected,
                                                                                 monkeypatch, tmp_path):
    args = _parse("sft", [] if trl in ("model_name_or_path", "dataset_name") else SFT, monkeypatch,
                  {trl: value, **({"dataset_name": ["d"]} if trl == "model_name_or_path" else {}),
                   **({"model_name_or_path": "m"} if trl == "dataset_name" else {})}, tmp_path)
    assert getattr(args, setting) == expected


@pytest.mark.parametrize("config, expected", [
    ({"eval_strategy": "steps", "logging_steps": 5, "eval_split": 0.1}, {"eval_interval": 5}),
    ({"eval_strategy": "steps", "eval_steps": 7, "logging_steps": 5, "eval_split": 0.1}, {"eval_interval": 7}),
    ({"eval_strategy": "no", "eval_split": 0.1, "eval_steps": 7}, {"eval_split": 0.0, "eval_interval": 0,
                                                                   "eval_dataset": None}),
    ({"eval_strategy": "epoch", "eval_dataset": ["e"]}, {"eval_interval": 0}),
    ({"evaluation_strategy": "steps", "eval_steps": 7, "eval_split": 0.1}, {"eval_interval": 7}),   # its name before transformers 4.46
    ({"save_strategy": "steps", "output_dir": "o"}, {"save_interval": 500, "save_dir": "o/checkpoints"}),
    ({"save_steps": 20, "output_dir": "o"}, {"save_interval": 20, "save_dir": "o/checkpoints"}),
    ({"save_strategy": "epoch", "output_dir": "o", "save_dir": "ckpt"}, {"save_freq_epochs": 1, "save_dir": "ckpt"}),
    ({"save_strategy": "no", "save_dir": "ckpt", "save_steps": 20}, {"save_dir": None, "save_interval": 0}),
], ids=str)
def test_trls_eval_and_save_strategies_set_when_a_supervised_run_evaluates_and_saves(config, expected, monkeypatch,
                                                                                      tmp_path):
    args = _parse("sft", SFT, monkeypatch, config, tmp_path)
    assert {name: getattr(args, name) for name in expected} == expected


def test_trls_fraction_of_the_run_for_a_step_count_is_refused_saying_so(monkeypatch, capsys, tmp_path):
    refused = _refused("sft", SFT, monkeypatch, capsys, {"save_steps": 0.5}, tmp_path)
    assert "--save_steps: expected a whole number >= 1, got 0.5 (TRL's fraction of the run" in refused
    refused = _refused("sft", SFT, monkeypatch, capsys, {"per_device_train_batch_size": 0}, tmp_path)
    assert refused.startswith("error: argument --per_device_train_batch_size: expected a whole number >= 1, got 0 (see")


def test_a_trl_save_name_without_a_folder_is_named_as_given_with_output_dir_as_the_way(monkeypatch, tiny_assets):
    from coati.cli.options import errors_named_as_given
    from coati.cli.preflight import check_paths
    from coati.utils.errors import CoatiUsageError

    data = ["--model_name_or_path", str(tiny_assets["model"]), "--dataset_name", str(tiny_assets["sft_train"])]
    for flag, said in (("--save_steps", "save_steps (--save_interval) needs --save_dir, the directory checkpoints "
                                        "are written to, or output_dir (they then go to OUTPUT_DIR/checkpoints)"),
                       ("--save_interval", "--save_interval needs --save_dir, the directory checkpoints are written "
                                           "to")):
        args = _parse("sft", [*data, flag, "10"], monkeypatch)
        with pytest.raises(CoatiUsageError) as refused, errors_named_as_given(args):
            check_paths(args)
        assert str(refused.value) == said


def test_orpos_beta_is_its_lambda_and_dpos_prompt_cut_is_refused_saying_what_coati_cuts(monkeypatch, capsys,
                                                                                        tmp_path):
    assert _parse("orpo", SFT, monkeypatch, {"beta": 0.2}, tmp_path).lam == 0.2
    assert _parse("dpo", SFT, monkeypatch, {"rpo_alpha": 1.0}, tmp_path).rpo_alpha == 1.0
    refused = _refused("dpo", SFT, monkeypatch, capsys, {"max_prompt_length": 64}, tmp_path)
    assert "max_prompt_length is not taken: coati keeps each prompt whole and cuts a row to --max_length" in refused
    refused = _refused("sft", SFT, monkeypatch, capsys, {"eval_strategy": "steps"}, tmp_path)   # TRL refuses it too
    assert refused.startswith("error: --eval_strategy steps evaluates held-out data, and none is given: give "
                              "eval_dataset, eval_split")
    refused = _refused("dpo", SFT, monkeypatch, capsys, {"truncation_mode": "keep_end"}, tmp_path)
    assert refused.startswith("error: --truncation_mode keep_end is not taken: coati keeps each prompt whole")


def test_use_peft_trains_lora_at_trls_rank_unless_lora_r_says(monkeypatch, tmp_path):
    assert _parse("sft", [*SFT, "--use_peft"], monkeypatch).lora_rank == 16
    assert _parse("sft", [*SFT, "--use_peft", "true", "--lora_r", "4"], monkeypatch).lora_rank == 4
    assert _parse("sft", SFT, monkeypatch, {"use_peft": False}, tmp_path).lora_rank == 0


@pytest.mark.parametrize("config, expected", [
    ({"beta": 0.04}, {"kl_coef": 0.04}),
    ({"max_completion_length": 256}, {"max_new_tokens": 256}),
    ({"num_generations": 4, "temperature": 0.7}, {"num_generations": 4, "temperature": 0.7}),
    ({"epsilon": 0.3}, {"clip_eps_low": 0.3, "clip_eps_high": 0.3}),
    ({"epsilon": 0.2, "epsilon_high": 0.28}, {"clip_eps_low": 0.2, "clip_eps_high": 0.28}),
    ({"loss_type": "grpo"}, {"loss_agg": "seq-mean-token-mean"}),
    ({"loss_type": "dr_grpo"}, {"loss_agg": "seq-mean-token-sum-norm"}),
    ({"loss_type": "dapo"}, {"loss_agg": "token-mean"}),
    ({"scale_rewards": False}, {"no_std_normalize": True}),
    ({"scale_rewards": "group"}, {"no_std_normalize": False}),
    ({"scale_rewards": "none"}, {"no_std_normalize": True}),
    ({"use_vllm": True}, {"rollout_backend": "vllm"}),
    ({"reward_funcs": ["math_answer", "answer_format"], "reward_weights": [1.0, 0.5]},
     {"reward_fn": ["math_answer=1", "answer_format=0.5"]}),
    ({"max_prompt_length": 200}, {"max_length": 200}),
    ({"per_device_eval_batch_size": 32, "dataset_test_split": "test"}, {"eval_batch_size": 32,
                                                                       "dataset_test_split": "test"}),
    ({"report_to": ["wandb"], "output_dir": "o"}, {"use_wandb": True, "log_dir": None}),
    ({"report_to": ["wandb", "tensorboard"], "output_dir": "o"}, {"use_wandb": True, "log_dir": "o/logs"}),
    ({"report_to": "none", "output_dir": "o"}, {"use_wandb": False, "log_dir": None}),
    ({"output_dir": "o"}, {"log_dir": "o/logs"}),
    ({"eval_strategy": "epoch", "eval_dataset": ["e"]}, {"eval_freq_epochs": 1}),
    ({"max_steps": -1, "num_episodes": 7}, {"num_episodes": 7}),
    ({"num_train_epochs": 2, "max_steps": -1}, {"num_epochs": 2.0}),           # open-r1's: the epochs decide
    ({"num_train_epochs": 2, "max_steps": 6}, {"num_epochs": 0.0, "num_episodes": 6}),   # TRL: max_steps wins
    ({"log_completions": True, "logging_steps": 3}, {"sample_log_interval": 3}),
    ({"log_completions": False}, {"sample_log_interval": 0}),
    ({"eval_strategy": "steps", "logging_steps": 3, "eval_dataset": ["e"]}, {"eval_interval": 3}),
    ({"save_strategy": "steps", "output_dir": "o"}, {"save_interval": 500, "save_dir": "o/checkpoints"}),
    ({"num_iterations": 2}, {"num_update_steps": 2}),
    ({"importance_sampling_level": "sequence"}, {"policy_loss": "gspo"}),
    ({"importance_sampling_level": "token"}, {"policy_loss": "ppo"}),
    ({"mask_truncated_completions": True}, {"mask_truncated_completions": True}),
    ({"top_k": 20, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1},
     {"top_k": 20, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1}),
    # TRL's cispo caps the weight at epsilon_high itself; coati's cap is 1 + --clip_eps_high
    ({"loss_type": "cispo", "epsilon_high": 5.0}, {"policy_loss": "cispo", "loss_agg": "token-mean",
                                                   "clip_eps_high": 4.0}),
    ({"loss_type": "sapo", "sapo_temperature_neg": 1.2},
     {"policy_loss": "sapo", "loss_agg": "seq-mean-token-mean", "policy_loss_option": [("temperature_neg", 1.2)]}),
    ({"sapo_temperature_neg": 1.2}, {"policy_loss": "ppo", "policy_loss_option": []}),   # TRL's: sapo's only
    ({"ddp_timeout": 1800}, {"dist_timeout": 1800}),
    ({"max_tool_calling_iterations": 3}, {"max_turns": 4}),   # 3 rounds of tool calls, then the answer
])
def test_a_trl_name_in_a_grpo_config_sets_coatis_setting_with_trls_meaning(config, expected, monkeypatch, tmp_path):
    args = _parse("grpo", MODEL_AND_DATA, monkeypatch, {"reward_funcs": ["math_answer"], **config}, tmp_path)
    assert {name: getattr(args, name) for name in expected} == expected


@pytest.mark.parametrize("config, expected", [
    # 8 completions per rank per micro-step, 2 micro-steps per optimizer step, groups of 4: 4 prompts per rank
    ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "num_generations": 4},
     {"batch_size": 4, "train_batch_size": 8, "accumulation_steps": 2}),
    # one optimizer step per episode: steps count episodes
    ({"per_device_train_batch_size": 8, "num_generations": 4, "max_steps": 30, "logging_steps": 5, "save_steps": 10,
      "eval_steps": 15}, {"num_episodes": 30, "log_interval": 5, "save_interval": 10, "eval_interval": 15}),
    # 2 prompts x 4 completions learned 2 at a time, one micro-batch a step: 4 optimizer steps per episode
    ({"batch_size": 2, "num_generations": 4, "train_batch_size": 2, "max_steps": 40, "logging_steps": 8},
     {"num_episodes": 10, "log_interval": 2}),
    # a generation of 4 micro-steps of 8 completions, 2 micro-steps per optimizer step: 2 optimizer steps an episode
    ({"per_device_train_batch_size": 8, "steps_per_generation": 4, "gradient_accumulation_steps": 2,
      "num_generations": 4, "max_steps": 10}, {"batch_size": 8, "train_batch_size": 8, "num_episodes": 5}),
])
def test_grpo_counts_convert_from_trls_completions_and_optimizer_steps(config, expected, monkeypatch, tmp_path):
    from coati.cli.arguments import optimizer_steps_per_episode

    args = _parse("grpo", GRPO, monkeypatch, config, tmp_path)
    assert {name: getattr(args, name) for name in expected} == expected
    if "max_steps" in config:
        assert args.num_episodes * optimizer_steps_per_episode(args) == config["max_steps"]


def test_the_command_lines_run_length_overrides_the_files(monkeypatch, tmp_path):
    """A saved config records `num_episodes`: `--num_train_epochs` on the command line reruns it for that many passes,
    and `--num_episodes` on it overrides a file's `num_train_epochs`."""
    args = _parse("grpo", [*GRPO, "--num_train_epochs", "2"], monkeypatch, {"num_episodes": 10}, tmp_path)
    assert args.num_epochs == 2
    args = _parse("grpo", [*GRPO, "--num_episodes", "4"], monkeypatch, {"num_train_epochs": 2}, tmp_path)
    assert (args.num_epochs, args.num_episodes) == (0.0, 4)


@pytest.mark.parametrize("argv, message", [
    (["--per_device_train_batch_size", "6", "--num_generations", "4"],
     r"--per_device_train_batch_size 6 x --gradient_accumulation_steps 1 = 6 completions per rank is not a whole "
     r"number of prompts of --num_generations 4; make it a multiple"),
    (["--per_device_train_batch_size", "8", "--batch_size", "2"],
     r"--batch_size and --per_device_train_batch_size set the same thing; give one"),
    (["--batch_size", "2", "--num_generations", "4", "--train_batch_size", "2", "--max_steps", "6"],
     r"--max_steps 6 counts optimizer steps, and an episode here makes 4 of them: give a multiple of 4, or "
     r"--num_episodes in episodes"),
    (["--max_steps", "5", "--num_episodes", "5"], r"--num_episodes and --max_steps set the same thing"),
    (["--num_train_epochs", "1", "--num_episodes", "5"],
     r"--num_episodes and --num_train_epochs both set the run's length; give one"),
    (["--reward_funcs", "math_answer", "--reward_weights", "1", "2"],
     r"--reward_weights: 2 weights for 1 reward functions \(math_answer\)"),
    (["--scale_rewards", "batch"], r"--scale_rewards batch: coati scales by the group's std"),
    (["--bf16", "--fp16"], r"--bf16 and --fp16: choose one precision"),
    (["--lr_scheduler_type", "cosine_with_min_lr"],
     r"error: lr_scheduler_type \(--lr_scheduler\) cosine_with_min_lr needs --lr_scheduler_option min_lr_rate=... "
     r"or --lr_scheduler_option min_lr=... \(one of them\)"),   # named as given, coati's flag beside it
    (["--lr_scheduler", "linear", "--lr_scheduler_kwargs", "min_lr_rate=0.1"],
     r"lr_scheduler_kwargs \(--lr_scheduler_option\) min_lr_rate: not a setting of --lr_scheduler linear \(it "
     r"takes none\)"),
    (["--report_to", "none", "wandb"], r"--report_to none wandb: none means no logs; give it alone"),
    (["--per_device_train_batch_size", "6", "--steps_per_generation", "3", "--num_generations", "4"],
     r"--per_device_train_batch_size 6 x --steps_per_generation 3 = 18 completions per rank is not a whole number"),
    (["--loss_type", "vespo"], r"argument --loss_type: vespo is not built here: give one of grpo, bnpo, dr_grpo, dapo, "
                               r"cispo, sapo, or --policy_loss"),
    (["--loss_type", "cispo", "--epsilon_high", "0.28"], r"--loss_type cispo: --epsilon_high 0.28 is CISPO's cap on "
                                                         r"the importance weight, and must be above 1"),
    (["--loss_type", "sapo", "--importance_sampling_level", "sequence"],
     r"--loss_type sapo and --importance_sampling_level sequence \(GSPO\) are two policy losses; choose one"),
    (["--sync_ref_model", "true"], r"--sync_ref_model true: --sync_ref_model takes only false here"),
    (["--shuffle_dataset", "false"], r"--shuffle_dataset false: --shuffle_dataset takes only true here: coati "
                                     r"shuffles the training data every epoch"),
    (["--generation_batch_size", "64"], r"--generation_batch_size is not taken: it counts completions over every "
                                        r"process"),
    (["--num_generation", "4"], r"unknown flag --num_generation \(did you mean --num_generations"),
    (["--nproc_per_node", "2"], r"unknown flag --nproc_per_node \(a launcher flag: give it to the `coati` command"),
])
def test_a_grpo_combination_coati_cannot_honour_is_one_line(argv, message, monkeypatch, capsys):
    line = _refused("grpo", [*GRPO, *argv], monkeypatch, capsys)
    assert re.search(message, line), line


def test_flags_override_the_file_and_launcher_keys_are_the_coati_commands(monkeypatch, tmp_path):
    config = {"learning_rate": 1e-3, "num_processes": 2, "per_device_train_batch_size": 4}   # 4: the default
    args = _parse("sft", [*SFT, "--learning_rate", "2e-3"], monkeypatch, config, tmp_path)
    assert (args.lr, args.batch_size) == (2e-3, 4)
    assert args._run_record.sources["lr"] == "flag --learning_rate" and args._run_record.sources["batch_size"] == \
        "file (per_device_train_batch_size)"


@pytest.mark.parametrize("config, message", [
    ({"learnin_rate": 1e-3}, r"unknown key 'learnin_rate' \(did you mean learning_rate\?\)"),
    ({"accelerate_config": "fsdp.yaml"}, r"key 'accelerate_config' is not taken: coati launches with torchrun"),
    ({"env": {"A": "1"}}, r"key 'env' is not taken: set environment variables in the shell"),
    ({"system_prompt": "Be brief."}, r"key 'system_prompt' is not taken: put the system turn in the data"),
    ({"dataset_prompt_column": "problem"}, r"key 'dataset_prompt_column' is not taken: name the data's prompt column"),
    ({"load_best_model_at_end": True}, r"key 'load_best_model_at_end' takes only false here: coati exports the last "
                                       r"model"),
    ({"data_seed": 3}, r"key 'data_seed' takes only null here: --seed orders the data too"),
    ({"sync_ref_model": True}, r"key 'sync_ref_model' takes only false here: coati's reference model stays the "
                               r"starting model"),
    ({"use_dora": True}, r"key 'use_dora' takes only false here: coati's adapters are plain LoRA"),
    ({"loss_type": "dft"}, r"key 'loss_type' takes only nll here: coati's SFT loss is the negative log-likelihood"),
    ({"deepspeed": "ds_zero3.json"}, r"key 'deepspeed' takes only null here: coati shards with --plugin"),
    ({"fsdp_config": {"min_num_params": 1}}, r"key 'fsdp_config' takes only null here: coati shards with --plugin"),
    ({"vllm_mode": "server"}, r"key 'vllm_mode' takes only colocate here: coati starts a vLLM server beside each "
                              r"rank"),
    ({"generation_batch_size": 64}, r"key 'generation_batch_size' is not taken: it counts completions over every "
                                    r"process; give steps_per_generation"),
    ({"gradient_checkpointing": "yes"}, r"gradient_checkpointing: expected true or false, got 'yes'"),
    ({"learning_rate": [1, 2]}, r"learning_rate: expected one value, got a list of 2"),
    ({"learnin_rate": 1e-3, "seed": 1, "envv": 1, "env": {"A": "1"}},   # every key not taken, in one line
     r"key 'env' is not taken: set environment variables in the shell that runs coati; a config file holds settings "
     r"only; unknown key 'envv'; unknown key 'learnin_rate' \(did you mean learning_rate\?\) \(see"),
])
def test_a_bad_config_key_or_value_is_one_line_naming_the_file(config, message, monkeypatch, capsys, tmp_path):
    line = _refused("sft", SFT, monkeypatch, capsys, config, tmp_path)
    assert re.search(r"--config .*recipe\.yaml: " + message, line), line


PROBE = ("import sys, runpy; target, sys.argv = sys.argv[1], ['coati', *sys.argv[2:]]\ntry:\n    "
         "runpy.run_path(target, run_name='__main__') if target.endswith('.py') else runpy.run_module(target, "
         "run_name='__main__')\nexcept SystemExit as stop:\n    print('exit', stop.code)\nprint('loaded', sorted(m "
         "for m in ('torch', 'colossalai', 'transformers') if m in sys.modules))")
"""Runs a module or a script's path with the arguments that follow, then prints its exit status and which of the
training stack's packages it loaded."""


def _probe(target: str, argv) -> subprocess.CompletedProcess:
    """`target` (`coati.cli.main`, or a script's path) run on `argv` in a fresh interpreter, as `PROBE` reports it."""
    return subprocess.run([sys.executable, "-c", PROBE, target, *argv], capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=60)


def test_an_unknown_key_or_flag_is_answered_at_once_without_the_training_stack(tmp_path):
    (tmp_path / "bad.yaml").write_text("model_name_or_path: m\ndataset_name: d\nlearnig_rate: 1.0e-5\n")
    for argv, wanted in ((["sft", "--config", str(tmp_path / "bad.yaml")], "unknown key 'learnig_rate' (did you mean "
                                                                            "learning_rate?)"),
                         (["grpo", *GRPO, "--per_device_train_batchsize", "8"],
                          "unknown flag --per_device_train_batchsize (did you mean --per_device_train_batch_size ")):
        start = time.monotonic()
        done = _probe("coati.cli.main", argv)
        assert time.monotonic() - start < 5
        assert done.stdout.split("\n")[-3:-1] == ["exit 2", "loaded []"], done.stdout + done.stderr
        assert wanted in done.stderr


@pytest.mark.parametrize("script", ["coati grpo", "train_grpo.py"])
def test_grpo_without_a_reward_is_refused_in_one_line_before_the_training_stack_loads(script, tiny_assets):
    """No reward function, reward model, process reward model or teacher: there is no default reward (one that needs a
    `gt_answer` column would fail mid-run on data without it), so the parse refuses the run, naming each source."""
    data = ["--pretrain", str(tiny_assets["model"]), "--prompt_dataset", str(tiny_assets["prompt_train"])]
    target, argv = ("coati.cli.main", ["grpo", *data]) if script == "coati grpo" else (str(SCRIPTS / script), data)
    done = _probe(target, argv)
    assert done.stdout.split("\n")[-3:-1] == ["exit 2", "loaded []"], done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: GRPO needs a reward: --reward_fn"), lines
    assert all(flag in lines[0] for flag in ("--rm_pretrain", "--prm_pretrain", "--teacher_model", "--teacher_url"))


def test_the_coati_command_lists_its_commands_and_refuses_an_unknown_one():
    listed = _run_coati("--help")
    assert listed.returncode == 0
    assert all(f"\n  {name} " in listed.stdout for name in ("prepare", "sft", "rm", "dpo", "ppo", "grpo"))
    wrong = _run_coati("grop")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "error: unknown command 'grop' (did you mean grpo?); the commands are prepare, sft, rm, dpo, kto, orpo, prm, "
        "ppo, grpo, tiny-model (see coati --help)"]
    assert (Path(sys.executable).parent / "coati").is_file()   # the console script `pip install -e .` installs


def test_launch_flags_and_keys_become_torchrun_or_colossalai_run(tmp_path):
    (tmp_path / "recipe.yaml").write_text("num_processes: 4\nlearning_rate: 1.0e-5\n")
    launch, rest = launch_options(["--config", str(tmp_path / "recipe.yaml"), "--lr", "1", "--nproc_per_node=2"])
    assert launch == {"--nproc_per_node": "2"} and rest == ["--config", str(tmp_path / "recipe.yaml"), "--lr", "1"]
    assert launcher_command("grpo", launch, rest)[1:] == [
        "-m", "coati.cli.torchrun", "--nproc_per_node=2", "--standalone", "--module", "coati.cli.main", "grpo", *rest]
    nodes = {"--nproc_per_node": "8", "--nnodes": "2", "--node_rank": "1", "--master_addr": "10.0.0.1",
             "--master_port": "29500"}
    assert launcher_command("sft", nodes, [])[3:8] == ["--nproc_per_node=8", "--nnodes=2", "--node_rank=1",
                                                        "--master_addr=10.0.0.1", "--master_port=29500"]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1\nnode2\n")
    command = launcher_command("sft", {"--hostfile": str(hostfile), "--nproc_per_node": "8"}, ["--lr", "1"])
    assert command[:6] == ["colossalai", "run", "--hostfile", str(hostfile), "--nproc_per_node", "8"]
    assert command[6].endswith("coati/cli/main.py") and command[7:] == ["sft", "--lr", "1"]
    hostfile.write_text("# the nodes\nnode1\n\nnode2\nnode3\n")   # the memory check's (world size, processes a node)
    assert launched_processes({"--hostfile": str(hostfile), "--nproc_per_node": "8"}) == (24, 8)
    assert launched_processes(nodes) == (16, 8) and launched_processes(launch) == (2, 2)


def test_a_launch_sets_torchruns_one_thread_a_process_itself_so_torchrun_prints_no_note_of_it():
    from coati.cli.main import launch_environment

    assert launch_environment({"--nproc_per_node": "2"}, {"PATH": "/bin"}) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert launch_environment({"--nproc_per_node": "2"}, {"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in launch_environment({"--nproc_per_node": "1"}, {})     # torchrun leaves it too


def test_the_console_line_shows_a_log_steps_numbers_as_trl_users_read_them():
    from coati.utils.metrics_logger import console_line

    metrics = {"train/loss": 0.53214, "train/reward": 0.4125, "train/reward_std": 0.1234, "train/kl": 0.00312,
               "train/learning_rate": 1e-4, "train/reward_p50": 0.5, "eval/rewards/math_answer": 0.625,
               "eval/loss": 1.25}
    assert console_line({**metrics, "train/epoch": 0.4}, 12, 300, 2.1) == (
        "step 12/300 | epoch 0.4 | loss 0.532 | reward 0.412 ± 0.12 | kl 0.00312 | "
                                                   "lr 1.00e-04 | eval/loss 1.25 | eval/rewards/math_answer 0.625 | "
                                                   "2.1 s/step | ETA 0:10:04")
    assert console_line({"train/loss": 1.0, "train/lr": 3e-5}, 4) == "step 4 | loss 1 | lr 3.00e-05"
    assert console_line({"train/loss": 0.5, "train/accuracy": 0.75, "train/lr": 3e-5}, 4) == (   # a reward model's
        "step 4 | loss 0.5 | accuracy 0.75 | lr 3.00e-05")
    assert console_line({"train/loss": 0.5, "train/rewards/accuracies": 0.5}, 4) == "step 4 | loss 0.5 | accuracy 0.5"
    assert console_line({"train/epoch": 1.0}, 4) == ""


def test_a_run_or_checkpoint_folder_stands_for_its_model_with_a_note(tmp_path, capsys):
    from coati.utils.file_checks import model_in_folder

    for folder in (tmp_path / "run" / "model", tmp_path / "ckpt" / "epoch-1_step-4" / "modeling", tmp_path / "plain"):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    assert model_in_folder(str(tmp_path / "plain"), "--pretrain") == str(tmp_path / "plain")
    assert model_in_folder(str(tmp_path / "run"), "--pretrain") == str(tmp_path / "run" / "model")
    assert model_in_folder(str(tmp_path / "ckpt" / "epoch-1_step-4"), "--ref_pretrain") == str(
        tmp_path / "ckpt" / "epoch-1_step-4" / "modeling")
    assert capsys.readouterr().err.splitlines() == [
        f"note: --pretrain {tmp_path / 'run'} is a run or checkpoint folder: using its model {tmp_path / 'run' / 'model'}",
        f"note: --ref_pretrain {tmp_path / 'ckpt' / 'epoch-1_step-4'} is a run or checkpoint folder: using its model "
        f"{tmp_path / 'ckpt' / 'epoch-1_step-4' / 'modeling'}"]


def test_missing_data_is_named_by_its_flag_before_any_preparation_or_split(tmp_path, capsys):
    """A data path that is not there is refused by its flag, also with --eval_split (which would split it)."""
    import argparse

    from coati.cli.preflight import check_run_paths
    from coati.utils.errors import CoatiUsageError

    args = argparse.Namespace(data_type="sft", dataset=[str(tmp_path / "nope.jsonl")], eval_dataset=None,
                              ptx_dataset=None, eval_split=0.1, dataset_flag="--dataset")
    with pytest.raises(CoatiUsageError, match=rf"^--dataset {tmp_path / 'nope.jsonl'} does not exist \(give a JSONL "
                                              r"file, a folder of them, a datasets folder, or a folder `coati "
                                              r"prepare` wrote\)$"):
        check_run_paths(args)


def test_paths_and_flags_are_checked_before_the_training_stack_loads_and_once_before_a_launch(tiny_assets, tmp_path):
    """A missing path is named by its flag, and a flag error is one line, before torch is imported; with
    --nproc_per_node the launcher checks them itself, once, instead of starting processes that each fail."""
    model, missing = str(tiny_assets["model"]), str(tmp_path / "nope.jsonl")
    cases = [
        (["sft", "--pretrain", model, "--dataset", missing],
         f"error: --dataset {missing} does not exist (give a JSONL file, a folder of them, a datasets folder, or a "
         "folder `coati prepare` wrote)"),
        (["sft", "--pretrain", model, "--dataset", missing, "--nproc_per_node", "2"],
         f"error: --dataset {missing} does not exist (give a JSONL file, a folder of them, a datasets folder, or a "
         "folder `coati prepare` wrote)"),
        (["dpo", "--pretrain", str(tmp_path / "no_model"), "--dataset", str(tiny_assets["pref_train"]),
          "--nproc_per_node", "2"], f"error: --pretrain {tmp_path / 'no_model'} does not exist or is not a directory"),
        (["grpo", "--pretrain", model, "--prompt_dataset", str(tiny_assets["prompt_train"]), "--reward_fn",
          "math_answer", "--num_generations", "1", "--nproc_per_node", "2"],
         "error: argument --num_generations: must be >= 2, got 1 (see coati grpo --help)"),
    ]
    for argv, wanted in cases:
        done = _probe("coati.cli.main", argv)
        assert done.stdout.split("\n")[-3:-1] == ["exit 2", "loaded []"], done.stdout + done.stderr
        assert done.stderr.strip().splitlines() == [wanted]


def _sft(tiny_assets, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return _run_coati("sft", "--pretrain", str(tiny_assets["model"]), "--dataset", str(tiny_assets["sft_train"]),
                      "--batch_size", "8", "--accumulation_steps", "2", "--max_epochs", "2", "--log_interval", "3",
                      "--save_dir", str(out / "ckpt"), "--save_interval", "3", "--output_dir", str(out), "--lr", "1e-4",
                      *extra)


@pytest.mark.slow
def test_bars_logs_and_checkpoints_count_epochs_and_steps_alike_and_a_finished_run_says_so(tiny_assets, tmp_path):
    """96 rows in micro-batches of 8, two per optimizer step: 6 steps an epoch, 12 in two. The bar counts the steps
    the log lines count (from the resumed step on a resume), `train/epoch` is Hugging Face's epochs done (1.5: half
    of the second), and a checkpoint folder is named by the whole epochs done; resuming a finished run says so and
    exits 0, training and exporting nothing."""
    first = _sft(tiny_assets, tmp_path, "--max_steps", "6", "--eval_dataset", str(tiny_assets["sft_eval"]),
                 "--eval_steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    evaluated = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evaluated if "eval/loss" in r] == [2, 4, 6]   # every 2 steps; 6 ends the run
    assert "train: 100%" in first.stderr and "| 6/6 [" in first.stderr
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch-0_step-3", "epoch-1_step-6"]
    resumed = _sft(tiny_assets, tmp_path, "--checkpoint_path", "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(r"train:  50%\|\S* *\| 6/12 \[", resumed.stderr)   # the bar starts where the run resumed
    assert "| 12/12 [" in resumed.stderr
    assert [(r["step"], r["train/epoch"]) for r in train_records(tmp_path / "logs")] == [
        (3, 0.5), (6, 1.0), (9, 1.5), (12, 2.0)]
    assert re.search(r"^step 9/12 \| epoch 1\.5 \| loss ", resumed.stdout, re.M)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "epoch-0_step-3", "epoch-1_step-6", "epoch-1_step-9", "epoch-2_step-12"]
    exported = {f.name: f.stat().st_mtime_ns for f in (tmp_path / "model").iterdir()}
    logged = (tmp_path / "logs" / "metrics.jsonl").read_text()
    again = _sft(tiny_assets, tmp_path, "--checkpoint_path", "latest")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == (
        f"the run is finished: {tmp_path / 'ckpt' / 'epoch-2_step-12'} has done 12 of 12 optimizer steps, nothing is "
        f"left to train (raise --max_steps or --max_epochs to train further); its model is in {tmp_path / 'model'}")
    assert {f.name: f.stat().st_mtime_ns for f in (tmp_path / "model").iterdir()} == exported
    assert (tmp_path / "logs" / "metrics.jsonl").read_text() == logged and "train:" not in again.stderr


def test_prompts_longer_than_max_length_keep_their_end_and_are_counted(tiny_assets, tmp_path):
    """A prompt cut to --max_length keeps its last tokens (the question and the generation prompt, as TRL cuts
    prompts), and the preparation's line counts the prompts cut."""
    from transformers import AutoTokenizer

    from coati.dataset.prepare import load_prepared

    rows = [{"prompt": [{"role": "user", "content": "What is " + " + ".join(["1"] * n) + "?"}], "gt_answer": str(n)}
            for n in (1, 30, 40)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _run_coati("prepare", "--type", "prompt", "--data_input_dirs", str(tmp_path / "prompts.jsonl"),
                      "--tokenizer_dir", str(tiny_assets["model"]), "--data_output_dirs", str(tmp_path / "out"),
                      "--max_length", "40")
    assert done.returncode == 0, done.stderr
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    full = [tokenizer.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True) for r in rows]
    assert len(full[0]) <= 40 < len(full[1]) < len(full[2])
    assert load_prepared([str(tmp_path / "out")], "prompt")["input_ids"] == [ids[-40:] for ids in full]
    assert ("3 of 3 valid rows kept, 0 dropped by truncation, 2 prompts longer than 40 tokens cut from the left (their "
            "end kept), 0 invalid rows skipped") in done.stdout


def _split_args(tiny_assets, tmp_path, data, **settings):
    import argparse

    return argparse.Namespace(**{
        "data_type": "sft", "dataset": [str(data)], "eval_dataset": None, "ptx_dataset": None, "eval_split": 0.0,
        "dataset_train_split": "train", "dataset_test_split": None, "dataset_config": None, "dataset_flag": "--dataset",
        "tokenizer_dir": None,
        "pretrain": str(tiny_assets["model"]), "trust_remote_code": False, "max_length": 64, "seed": 42,
        "prepared_cache_dir": str(tmp_path / "cache"), **settings})


def test_a_folder_named_by_split_trains_on_one_split_and_evaluates_on_another_as_trl_reads_it(tiny_assets, tmp_path):
    """`train.jsonl` and `test.jsonl` in one folder, or a saved `datasets` DatasetDict: --dataset_train_split (TRL's
    default, train) is trained on, --dataset_test_split is the held-out data; a split the folder lacks, or a second
    source of held-out data, is one line."""
    from datasets import Dataset, DatasetDict

    from coati.cli.preflight import check_held_out, prepare_raw_data
    from coati.dataset.demo_data import generate_problems, sft_records, write_jsonl
    from coati.dataset.prepare import load_prepared
    from coati.utils.errors import CoatiUsageError

    folder = tmp_path / "jsonl"
    write_jsonl(sft_records(generate_problems(12, "train")), folder / "train.jsonl")
    write_jsonl(sft_records(generate_problems(4, "eval")), folder / "test.jsonl")
    args = _split_args(tiny_assets, tmp_path, folder, dataset_test_split="test")
    prepare_raw_data(args)
    assert (len(load_prepared(args.dataset, "sft")), len(load_prepared(args.eval_dataset, "sft"))) == (12, 4)

    saved = tmp_path / "saved"
    DatasetDict({"train": Dataset.from_list(sft_records(generate_problems(10, "train"))),
                 "validation": Dataset.from_list(sft_records(generate_problems(3, "eval")))}).save_to_disk(str(saved))
    args = _split_args(tiny_assets, tmp_path, saved, dataset_test_split="validation")
    prepare_raw_data(args)
    assert (len(load_prepared(args.dataset, "sft")), len(load_prepared(args.eval_dataset, "sft"))) == (10, 3)

    with pytest.raises(CoatiUsageError, match=rf"^--dataset: {folder} has no split 'validation': its files make the "
                                              r"splits test, train$"):
        prepare_raw_data(_split_args(tiny_assets, tmp_path, folder, dataset_test_split="validation"))
    with pytest.raises(CoatiUsageError, match=rf"^--dataset: {folder / 'train.jsonl'} is one file, with no 'test' split: "
                                              r"hold part of it out with --eval_split FRACTION, or give --eval_dataset$"):
        prepare_raw_data(_split_args(tiny_assets, tmp_path, folder / "train.jsonl", dataset_test_split="test"))
    plain = tmp_path / "plain"
    write_jsonl(sft_records(generate_problems(6, "train")), plain / "rows.jsonl")
    with pytest.raises(CoatiUsageError, match=rf"^--dataset: {plain}: its files are not named by split"):
        prepare_raw_data(_split_args(tiny_assets, tmp_path, plain, dataset_test_split="test"))
    with pytest.raises(CoatiUsageError, match=r"^--eval_split and --dataset_test_split: give the held-out data one way"):
        check_held_out(_split_args(tiny_assets, tmp_path, folder, dataset_test_split="test", eval_split=0.1))
    with pytest.raises(CoatiUsageError, match=rf"^--dataset_test_split test names a split of raw data; --dataset "
                                              rf"{tiny_assets['sft_train']} is prepared already"):
        prepare_raw_data(_split_args(tiny_assets, tmp_path, tiny_assets["sft_train"], dataset_test_split="test"))


HUB_CONFIGS = """---
configs:
- config_name: all
  data_files:
  - {split: train, path: all/train-*}
  - {split: test, path: all/test-*}
- config_name: short
  data_files:
  - {split: train, path: short/train-*}
---
"""
"""A Hub dataset's README declaring two configurations (as HuggingFaceTB/smoltalk's and openai/gsm8k's do)."""


def test_dataset_config_reads_one_configuration_of_a_hub_dataset_folder(tiny_assets, tmp_path):
    """TRL's `dataset_config` (load_dataset's name): the configuration's split is trained on, its test split held
    out; without it, or naming none of the folder's, one line lists the configurations."""
    from datasets import Dataset

    from coati.cli.preflight import prepare_raw_data
    from coati.dataset.demo_data import generate_problems, sft_records
    from coati.dataset.prepare import load_prepared
    from coati.utils.errors import CoatiUsageError

    folder = tmp_path / "hub"
    (folder / "all").mkdir(parents=True)
    (folder / "short").mkdir()
    (folder / "README.md").write_text(HUB_CONFIGS)
    for part, rows in (("all/train", 9), ("all/test", 3), ("short/train", 5)):
        split = "eval" if part.endswith("test") else "train"
        Dataset.from_list(sft_records(generate_problems(rows, split))).to_parquet(str(folder / f"{part}-0.parquet"))
    args = _split_args(tiny_assets, tmp_path, folder, dataset_config="all", dataset_test_split="test")
    prepare_raw_data(args)
    assert (len(load_prepared(args.dataset, "sft")), len(load_prepared(args.eval_dataset, "sft"))) == (9, 3)
    args = _split_args(tiny_assets, tmp_path, folder, dataset_config="short")
    prepare_raw_data(args)
    assert len(load_prepared(args.dataset, "sft")) == 5
    with pytest.raises(CoatiUsageError, match=rf"^--dataset: {folder} has configurations \(all, short\): choose one "
                                              r"with --dataset_config NAME$"):
        prepare_raw_data(_split_args(tiny_assets, tmp_path, folder))
    with pytest.raises(CoatiUsageError, match=rf"^--dataset: {folder} has no configuration 'long' "
                                              r"\(--dataset_config\); it has all, short$"):
        prepare_raw_data(_split_args(tiny_assets, tmp_path, folder, dataset_config="long"))


OPEN_R1_SFT = """
# an SFT recipe as TRL's and open-r1's are written
model_name_or_path: {model}
model_revision: main
torch_dtype: bfloat16
attn_implementation: sdpa
dataset_name: {data}
dataset_num_proc: 4
bf16: true
do_eval: false
eval_strategy: 'no'
gradient_accumulation_steps: 2
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
learning_rate: 4.0e-05
log_level: info
logging_steps: 5
logging_strategy: steps
lr_scheduler_type: cosine
packing: true
max_length: 512
max_steps: -1
num_train_epochs: 3
output_dir: {out}
overwrite_output_dir: true
per_device_eval_batch_size: 8
per_device_train_batch_size: 4
push_to_hub: false
report_to:
- tensorboard
save_strategy: epoch
save_total_limit: 1
seed: 42
use_liger_kernel: false
warmup_ratio: 0.05
"""


def test_verl_style_overrides_set_a_sections_setting_between_the_file_and_the_flags(monkeypatch, tmp_path):
    """`section.key=value` (and `key=value`) after the command, as verl's Hydra overrides are written: they override
    the file and the flags override them; a flag's own values (`--reward_fn`, `--lr_scheduler_option`) stay its own."""
    config = {"learning_rate": 1e-3, "report_to": ["none"], "num_generations": 8}
    args = _parse("grpo", [*GRPO, "optim.lr=2e-3", "rollout.num_generations=4", "seed=3"], monkeypatch, config,
                  tmp_path)
    assert (args.lr, args.num_generations, args.seed, args.report_to) == (2e-3, 4, 3, ["none"])
    args = _parse("grpo", [*GRPO, "optim.lr=2e-3", "--lr", "3e-3"], monkeypatch, config, tmp_path)
    assert args.lr == 3e-3
    args = _parse("grpo", [*GRPO, "--no_packing", "shuffle_dataset=true"], monkeypatch)   # a TRL key, after HF's --no_X
    assert args.packing is False
    args = _parse("grpo", [*MODEL_AND_DATA, "--reward_fn", "math_answer", "optim.learning_rate=1e-6",
                           "--lr_scheduler", "cosine_with_min_lr", "--lr_scheduler_option", "min_lr_rate=0.1"],
                  monkeypatch)
    assert (args.reward_fn, args.lr, args.lr_scheduler_option) == (["math_answer"], 1e-6, [("min_lr_rate", 0.1)])


def test_trls_sft_packing_resume_and_logging_keep_trls_meaning(monkeypatch, capsys, tmp_path):
    """TRL's SFT `packing` packs `per_device_train_batch_size` sequences of `max_length` tokens per micro-batch (coati:
    a token budget; `padding_free` alone concatenates the batch's rows); `resume_from_checkpoint: true` looks in (and
    saves to) OUTPUT_DIR/checkpoints; a GRPO `logging_steps` finer than an episode logs every episode, saying so."""
    def sft(config):
        return _parse("sft", SFT, monkeypatch, {"output_dir": str(tmp_path / "out"), **config}, tmp_path)

    args = sft({"packing": True, "per_device_train_batch_size": 8, "max_length": 512})
    assert (args.packing, args.max_tokens_per_batch) == (True, 8 * 512)
    assert sft({"packing": True, "per_device_train_batch_size": 8}).max_tokens_per_batch == 8 * 1024   # TRL's length
    args = sft({"padding_free": True, "per_device_train_batch_size": 8})
    assert (args.packing, args.max_tokens_per_batch, args.batch_size) == (True, 0, 8)
    args = sft({"resume_from_checkpoint": True})
    assert (args.checkpoint_path, args.save_dir) == ("latest", str(tmp_path / "out" / "checkpoints"))
    capsys.readouterr()
    args = _parse("grpo", [*GRPO, "--batch_size", "2", "--num_generations", "4", "--train_batch_size", "4",
                           "--logging_steps", "1", "+optim.lr=2e-6"], monkeypatch)
    assert (args.log_interval, args.lr) == (1, 2e-6)
    assert capsys.readouterr().err.strip() == ("note: --logging_steps 1: an episode here makes 2 optimizer steps, so "
                                               "the run logs every 1 episode (2 optimizer steps)")
    _parse("grpo", [*GRPO, "--loss_type", "cispo"], monkeypatch)
    assert "--loss_type cispo without --epsilon_high: TRL caps the importance weight at epsilon, coati at 1 + " \
           "--clip_eps_high (1.2)" in capsys.readouterr().err
    _parse("sft", SFT, monkeypatch, {"model_init_kwargs": {"torch_dtype": "bfloat16"}}, tmp_path)
    assert "not used: model_init_kwargs (torch_dtype: coati loads in fp32" in capsys.readouterr().err


def test_trl_116s_dpo_loss_list_is_the_loss_with_rpo_alpha_for_its_sft_term(monkeypatch, capsys, tmp_path):
    """TRL 1.16 has no rpo_alpha: RPO is `loss_type: [sigmoid, sft]` with `loss_weights: [1.0, alpha]`."""
    args = _parse("dpo", SFT, monkeypatch, {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}, tmp_path)
    assert (args.loss_type, args.rpo_alpha) == ("sigmoid", 0.5)
    args = _parse("dpo", SFT, monkeypatch, {"loss_type": ["ipo"]}, tmp_path)
    assert (args.loss_type, args.rpo_alpha) == ("ipo", 0.0)
    assert _parse("dpo", [*SFT, "--loss_type", "sigmoid", "sft"], monkeypatch).rpo_alpha == 1.0   # TRL's weights: 1
    for config, message in (({"loss_type": ["sigmoid", "ipo"]}, "--loss_type sigmoid ipo: coati's DPO trains one "
                                                                "preference loss, with TRL's sft beside it as "
                                                                "--rpo_alpha"),
                            ({"loss_type": ["sigmoid", "sft"], "loss_weights": [2.0, 1.0]},
                             "--loss_weights: sigmoid's weight is 2; coati's is 1")):
        assert message in _refused("dpo", SFT, monkeypatch, capsys, config, tmp_path)


@pytest.mark.parametrize("off", [["--no_gradient_checkpointing", "--packing", "false"],
                                 ["--gradient_checkpointing=False", "batching.packing=false"],
                                 ["model.grad_checkpoint=false", "--no_packing"]])
def test_a_switch_the_file_turns_on_is_turned_off_on_the_command_line(off, monkeypatch, tmp_path):
    """HF's `--no_X`, `--X false` and an override's `false` undo a config file's `true` (before, they were dropped
    as the switch's default, and the file's `true` stayed); `--X true` is still the switch."""
    config = {"gradient_checkpointing": True, "packing": True}
    args = _parse("sft", [*SFT, *off], monkeypatch, config, tmp_path)
    assert (args.grad_checkpoint, args.packing) == (False, False)
    assert args._run_record.sources["grad_checkpoint"] == ("override model.grad_checkpoint" if
                                                           "model.grad_checkpoint=false" in off else
                                                           "flag --grad_checkpoint")
    args = _parse("sft", [*SFT, "--packing", "true", "optim.lr=0.1"], monkeypatch, {"packing": False}, tmp_path)
    assert (args.packing, args.lr) == (True, 0.1)


@pytest.mark.parametrize("argv, message", [
    (["grpo.yaml"], r"unexpected argument 'grpo.yaml': a config file is given as --config grpo.yaml"),
    (["--packing", "maybe"], r"--packing maybe: a switch takes true or false, or nothing"),
    (["foo"], r"unexpected argument 'foo': settings are flags \(--name value\) or keys of a --config file, or "
              r"section\.key=value"),
    (["optm.lr=3"], r"unexpected argument 'optm.lr=3': 'optm' is no section of this command's settings \(did you "
                    r"mean optim\?\); its sections: actor_loss, algorithm, "),
    (["optim.lrr=3"], r"section\.key=value overrides: unknown key 'optim\.lrr' \(did you mean lr\?\)"),
    (["model.lr=3"], r"section\.key=value overrides: model\.lr is a setting of section 'optim', not 'model'"),
])
def test_an_argument_no_flag_takes_is_one_line_naming_what_to_give(argv, message, monkeypatch, capsys, tmp_path):
    """Before, a stray argument joined the file's last list (`report_to: none` took it as a second target)."""
    line = _refused("grpo", [*argv, *GRPO], monkeypatch, capsys, {"report_to": ["none"]}, tmp_path)
    assert re.search(message, line), line


def test_trl_keys_at_the_one_value_coati_matches_are_noted_as_files_and_as_flags(monkeypatch, capsys, tmp_path):
    """A recipe that writes out TRL's defaults (every key of `ONE_VALUE_KEYS` at its value, and the flags a TRL
    command line gives) runs as without them, each named in the note of keys that change nothing."""
    from coati.cli.trl_keys import ONE_VALUE_KEYS

    config = {key: value for key, (value, _) in ONE_VALUE_KEYS.items()}
    plain = _parse("grpo", GRPO, monkeypatch)
    capsys.readouterr()
    args = _parse("grpo", [*GRPO, "--shuffle_dataset", "true", "--vllm_mode=colocate", "--no_torch_compile",
                           "--hub_token", "abc"], monkeypatch, config, tmp_path)
    assert {k: v for k, v in vars(args).items() if k not in ("config", "_run_record")} == \
        {k: v for k, v in vars(plain).items() if k not in ("config", "_run_record")}
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 2 and all(f" {key} (" in notes[1] for key in ONE_VALUE_KEYS), notes
    assert notes[0] == ("note: not used: --shuffle_dataset (coati shuffles the training data every epoch (by --seed)); "
                        "--vllm_mode (coati starts a vLLM server beside each rank, on its GPU (--rollout_backend vllm, "
                        "--vllm_gpu_memory_utilization); TRL's separate `trl vllm-serve` is not used); --torch_compile "
                        "(coati does not compile the model); --hub_token (coati does not upload)")


def test_a_trl_sft_recipe_as_written_is_taken_with_one_note_for_the_keys_that_change_nothing(monkeypatch, capsys,
                                                                                           tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(OPEN_R1_SFT.format(model="m", data="d", out=tmp_path / "out"))
    args = parsed_args("sft", ["--config", str(path)], monkeypatch)
    assert {k: getattr(args, k) for k in ("lr", "accumulation_steps", "max_epochs", "max_steps", "packing", "keep_last",
                                          "save_freq_epochs", "save_dir", "eval_batch_size", "grad_checkpoint",
                                          "warmup_ratio", "mixed_precision")} == {
        "lr": 4e-5, "accumulation_steps": 2, "max_epochs": 3, "max_steps": 0, "packing": True, "keep_last": 1,
        "save_freq_epochs": 1, "save_dir": str(tmp_path / "out" / "checkpoints"), "eval_batch_size": 8,
        "grad_checkpoint": True, "warmup_ratio": 0.05, "mixed_precision": "bf16"}
    assert capsys.readouterr().err.strip().splitlines() == [
        f"note: --config {path}: not used: model_revision (the model folder (or a model id's local snapshot) is loaded "
        "as it is); torch_dtype (coati loads in fp32 and trains in --mixed_precision (bf16 by default on GPU)); "
        "attn_implementation (coati picks SDPA, or FlashAttention with --use_flash_attn); dataset_num_proc (data is "
        "tokenized once and cached); do_eval (evaluation follows the held-out data and eval_strategy); "
        "gradient_checkpointing_kwargs (coati's checkpointing is non-reentrant (use_reentrant: false)); log_level "
        "(coati prints what a run does); overwrite_output_dir (coati writes into the output folder as it is); "
        "push_to_hub (coati does not upload: push OUTPUT_DIR/model with huggingface-cli upload); use_liger_kernel "
        "(coati has no Liger kernels)"]


@pytest.mark.parametrize("argv, wanted", [
    (["--adv_option", "typo=3"], "error: --adv_option: advantage estimator 'grpo' takes no option 'typo'; its "
                                 "options: none (see coati grpo --help)"),
    (["--adv_estimator", "maxent", "--adv_option", "tua=0.5"], "error: --adv_option: advantage estimator 'maxent' takes "
                                                               "no option 'tua'; its options: tau (see coati grpo --help)"),
    (["--objective_option", "typo=1"], "error: --objective_option: objective 'policy_gradient' takes no option 'typo'; "
                                       "its options: none (see coati grpo --help)"),
    (["--policy_loss", "sapo", "--policy_loss_option", "temperature=1"],
     "error: --policy_loss_option: policy loss 'sapo' takes no option 'temperature'; its options: temperature_pos, "
     "temperature_neg (see coati grpo --help)"),
], ids=["adv", "maxent", "objective", "sapo"])
def test_an_option_a_registered_part_does_not_take_is_one_line_before_the_training_stack_loads(argv, wanted):
    done = _probe("coati.cli.main", ["grpo", *GRPO, *argv])
    assert done.stdout.split("\n")[-3:-1] == ["exit 2", "loaded []"], done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [wanted]


def test_prepared_prompts_that_max_length_cuts_at_batching_time_are_noted(capsys):
    """Prompts prepared longer than --max_length are cut (from the left) by the collator: the run says how many."""
    from datasets import Dataset

    from coati.cli.rl_runner import _note_cut_prompts

    rows = Dataset.from_dict({"input_ids": [[1] * 3, [1] * 10, [1] * 12]})
    _note_cut_prompts(rows, 8)
    _note_cut_prompts(rows, 0)    # no limit: nothing is cut
    _note_cut_prompts(rows, 12)
    assert capsys.readouterr().err.splitlines() == [
        "note: 2 of 3 prompts are longer than --max_length 8 tokens: they are cut from the left, their end kept"]


def test_a_launched_runs_failure_ends_with_the_failing_processs_line_and_status(tmp_path):
    """What `coati.cli.torchrun` adds to the processes' own output, and the status it exits with."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from coati.cli.torchrun import exit_status, failure_line

    def failed(local_rank, exitcode, message=None):
        error_file = tmp_path / f"error_{local_rank}.json"
        if message:
            error_file.write_text(json.dumps({"message": message, "timestamp": 1}))
        return ChildFailedError("coati", {local_rank: ProcessFailure(local_rank, 100 + local_rank, exitcode,
                                                                     str(error_file))})

    killed = failed(1, -9)
    assert failure_line(killed).startswith("error: the training process of rank 1 was killed by SIGKILL")
    assert exit_status(killed) == 137
    assert failure_line(failed(0, 2, "error: --lr 0 ...")) == ""                 # the first process said it
    assert failure_line(failed(1, 2, "error: only rank 1 saw this")) == "error: only rank 1 saw this"
    assert failure_line(failed(1, 1, "RuntimeError: boom")) == ""                 # its traceback is on the screen
    assert exit_status(failed(1, 2, "error: x")) == 2


def test_disable_dropout_and_tf32_reach_the_model_and_torch(monkeypatch, tiny_assets):
    import torch

    from coati.cli.runner import prepare_model
    from coati.distributed.plugins import allow_tf32

    from transformers import AutoConfig, AutoModelForCausalLM

    args = _parse("sft", ["--pretrain", str(tiny_assets["model"]), "--dataset", "d", "--disable_dropout"], monkeypatch)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_assets["model"]))
    model.model.dropout = torch.nn.Dropout(0.3)          # a dropout layer, as many models have
    assert prepare_model(model, args, None).model.dropout.p == 0.0
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        allow_tf32(False)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before   # torch's own
        allow_tf32(True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_a_launch_of_several_nodes_says_that_it_waits_for_them_and_where():
    """torchrun prints nothing while a node waits for the others: the `coati` command says so first (verl's
    `trainer.nnodes=2` on one machine looked like a hang)."""
    assert rendezvous_note({"--nnodes": "2", "--node_rank": "1", "--master_addr": "node0"}) == (
        "node 1 of 2: waiting for every node to join at node0:29500 (each node runs this command with its own "
        "--node_rank, and --master_addr naming node 0)")
    assert rendezvous_note({"--nnodes": "3"}).startswith("node 0 of 3: waiting for every node to join at 127.0.0.1:29500")
    assert rendezvous_note({"--nproc_per_node": "2"}) is None and rendezvous_note({"--nnodes": "1"}) is None


def test_precomputing_the_reference_for_a_loss_without_one_is_noted(monkeypatch, capsys):
    parsed_args("dpo", ["--pretrain", "m", "--dataset", "d", "--loss_type", "simpo", "--precompute_ref_logps"],
                monkeypatch)
    assert "--precompute_ref_logps: this loss (simpo) uses no reference model, so there is nothing to precompute" in \
        capsys.readouterr().err
