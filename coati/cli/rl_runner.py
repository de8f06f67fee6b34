"""The set-up on-policy scripts share: prompts, actor, reference, engine, reward, trainer, export.

`run_grpo` and `run_ppo` differ only in their experience maker and trainer (and PPO's critic); everything
else is `_run`.
"""
import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from coati.dataset.collators import PromptCollator, SupervisedCollator
from coati.dataset.prepare import load_prepared
from coati.dataset.sampler import row_tokens
from coati.dataset.tokenization import load_tokenizer
from coati.experience.controllers import KLController, TemperatureController
from coati.experience.distillation import (DistillConfig, ModelTeacher, ServedTeacher, Teacher,
                                           check_served_vocabulary, check_vocabulary, served_model_name)
from coati.experience.experience import GRPOExperienceMaker, PPOExperienceMaker
from coati.experience.scorer import Scorer
from coati.config import (AsyncSettings, BackendSettings, CriticSettings, GRPOConfig, JudgeSettings, KLSettings,
                          OnPolicyConfig, PPOConfig, RolloutConfig)
from coati.inference.local_judge import JudgeServerConfig, LocalJudge
from coati.inference.vllm import VLLMConfig, VLLMPool, default_vllm_python
from coati.inference.vllm_server import VLLM_LORA_RANKS
from coati.models.critic import load_critic
from coati.models.generation import HFEngine
from coati.models.loss import PolicyLoss
from coati.models.packing import enable_packed_attention
from coati.models.prm import StepScorer, is_prm_folder, load_frozen_prm
from coati.models.reward_model import load_reward_model
from coati.rewards import BUILTIN, WeightedReward
from coati.rewards.code import CodeTests
from coati.rewards.judge import DEFAULT_RUBRIC, LLMJudge, check_rubric, judge_token
from coati.rewards.registry import split_spec
from coati.rewards.remote import RemoteReward, is_url
from coati.rewards.sandbox import SandboxError, SandboxLimits, resolve_backend
from coati.utils.comm import rank, world_size
from coati.distributed.plugins import build_booster, check_first_forward
from coati.rollout import GeneratorPool, PromptStream, RLVRWorkflow, RolloutWorkflow, WorkflowExecutor
from coati.rollout.agent import AgentWorkflow
from coati.rollout.probe import SyncProbe
from coati.rollout.chat import ChatTokens, check_appending
from coati.rollout.environment import ToolEnvironment, row_tools, tool_schemas
from coati.rollout.multiturn import MultiTurnWorkflow, conversation
from coati.rollout.tools import ToolRunner, configure_python_tool, resolve_tools
from coati.cli.arguments import micro_batches_per_pass, optimizer_steps_per_episode, plugin_config
from coati.cli.options import settings_from
from coati.utils.ckpt_io import save_hf_model
from coati.utils.errors import CoatiUsageError, fail, note_user, warn_user
from coati.utils.registry import AGENTS, OBJECTIVES, TOOL_CALL_PARSERS

from coati.trainer.components import DistillTerm
from coati.trainer.callbacks.best import BestModelKeeper
from coati.trainer.callbacks.tokenizer import TokenizerInCheckpoints
from coati.trainer.callbacks.health import ALARM_EXIT_CODE, AlarmThresholds, HealthMonitor
from coati.trainer.grpo import GRPOTrainer
from coati.trainer.onpolicy import OLTrainer
from coati.trainer.ppo import CriticParts, PPOTrainer
from coati.trainer.sources import AsyncRollouts

from .runner import (_require_dir, build_dataloader, build_optimizer, build_scheduler, eval_batch_size, export_dir,
                     export_model, finished_run, frozen_dtype, frozen_model, frozen_reference, load_causal_lm, open_logger,
                     prepare_model, resolve_checkpoint, resumed_line, run_device, start_run)


def _stop_ids(args: argparse.Namespace, tokenizer: Any) -> List[int]:
    """Tokens that end a completion: the tokenizer's end of sequence, and a conversation config's `stop_ids`."""
    return [tokenizer.eos_token_id, *args.extra_stop_ids]


def _total_steps(args: argparse.Namespace) -> int:
    """Optimizer steps of the whole run."""
    return args.num_episodes * optimizer_steps_per_episode(args)


