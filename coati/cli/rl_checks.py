"""The checks an on-policy run's flags pass before anything loads where one setting's meaning depends on another's
(process reward models, distillation, agents, --save_best, KL control, the plugin, asynchronous rollouts, the vLLM
backend), and the whole sequence for each algorithm (`check_grpo_flags`, `check_ppo_flags`), which also builds the
parts that refuse their own flags."""
import argparse
import os
from pathlib import Path

from coati.dataset.prepare import load_prepared
from coati.dataset.tokenization import load_tokenizer
from coati.experience.distillation import check_served_vocabulary, check_vocabulary, served_model_name
from coati.inference.vllm import default_vllm_python
from coati.models.prm import is_prm_folder
from coati.distributed.plugins import check_first_forward
from coati.rollout.chat import check_appending
from coati.rollout.environment import row_tools
from coati.rollout.multiturn import conversation
from coati.rollout.tools import resolve_tools
from coati.utils.errors import CoatiUsageError, warn_user

from coati.trainer.onpolicy import OLTrainer

from .rl_parts import (adapter_sync_blocker, chat_tokens, check_model_source, has_teacher, health_monitor,
                       policy_loss, reward_fn, reward_specs, with_template)


def check_prm(args: argparse.Namespace, grpo: bool) -> None:
    """Before any model loads: `--prm_pretrain` is a PRM, and GRPO reads its scores through the process estimator."""
    if args.prm_pretrain and not is_prm_folder(args.prm_pretrain):
        raise CoatiUsageError(f"--prm_pretrain {args.prm_pretrain} is not a process reward model (a token classifier, "
                              "as train_prm.py exports one)")
    if not grpo:
        return
    if args.prm_pretrain and args.adv_estimator != "process":
        raise CoatiUsageError(f"--prm_pretrain: GRPO reads step scores through --adv_estimator process, not "
                              f"{args.adv_estimator}; add --adv_estimator process")
    if args.adv_estimator == "process" and not args.prm_pretrain:
        raise CoatiUsageError("--adv_estimator process needs step scores: --prm_pretrain (a train_prm.py model)")


def check_distillation(args: argparse.Namespace) -> None:
    """Before any model loads: the distillation flags come with a teacher that is used, and its tokenizer (where it
    has one) shares the policy's vocabulary."""
    if args.teacher_model and args.teacher_url:
        raise CoatiUsageError("--teacher_model and --teacher_url: give one teacher, a folder or a served one")
    if not has_teacher(args):
        if args.distill_loss:
            raise CoatiUsageError("--distill_loss needs a teacher: --teacher_model or --teacher_url")
        return
    if args.distill_coef == 0 and not args.distill_loss:
        raise CoatiUsageError(f"{'--teacher_url' if args.teacher_url else '--teacher_model'} with --distill_coef 0 and "
                              "no --distill_loss: the teacher would not be used; give one of them")
    check_model_source("teacher", args.teacher_url, args.teacher_model)
    policy = load_tokenizer(args.tokenizer_dir or args.pretrain, args.trust_remote_code)
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
    if args.agent and args.tools:
        raise CoatiUsageError("--agent runs your own agent program, which calls its own tools; leave out --tools")
    if not (args.tools or args.agent):
        return
    tokenizer = with_template(args, load_tokenizer(args.tokenizer_dir or args.pretrain, args.trust_remote_code))
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


def check_save_best(args: argparse.Namespace) -> None:
    if not args.save_best:
        return
    if not args.eval_dataset:
        raise CoatiUsageError(f"--save_best {args.save_best} compares evaluations: give --eval_dataset")
    if not (args.output_dir or args.save_dir):
        raise CoatiUsageError(f"--save_best {args.save_best} needs --output_dir (the best model goes to its best/)")
    if args.lora_rank:
        raise CoatiUsageError("--save_best does not support --lora_rank yet (exporting merges the adapters)")


