"""The checks of an on-policy run that read what its flags name, before any model loads: process reward models, the
teacher's vocabulary, the agent's chat template and prompt rows, the plugin, the vLLM environment; and the whole
sequence (`check_on_policy_flags`), which also builds the parts that refuse their own flags. The checks across settings
alone are the run config's (`coati.run_config.validate`)."""
import argparse
import json
import os
from pathlib import Path

from coati.dataset.prepare import load_prepared
from coati.dataset.tokenization import load_tokenizer
from coati.experience.distillation import check_served_vocabulary, check_vocabulary, served_model_name
from coati.inference.vllm import default_vllm_python
from coati.models.prm import is_prm_folder
from coati.distributed.memory import head_dim
from coati.distributed.plugins import CUDA_ONLY, check_first_forward
from coati.rollout.chat import check_appending
from coati.rollout.multiturn import conversation
from coati.rollout.tools import resolve_tools, row_tools
from coati.utils.errors import CoatiUsageError, warn_user

from coati.trainer.onpolicy import OLTrainer

from .rl_parts import (adapter_sync_blocker, chat_tokens, check_model_source, has_teacher, health_monitor,
                       policy_loss, reward_fn)
from .options import errors_named_as_given
from .preflight import run_tokenizer
from .runner import check_model_kind


def check_prm(args: argparse.Namespace) -> None:
    """Before any model loads: `--prm_pretrain` is a PRM."""
    if args.prm_pretrain and not is_prm_folder(args.prm_pretrain):
        raise CoatiUsageError(f"--prm_pretrain {args.prm_pretrain} is not a process reward model (a token classifier, "
                              "as train_prm.py exports one)")


def check_distillation(args: argparse.Namespace) -> None:
    """Before any model loads: the teacher's source is usable and its tokenizer (where it has one) shares the policy's
    vocabulary (`DistillSettings.check` has checked the flags themselves)."""
    if not has_teacher(args):
        return
    check_model_source("teacher", args.teacher_url, args.teacher_model)
    policy = run_tokenizer(args)
    if args.teacher_url:
        name = args.teacher_model_name or served_model_name(args.teacher_url)
        if not check_served_vocabulary(args.teacher_url, name, policy):
            warn_user(f"--teacher_url {args.teacher_url} has no /tokenize, so its vocabulary could not be compared "
                      "with the policy's; it must be the same")
        return
    own = any((Path(args.teacher_model) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    teacher = load_tokenizer(args.teacher_model, args.trust_remote_code).get_vocab() if own else None
    check_vocabulary(teacher, policy.get_vocab(), args.teacher_model)


def check_agent(args: argparse.Namespace) -> None:
    """With `--tools` or `--agent`, before any model loads: the chat template shows the tools and renders by
    appending, and the prompt rows are conversations whose own `tools` name tools `--tools` implements."""
    if not (args.tools or args.agent):
        return
    tokenizer = run_tokenizer(args)
    check_appending(chat_tokens(args, tokenizer))
    tools = resolve_tools(args.tools)
    for flag, paths in (("--prompt_dataset", args.dataset), ("--eval_dataset", args.eval_dataset)):
        for index, row in enumerate(load_prepared(paths, "prompt") if paths else []):
            try:
                if not args.agent:   # an agent offers its own tools, whatever the row's column says
                    row_tools(row, tools)
                conversation(row)
            except ValueError as error:
                raise CoatiUsageError(f"{flag} row {index}: {error}") from None


def check_run(args: argparse.Namespace) -> None:
    """After preflight, before any model loads: the plugin suits on-policy training, the agent's set-up holds, and
    the reward functions find the columns they take in the (prepared) prompt data."""
    check_first_forward(args.plugin, OLTrainer.no_grad_forward_first)
    check_agent(args)
    check_reward_columns(args)


def check_reward_columns(args: argparse.Namespace) -> None:
    """Each of your reward functions' required parameters is a column of the training and held-out prompts."""
    rewards = reward_fn(args, serve=False)
    for name in ("dataset", "eval_dataset"):
        if rewards is not None and getattr(args, name, None):
            columns = [c for c in load_prepared(getattr(args, name), "prompt").column_names if not c.endswith("input_ids")]
            rewards.check_columns(columns, f"the data of {'--prompt_dataset' if name == 'dataset' else '--eval_dataset'}")


def check_backend(args: argparse.Namespace) -> None:
    """`--rollout_backend vllm` needs an interpreter to run vLLM with and weights it can be handed whole."""
    if args.rollout_backend != "vllm":
        return
    python = args.vllm_python or default_vllm_python()
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise CoatiUsageError(f"--rollout_backend vllm: no Python interpreter at {python}; build vLLM's environment with "
                              "`make vllm-env`, or name one that has vLLM with --vllm_python")
    adapter_sync_blocker(args)   # --vllm_lora_sync adapter where vLLM cannot serve adapters is refused here
    _check_vllm_cpu_heads(args.pretrain, args.plugin)


VLLM_CPU_MIN_HEAD_DIM = 32
"""The smallest attention head vLLM's CPU attention takes (0.32); a smaller one fails at the server's first request."""


def _check_vllm_cpu_heads(pretrain: str, plugin: str) -> None:
    """On a machine without CUDA (vLLM's CPU build), a model whose heads are smaller than its CPU attention takes is
    refused before the servers start, not a minute later at their first request (a CUDA plugin's own refusal, which
    preflight says, comes first)."""
    import torch

    config = Path(pretrain) / "config.json"
    if torch.cuda.is_available() or plugin in CUDA_ONLY or not config.is_file():
        return
    size = head_dim(json.loads(config.read_text()))
    if size < VLLM_CPU_MIN_HEAD_DIM:
        raise CoatiUsageError(f"--rollout_backend vllm: vLLM on the CPU takes attention heads of {VLLM_CPU_MIN_HEAD_DIM} "
                              f"and up, and --pretrain {pretrain} has heads of {size}; use --rollout_backend hf (the "
                              "default) for this model")


def check_on_policy_flags(args: argparse.Namespace) -> None:
    """What GRPO and PPO both check before anything loads, beyond their run config's own checks
    (`coati.run_config.validate`): the files and programs the flags name. Building the reward, the health monitor
    and the policy loss refuses their own flags (an unknown or unimportable reward function among them). What a
    vision-language policy cannot take is said first, before a teacher's or judge's URL is asked. A refusal names
    each setting as the user gave it (a TRL or verl key)."""
    with errors_named_as_given(args):
        check_model_kind(args)
        check_distillation(args)
        check_prm(args)
        reward_fn(args, serve=False)
        health_monitor(args)
        policy_loss(args)
        check_backend(args)