def _one_update_per_experience(args: argparse.Namespace) -> bool:
    """Whether every experience is learned by exactly one optimizer step (its old log-probs are then the learning
    forward's own)."""
    return args.num_update_steps == 1 and micro_batches_per_pass(args) <= args.accumulation_steps


def _objective_needs_reference(args: argparse.Namespace) -> bool:
    """Whether `--objective` asks for the reference model's log-probs (online DPO's, say) whatever `--kl_coef` is."""
    return bool(getattr(OBJECTIVES.get(args.objective), "needs_reference", False))


def _reward_specs(args: argparse.Namespace) -> List[str]:
    """`--reward_fn`'s functions; none when it is not given (GRPO's parser refuses a run with no reward at all)."""
    return list(args.reward_fn or [])


def _has_teacher(args: argparse.Namespace) -> bool:
    """A distillation teacher is given (`--teacher_model` or `--teacher_url`)."""
    return bool(args.teacher_model or args.teacher_url)


def _reward_fn(args: argparse.Namespace, serve: bool = True) -> Optional[WeightedReward]:
    """The flags' reward functions, the built-ins configured by their flags; a `--judge_model` judge is started only
    where `serve` (not when the flags are only checked)."""
    specs = _reward_specs(args)
    wants_judge = JUDGE in (split_spec(s)[0] for s in specs)
    _check_judge_flags(args, wants_judge)
    if not specs:
        return None
    limits = _sandbox_limits(args)
    servers = {spec: RemoteReward(spec, args.reward_server_timeout, args.reward_server_retries)
               for spec in (split_spec(s)[0] for s in specs) if is_url(spec)}
    if any(split_spec(s)[0] == "code_tests" for s in specs):
        _check_sandbox(args.sandbox)
    code = CodeTests(limits, args.sandbox_workers, args.code_all_or_nothing, args.sandbox)
    builtins = {**BUILTIN, "code_tests": code, **servers}
    if wants_judge:
        builtins[JUDGE] = _judge(args, serve)
    return WeightedReward.from_specs(specs, args.reward_timeout, builtins)


JUDGE = "judge"


def _check_judge_flags(args: argparse.Namespace, wanted: bool) -> None:
    """`--reward_fn judge` names its judge in exactly one way, and the judge flags come with it."""
    given = [f"--{name}" for name in ("judge_url", "judge_model") if getattr(args, name)]
    if given and not wanted:
        raise CoatiUsageError(f"{given[0]} is for the judge reward: add `judge` to --reward_fn")
    if wanted and len(given) != 1:
        raise CoatiUsageError("--reward_fn judge needs one judge: --judge_url (an OpenAI-compatible API) or "
                              "--judge_model (a model folder coati serves)")
    if args.judge_url and not is_url(args.judge_url):
        raise CoatiUsageError(f"--judge_url {args.judge_url}: expected an http(s):// URL such as "
                              "http://127.0.0.1:8000/v1")
    if args.judge_model and not (Path(args.judge_model) / "config.json").is_file():
        raise CoatiUsageError(f"--judge_model {args.judge_model} is not a model folder (no config.json)")


def _judge(args: argparse.Namespace, serve: bool) -> LLMJudge:
    """The judge reward on the flags' settings; with `--judge_model` (and `serve`), this rank's judge server started."""
    rubric = check_rubric(Path(args.judge_rubric).read_text(), f"--judge_rubric {args.judge_rubric}") \
        if args.judge_rubric else DEFAULT_RUBRIC
    url, token = args.judge_url, judge_token()
    if args.judge_model and serve:
        local = LocalJudge(_judge_server_config(args)).start()
        url, token = local.url, local.token
        if rank() == 0:
            print(f"judge {args.judge_model} serving on {url} (log: {local.log_path})", flush=True)
    return LLMJudge.from_settings(settings_from(args, JudgeSettings), url or "http://127.0.0.1/v1", rubric, token)


def _judge_server_config(args: argparse.Namespace) -> JudgeServerConfig:
    """This rank's judge server: on its own GPU where there is one, logging beside the vLLM servers' logs."""
    log_dir = args.log_dir or args.output_dir or args.save_dir
    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    return JudgeServerConfig(args.judge_model, args.judge_engine, args.vllm_python if args.judge_engine == "vllm" else "",
                             str(Path(log_dir) / f"judge_rank{rank()}.log") if log_dir else None, device,
                             start_timeout_s=args.judge_start_timeout)