def check_kl_control(args: argparse.Namespace) -> None:
    if args.kl_target > 0 and args.kl_coef <= 0:
        raise CoatiUsageError(f"--kl_target {args.kl_target} adapts --kl_coef, which must start above 0 (it is "
                              f"{args.kl_coef}; adaptive KL multiplies it)")


def check_run(args: argparse.Namespace) -> None:
    """After preflight, before any model loads: the plugin suits on-policy training, and the agent's set-up holds."""
    check_plugin(args)
    check_agent(args)


def check_plugin(args: argparse.Namespace) -> None:
    check_first_forward(args.plugin, OLTrainer.no_grad_forward_first)
    if args.pp > 1:
        raise CoatiUsageError("--pp > 1 (pipeline parallelism) is not supported by on-policy trainers (generation and "
                              "the critic run whole models); use --tp/--sp with --zero_stage for the 3d plugin")


def check_async(args: argparse.Namespace) -> None:
    if args.dynamic_sampling:
        raise CoatiUsageError("--dynamic_sampling works with synchronous rollouts only for now; with --async_rollout "
                              "use --drop_tied_groups, which masks tied groups out of the loss")
    if args.plugin not in ("ddp", "zero2", "zero2_cpu"):
        raise CoatiUsageError(f"--async_rollout supports --plugin ddp, zero2 and zero2_cpu, whose ranks hold whole "
                              f"parameters; the generators run beside rank 0, which publishes alone, and {args.plugin} "
                              "would need every rank to gather its shards at each publish")


def check_backend(args: argparse.Namespace) -> None:
    """`--rollout_backend vllm` needs an interpreter to run vLLM with and weights it can be handed whole."""
    if args.rollout_backend != "vllm":
        return
    python = args.vllm_python or default_vllm_python()
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise CoatiUsageError(f"--rollout_backend vllm: no Python interpreter at {python}; build vLLM's environment with "
                              "`make vllm-env`, or name one that has vLLM with --vllm_python")
    adapter_sync_blocker(args)   # --vllm_lora_sync adapter where vLLM cannot serve adapters is refused here


def check_on_policy_flags(args: argparse.Namespace, grpo: bool) -> None:
    """What GRPO and PPO both check before anything loads; building the reward, the health monitor and the policy
    loss refuses their own flags (an unknown or unimportable reward function among them)."""
    check_distillation(args)
    check_prm(args, grpo)
    reward_fn(args, serve=False)
    check_kl_control(args)
    check_save_best(args)
    health_monitor(args)
    policy_loss(args)


def check_grpo_flags(args: argparse.Namespace) -> None:
    """GRPO's flags, before anything loads."""
    check_on_policy_flags(args, grpo=True)
    if "overlong" in args.reward_shaping and args.overlong_buffer_len > args.max_new_tokens:
        raise CoatiUsageError(f"--overlong_buffer_len {args.overlong_buffer_len} must be at most --max_new_tokens "
                              f"{args.max_new_tokens}: the penalty grows over the last tokens before that limit")
    if args.partial_rollout_tokens and not args.async_rollout:
        raise CoatiUsageError("--partial_rollout_tokens needs --async_rollout: a synchronous run updates the weights "
                              "between batches, with no generation running")
    if args.async_rollout:
        check_async(args)
    check_backend(args)


def check_ppo_flags(args: argparse.Namespace) -> None:
    """PPO's flags, before anything loads: it needs a reward (the parser does not require one, as GRPO's does)."""
    if not args.rm_pretrain and not args.prm_pretrain and not has_teacher(args) and not reward_specs(args):
        raise CoatiUsageError("PPO needs a reward: --rm_pretrain (a trained reward model), --prm_pretrain (a process "
                              "reward model) and/or --reward_fn, or a distillation teacher (--teacher_model or "
                              "--teacher_url)")
    check_on_policy_flags(args, grpo=False)
    check_backend(args)