def _sandbox_limits(args: argparse.Namespace) -> SandboxLimits:
    """One sandboxed run's limits (code_tests rewards and the python tool), from the `--sandbox_*` flags."""
    return SandboxLimits(cpu_s=args.sandbox_timeout, wall_s=2 * args.sandbox_timeout, memory_mb=args.sandbox_memory_mb,
                         processes=args.sandbox_processes)


def _check_sandbox(backend: str) -> None:
    """Before training: the code sandbox can contain programs here as `--sandbox` asks, or one line says why not."""
    try:
        resolve_backend(backend)
    except SandboxError as error:
        raise CoatiUsageError(f"code_tests: {error}") from None


def _policy_loss(args: argparse.Namespace) -> PolicyLoss:
    """The actor's loss as the flags say; options it does not take, or takes with a bad value, are refused."""
    try:
        return PolicyLoss(clip_eps_low=args.clip_eps_low, clip_eps_high=args.clip_eps_high, aggregation=args.loss_agg,
                          norm_length=args.max_new_tokens, loss=args.policy_loss, behaviour_cap=args.behaviour_cap,
                          options=dict(args.policy_loss_option), behaviour_correction=args.behaviour_correction,
                          behaviour_options=dict(args.behaviour_correction_option))
    except ValueError as error:
        raise CoatiUsageError(str(error)) from None


def _vllm_config(args: argparse.Namespace) -> VLLMConfig:
    """How the flags run vLLM servers: on `--pretrain`, in the trainer's compute precision, logging under the run's
    log folder (else its output or checkpoint folder)."""
    precision = args.mixed_precision if torch.cuda.is_available() else "fp32"
    return VLLMConfig.from_settings(settings_from(args, BackendSettings), args.pretrain,
                                    args.vllm_python or default_vllm_python(),
                                    args.log_dir or args.output_dir or args.save_dir, f"vllm_rank{rank()}",
                                    {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision],
                                    args.seed + 1000 * rank(),
                                    args.lora_rank if adapter_sync_blocker(args) is None else 0)


def adapter_sync_blocker(args: argparse.Namespace) -> Optional[str]:
    """Why updates go to vLLM as whole weights rather than as LoRA adapters alone (`--vllm_lora_sync`), or None when
    adapters alone are sent. vLLM serves an adapter over the base weights it started with, so the base must stay the
    `--pretrain` weights, and the adapters must be whole on each rank."""
    if not args.lora_rank:
        return "no --lora_rank"
    if args.vllm_lora_sync == "merged":
        return "--vllm_lora_sync merged"
    blockers = {"--lora_init pissa moves the base weights": args.lora_init == "pissa",
                f"--lora_bias {args.lora_bias} trains the base model's biases": args.lora_bias != "none",
                "an embedding or output head among --lora_target_modules": any(
                    "embed" in name or "lm_head" in name or name == "wte" for name in args.lora_target_modules),
                f"--plugin {args.plugin} shards the adapters": args.plugin in ("3d", "gemini", "gemini_auto"),
                f"--lora_rank {args.lora_rank} is above vLLM's largest, {VLLM_LORA_RANKS[-1]}":
                    args.lora_rank > VLLM_LORA_RANKS[-1]}
    reason = next((why for why, blocked in blockers.items() if blocked), None)
    if reason and args.vllm_lora_sync == "adapter":
        raise CoatiUsageError(f"--vllm_lora_sync adapter: {reason}, so vLLM cannot serve the policy as adapters over "
                              "its base weights; use --vllm_lora_sync merged (or auto)")
    if reason is None and args.vllm_lora_sync == "auto" and not torch.cuda.is_available():
        return "--vllm_lora_sync auto on a CPU, where vLLM runs LoRA uncompiled"
    return reason


def _vllm_pool(args: argparse.Namespace, tokenizer: Any, num_engines: int = 1) -> VLLMPool:
    """`num_engines` vLLM servers on the flags' settings, ready, checked after every update by a sync probe on the first
    `--engine_probe_rows` prompts; rank 0 prints their start-up time."""
    pool = VLLMPool(_vllm_config(args), tokenizer.pad_token_id, _stop_ids(args, tokenizer), num_engines)
    if args.engine_probe_rows:
        rows = load_prepared(args.dataset, "prompt")
        pool.probe = SyncProbe([rows[i]["input_ids"] for i in range(min(args.engine_probe_rows, len(rows)))],
                               args.engine_probe_tolerance)
    if rank() == 0:
        lora = ""
        if args.lora_rank:
            lora = f"; LoRA updates send {'the adapters alone' if pool.takes_adapters else 'the merged weights'}"
        print(f"vLLM rollout engine ready in {pool.start_seconds:.1f} s (log: {pool.servers[0].log_path}{lora})",
              flush=True)
    return pool


def health_monitor(args: argparse.Namespace) -> HealthMonitor:
    """The health alarms as `--stop_on_alarm` and `--alarm_threshold NAME=VALUE ...` set them."""
    limits = [f.name for f in dataclasses.fields(AlarmThresholds)]
    changed = {}
    for item in args.alarm_threshold:
        name, _, value = item.partition("=")
        if name not in limits or not value:
            raise CoatiUsageError(f"--alarm_threshold {item}: expected NAME=VALUE with NAME one of {', '.join(limits)}")
        try:
            changed[name] = int(value) if name == "patience" else float(value)
        except ValueError:
            raise CoatiUsageError(f"--alarm_threshold {item}: {value!r} is not a number") from None
    try:
        return HealthMonitor(AlarmThresholds(**changed), stop_on=tuple(args.stop_on_alarm))
    except ValueError as error:
        raise CoatiUsageError(f"--stop_on_alarm: {error}") from None


def _trainer_config(args: argparse.Namespace, setup: Any) -> OnPolicyConfig:
    """The trainer's settings from the flags; the trainer clips gradients itself where the plugin does not."""
    return settings_from(args, OnPolicyConfig, grad_clip=setup.grad_clip if setup.trainer_clips_grad else 0.0)


def _run(args: argparse.Namespace, build: Callable[..., OLTrainer]) -> Optional[OLTrainer]:
    """Prompts, actor, reference and engine; `build(args, setup, ...)` makes the trainer; then resume,
    fit, the held-out results and the export (None: the run resumed is finished, `finished_run`)."""
    setup, coordinator, tokenizer = start_run(args, _check_run)
    checkpoint = resolve_checkpoint(args)
    if finished_run(args, checkpoint, args.num_episodes, "episodes"):
        return None
    tokenizer = with_template(args, tokenizer)
    collator = PromptCollator(tokenizer.pad_token_id, args.max_length)
    rows = load_prepared(args.dataset, "prompt")
    _note_cut_prompts(rows, args.max_length)
    prompts = build_dataloader(setup.plugin, rows, args.batch_size, collator, True, args.seed)
    held_out = (build_dataloader(setup.plugin, load_prepared(args.eval_dataset, "prompt"), eval_batch_size(args), collator,
                                 False, args.seed) if args.eval_dataset else None)
    actor = prepare_model(load_causal_lm(args, tokenizer), args, setup)
    optimizer = build_optimizer(actor, args)
    scheduler = build_scheduler(optimizer, args, _total_steps(args))
    actor, optimizer, scheduler, _ = setup.boost(actor, optimizer, scheduler)
    reference = frozen_reference(args, setup) if args.kl_coef > 0 or _objective_needs_reference(args) else None
    generator = actor.unwrap(unwrap_peft=False) if hasattr(actor, "unwrap") else actor
    engine = HFEngine(generator, tokenizer.pad_token_id, _stop_ids(args, tokenizer), args.inference_batch_size)
    monitor = health_monitor(args)
    kwargs = dict(config=_trainer_config(args, setup), policy_loss=_policy_loss(args), eval_dataloader=held_out,
                  coordinator=coordinator, ptx_dataloader=_ptx_loader(args, setup, tokenizer),
                  callbacks=[monitor, TokenizerInCheckpoints(tokenizer, coordinator.is_master())])
    if args.rollout_backend == "vllm" and not settings_from(args, AsyncSettings).async_rollout:
        kwargs["rollout_pool"] = _vllm_pool(args, tokenizer)
    if args.save_best:
        kwargs["callbacks"].append(BestModelKeeper(
            args.save_best, export_dir(args).parent / "best",
            lambda folder: save_hf_model(folder, setup.booster, actor, tokenizer, coordinator), coordinator.is_master()))
    trainer = build(args, setup, tokenizer, actor, optimizer, scheduler, engine, reference, prompts, kwargs)
    if checkpoint:
        trainer.load_checkpoint(checkpoint)
        coordinator.print_on_master(resumed_line(checkpoint, f"episode {trainer.start_episode}"))
    trainer.fit(args.num_episodes, args.num_collect_steps, args.num_update_steps,
                metrics_logger=open_logger(args, type(trainer), trainer.start_episode if checkpoint else None))
    if args.output_dir and coordinator.is_master():
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        if trainer.eval_history:
            (Path(args.output_dir) / "eval_results.json").write_text(json.dumps(trainer.eval_history, indent=2))
        (Path(args.output_dir) / "alarms.json").write_text(json.dumps(monitor.fired, indent=2))
    coordinator.print_on_master(f"alarms: {'; '.join(monitor.fired.values()) or 'none'}")
    if monitor.stopped_by:
        where = f"resume it from {args.save_dir} with --checkpoint_path latest" if args.save_dir else "no --save_dir"
        fail(f"error: stopped by alarm {monitor.stopped_by} (--stop_on_alarm); {where}", ALARM_EXIT_CODE)
    export_model(args, setup, actor, tokenizer, coordinator)
    return trainer


def _note_cut_prompts(rows: Any, max_length: int) -> None:
    """A note of the prompts that `--max_length` cuts at batching time (from the left, their end kept)."""
    longer = sum(n > max_length for n in row_tokens(rows)) if max_length else 0
    if longer:
        note_user(f"{longer} of {len(rows)} prompts are longer than --max_length {max_length} tokens: they are cut from "
                  "the left, their end kept")


def _ptx_loader(args: argparse.Namespace, setup: Any, tokenizer: Any) -> Optional[Any]:
    """`--ptx_dataset`'s supervised batches for the ptx loss, when `--ptx_coef` is above 0."""
    if args.ptx_coef <= 0:
        return None
    if not args.ptx_dataset:
        raise CoatiUsageError("--ptx_coef > 0 needs --ptx_dataset (prepared sft data)")
    return build_dataloader(setup.plugin, load_prepared(args.ptx_dataset, "sft"), args.ptx_batch_size or args.batch_size,
                            SupervisedCollator(tokenizer.pad_token_id, args.max_length), True, args.seed)


def _kl_controller(args: argparse.Namespace) -> KLController:
    """`--kl_coef`, adapted towards `--kl_target` when one is given."""
    return KLController.from_settings(settings_from(args, KLSettings))


def _build_grpo(args, setup, tokenizer, actor, optimizer, scheduler, engine, reference, prompts, kwargs) -> GRPOTrainer:
    config = settings_from(args, GRPOConfig, old_log_probs_at_collection=not _one_update_per_experience(args))
    temperature = (TemperatureController(args.maxent_tau, args.maxent_target_entropy, args.maxent_tau_lr)
                   if args.adv_estimator == "maxent" else None)
    maker = GRPOExperienceMaker(actor, engine, _scorer(args, tokenizer, config), config, reference,
                                temperature=temperature, teacher=_distillation(args, setup, tokenizer, kwargs),
                                step_scorer=_step_scorer(args, setup, tokenizer))
    kwargs["workflow"] = _workflow(args, maker)
    if args.async_rollout:
        kwargs["source"] = AsyncRollouts(maker, actor, len(prompts.dataset),
                                         **_rollout_side(args, maker, kwargs["workflow"]))
    return GRPOTrainer(actor, optimizer, setup.booster, maker, prompts, lr_scheduler=scheduler,
                       kl_controller=_kl_controller(args), **kwargs)


def _distillation(args: argparse.Namespace, setup: Any, tokenizer: Any, kwargs: Dict[str, Any]) -> Optional[Teacher]:
    """`--teacher_model` (frozen) or `--teacher_url`, scoring the policy's samples as the distillation flags say (None
    without one); `--distill_loss` goes into the trainer's `kwargs` as a loss term."""
    if args.distill_loss:
        kwargs["loss_terms"] = [DistillTerm(args.distill_loss, args.distill_loss_coef, args.gkd_beta)]
    config = DistillConfig(args.distill_coef, args.distill_top_k if args.distill_loss else 0)
    if args.teacher_url:
        return ServedTeacher(args.teacher_url, config, len(tokenizer),
                             args.teacher_model_name or served_model_name(args.teacher_url), args.teacher_batch_size,
                             args.teacher_timeout, args.teacher_retries)
    if not args.teacher_model:
        return None
    return ModelTeacher(frozen_model(args.teacher_model, args, setup), config, len(tokenizer))


def _step_scorer(args: argparse.Namespace, setup: Any, tokenizer: Any) -> Optional[StepScorer]:
    """`--prm_pretrain`, frozen, scoring the steps of each completion; None without one."""
    if not args.prm_pretrain:
        return None
    model = load_frozen_prm(args.prm_pretrain, run_device(), frozen_dtype(setup), args.trust_remote_code)
    return StepScorer(model, tokenizer, args.prm_coef)


def _check_prm(args: argparse.Namespace, grpo: bool) -> None:
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


def _check_distillation(args: argparse.Namespace) -> None:
    """Before any model loads: the distillation flags come with a teacher that is used, and its tokenizer (where it
    has one) shares the policy's vocabulary."""
    if args.teacher_model and args.teacher_url:
        raise CoatiUsageError("--teacher_model and --teacher_url: give one teacher, a folder or a served one")
    if not _has_teacher(args):
        if args.distill_loss:
            raise CoatiUsageError("--distill_loss needs a teacher: --teacher_model or --teacher_url")
        return
    if args.distill_coef == 0 and not args.distill_loss:
        raise CoatiUsageError(f"{'--teacher_url' if args.teacher_url else '--teacher_model'} with --distill_coef 0 and "
                              "no --distill_loss: the teacher would not be used; give one of them")
    if args.teacher_url and not is_url(args.teacher_url):
        raise CoatiUsageError(f"--teacher_url {args.teacher_url}: expected an http(s):// URL such as "
                              "http://127.0.0.1:8000/v1")
    if args.teacher_model and not (Path(args.teacher_model) / "config.json").is_file():
        raise CoatiUsageError(f"--teacher_model {args.teacher_model} is not a model folder (no config.json)")
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


def _chat_tokens(args: argparse.Namespace, tokenizer: Any) -> ChatTokens:
    """How multi-turn episodes render and tokenize: `tokenizer`'s chat template (`with_template` has put
    `--chat_template`'s there) with `--tools`' schemas."""
    name = (f"the chat template {args.chat_template}" if args.chat_template
            else f"the chat template of {args.tokenizer_dir or args.pretrain}")
    return ChatTokens(tokenizer, _stop_ids(args, tokenizer), tool_schemas(resolve_tools(args.tools)), name)


def with_template(args: argparse.Namespace, tokenizer: Any) -> Any:
    """`tokenizer`, its chat template replaced by `--chat_template`'s where given."""
    if args.chat_template:
        tokenizer.chat_template = Path(args.chat_template).read_text()
    return tokenizer


def _check_agent(args: argparse.Namespace) -> None:
    """With `--tools` or `--agent`, before any model loads: the chat template shows the tools and renders by
    appending, and the prompt rows are conversations whose own `tools` name tools `--tools` implements."""
    if args.agent and args.tools:
        raise CoatiUsageError("--agent runs your own agent program, which calls its own tools; leave out --tools")
    if not (args.tools or args.agent):
        return
    tokenizer = with_template(args, load_tokenizer(args.tokenizer_dir or args.pretrain, args.trust_remote_code))
    check_appending(_chat_tokens(args, tokenizer))
    tools = resolve_tools(args.tools)
    for flag, paths in (("--prompt_dataset", args.dataset), ("--eval_dataset", args.eval_dataset)):
        for index, row in enumerate(load_prepared(paths, "prompt") if paths else []):
            try:
                if not args.agent:   # an agent offers its own tools, whatever the row's column says
                    row_tools(row, tools)
                conversation(row)
            except ValueError as error:
                raise CoatiUsageError(f"{flag} row {index}: {error}") from None


def _workflow(args: argparse.Namespace, maker: Any) -> RolloutWorkflow:
    """What turns a prompt row into a trajectory: single-turn RLVR, with `--tools` a multi-turn episode with a tool
    environment, or with `--agent` the user's agent program against the run's endpoint; scored by the maker's
    scorer."""
    sampling, parser = maker.config.sampling, TOOL_CALL_PARSERS.get(args.tool_parser)
    if args.agent:
        return AgentWorkflow(maker.scorer, _chat_tokens(args, maker.tokenizer), AGENTS.get(args.agent), sampling,
                             maker.num_generations, args.agent_timeout, parser)
    if not args.tools:
        return RLVRWorkflow(maker.scorer, sampling, maker.num_generations)
    runner = ToolRunner(resolve_tools(args.tools), args.tool_timeout)
    if "python" in args.tools:
        configure_python_tool(_sandbox_limits(args), args.sandbox)
    return MultiTurnWorkflow(maker.scorer, _chat_tokens(args, maker.tokenizer),
                             lambda: ToolEnvironment(runner, parser, args.malformed_tool_penalty), sampling,
                             maker.num_generations, args.max_turns, args.max_total_tokens)


def _rollout_side(args: argparse.Namespace, maker: GRPOExperienceMaker, workflow: RolloutWorkflow) -> Dict[str, Any]:
    """Rank 0's generator pool (Ray actors, or vLLM servers with `--rollout_backend vllm`, started from
    `--pretrain`), the executor running `workflow` (the trainer's own, which it also evaluates with) and the prompt
    stream for `--async_rollout`; nothing on the other ranks."""
    if rank() != 0:
        return {}
    tokenizer = maker.tokenizer
    if args.rollout_backend == "vllm":
        pool = _vllm_pool(args, tokenizer, args.num_generators)
    else:
        pool = GeneratorPool(args.pretrain, tokenizer.pad_token_id, _stop_ids(args, tokenizer), args.num_generators,
                             args.generator_max_restarts, args.seed)
    pool.chunk_tokens = args.partial_rollout_tokens
    executor = WorkflowExecutor(pool, workflow, args.batch_size * world_size(),
                                args.max_concurrent_rollouts or 2 * args.batch_size * world_size(), args.max_staleness,
                                batches_per_version=args.num_collect_steps)
    return dict(executor=executor, pool=pool, stream=PromptStream(load_prepared(args.dataset, "prompt"), args.seed))


def _check_save_best(args: argparse.Namespace) -> None:
    if not args.save_best:
        return
    if not args.eval_dataset:
        raise CoatiUsageError(f"--save_best {args.save_best} compares evaluations: give --eval_dataset")
    if not (args.output_dir or args.save_dir):
        raise CoatiUsageError(f"--save_best {args.save_best} needs --output_dir (the best model goes to its best/)")
    if args.lora_rank:
        raise CoatiUsageError("--save_best does not support --lora_rank yet (exporting merges the adapters)")


def _check_kl_control(args: argparse.Namespace) -> None:
    if args.kl_target > 0 and args.kl_coef <= 0:
        raise CoatiUsageError(f"--kl_target {args.kl_target} adapts --kl_coef, which must start above 0 (it is "
                              f"{args.kl_coef}; adaptive KL multiplies it)")


def _check_run(args: argparse.Namespace) -> None:
    """After preflight, before any model loads: the plugin suits on-policy training, and the agent's set-up holds."""
    _check_plugin(args)
    _check_agent(args)


def _check_plugin(args: argparse.Namespace) -> None:
    check_first_forward(args.plugin, OLTrainer.no_grad_forward_first)
    if args.pp > 1:
        raise CoatiUsageError("--pp > 1 (pipeline parallelism) is not supported by on-policy trainers (generation and "
                              "the critic run whole models); use --tp/--sp with --zero_stage for the 3d plugin")


def _check_async(args: argparse.Namespace) -> None:
    if args.dynamic_sampling:
        raise CoatiUsageError("--dynamic_sampling works with synchronous rollouts only for now; with --async_rollout "
                              "use --drop_tied_groups, which masks tied groups out of the loss")
    if args.plugin not in ("ddp", "zero2", "zero2_cpu"):
        raise CoatiUsageError(f"--async_rollout supports --plugin ddp, zero2 and zero2_cpu, whose ranks hold whole "
                              f"parameters; the generators run beside rank 0, which publishes alone, and {args.plugin} "
                              "would need every rank to gather its shards at each publish")


def _check_backend(args: argparse.Namespace) -> None:
    """`--rollout_backend vllm` needs an interpreter to run vLLM with and weights it can be handed whole."""
    if args.rollout_backend != "vllm":
        return
    python = args.vllm_python or default_vllm_python()
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise CoatiUsageError(f"--rollout_backend vllm: no Python interpreter at {python}; build vLLM's environment with "
                              "`make vllm-env`, or name one that has vLLM with --vllm_python")
    adapter_sync_blocker(args)   # --vllm_lora_sync adapter where vLLM cannot serve adapters is refused here


def run_grpo(args: argparse.Namespace) -> Optional[GRPOTrainer]:
    """GRPO as the flags say (a reward source among them, `require_grpo_reward`): held-out reward before and after
    (with `--eval_dataset`), then the export."""
    _check_distillation(args)
    _check_prm(args, grpo=True)
    _reward_fn(args, serve=False)   # an unknown or unimportable reward function is refused before anything is loaded
    _check_kl_control(args)
    _check_save_best(args)
    health_monitor(args)   # its flags are refused before anything is loaded
    _policy_loss(args)
    if "overlong" in args.reward_shaping and args.overlong_buffer_len > args.max_new_tokens:
        raise CoatiUsageError(f"--overlong_buffer_len {args.overlong_buffer_len} must be at most --max_new_tokens "
                              f"{args.max_new_tokens}: the penalty grows over the last tokens before that limit")
    if args.partial_rollout_tokens and not args.async_rollout:
        raise CoatiUsageError("--partial_rollout_tokens needs --async_rollout: a synchronous run updates the weights "
                              "between batches, with no generation running")
    if args.async_rollout:
        _check_async(args)
    _check_backend(args)
    return _run(args, _build_grpo)


def _scorer(args: argparse.Namespace, tokenizer: Any, config: RolloutConfig) -> Scorer:
    """What scores a rollout: the flags' reward functions and the frozen `--rm_pretrain` reward model."""
    return Scorer(tokenizer, _reward_fn(args), _frozen_reward_model(args, tokenizer), config.forward_batch_size,
                  config.reward_model_weight)


def _frozen_reward_model(args: argparse.Namespace, tokenizer: Any) -> Optional[torch.nn.Module]:
    if not args.rm_pretrain:
        return None
    model = load_reward_model(_require_dir(args.rm_pretrain, "--rm_pretrain model directory"), tokenizer.pad_token_id,
                              args.trust_remote_code)
    return model.to(run_device()).eval().requires_grad_(False)


def _build_ppo(args, setup, tokenizer, actor, optimizer, scheduler, engine, reference, prompts, kwargs) -> PPOTrainer:
    critic_path = _require_dir(args.critic_pretrain or args.rm_pretrain or args.pretrain, "--critic_pretrain model directory")
    critic = load_critic(critic_path, tokenizer.pad_token_id, args.trust_remote_code)
    if args.packing:
        enable_packed_attention(critic)
    if args.grad_checkpoint:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    critic_optim = build_optimizer(critic, args, lr=args.critic_lr or args.lr)
    critic_scheduler = build_scheduler(critic_optim, args, _total_steps(args))
    critic_setup = build_booster(plugin_config(args))
    critic, critic_optim, critic_scheduler, _ = critic_setup.boost(critic, critic_optim, critic_scheduler)
    config = settings_from(args, PPOConfig, old_log_probs_at_collection=not _one_update_per_experience(args))
    maker = PPOExperienceMaker(actor, critic, engine, _scorer(args, tokenizer, config), config, reference,
                               kl_controller=_kl_controller(args), step_scorer=_step_scorer(args, setup, tokenizer),
                               teacher=_distillation(args, setup, tokenizer, kwargs))
    kwargs["workflow"] = _workflow(args, maker)
    return PPOTrainer(actor, optimizer, setup.booster, maker, prompts, lr_scheduler=scheduler, **kwargs,
                      critic=CriticParts(critic, critic_optim, critic_setup.booster, critic_scheduler,
                                         settings_from(args, CriticSettings)))


def run_ppo(args: argparse.Namespace) -> Optional[PPOTrainer]:
    """PPO as the flags say: rewards from `--rm_pretrain` and/or `--reward_fn`, a critic from
    `--critic_pretrain` (default: the reward model), KL-penalised to the reference; then the export."""
    if not args.rm_pretrain and not args.prm_pretrain and not _has_teacher(args) and not _reward_specs(args):
        raise CoatiUsageError("PPO needs a reward: --rm_pretrain (a trained reward model), --prm_pretrain (a process "
                              "reward model) and/or --reward_fn, or a distillation teacher (--teacher_model or "
                              "--teacher_url)")
    _check_distillation(args)
    _check_prm(args, grpo=False)
    _reward_fn(args, serve=False)
    _check_kl_control(args)
    _check_save_best(args)
    health_monitor(args)   # its flags are refused before anything is loaded
    _policy_loss(args)
    _check_backend(args)
    return _run(args, _build_ppo)
