"""The parts of an on-policy run, each built from its flags and refusing what concerns it alone: the reward
(functions, servers, the judge and its flags, the code sandbox, a frozen reward model, a process reward model, a
distillation teacher), the policy loss, the KL controller, the chat template and the rollout workflow, the vLLM pool
and the asynchronous rollout side, the health monitor and the ptx loader. `coati.cli.rl_runner` assembles them."""
import argparse
import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from coati.dataset.collators import PromptRows, SupervisedCollator
from coati.dataset.vision import ImageProcessing
from coati.dataset.prepare import load_prepared
from coati.experience.controllers import KLController
from coati.experience.distillation import DistillConfig, ModelTeacher, ServedTeacher, Teacher, served_model_name
from coati.experience.experience import GRPOExperienceMaker
from coati.experience.scorer import Scorer
from coati.config import RolloutConfig
from coati.inference.local_judge import JudgeServerConfig, LocalJudge
from coati.inference.vllm import VLLMConfig, VLLMPool, default_vllm_python
from coati.inference.vllm_server import VLLM_LORA_RANKS
from coati.models.loss import PolicyLoss
from coati.models.prm import StepScorer, load_frozen_prm
from coati.models.reward_model import load_reward_model
from coati.rewards import BUILTIN, WeightedReward
from coati.rewards.code import CodeTests
from coati.rewards.judge import DEFAULT_RUBRIC, LLMJudge, check_rubric, judge_token
from coati.rewards.registry import split_spec
from coati.rewards.remote import RemoteReward, is_url
from coati.rewards.sandbox import SandboxError, SandboxLimits, resolve_backend
from coati.utils.comm import rank, world_size
from coati.rollout import GeneratorPool, PromptStream, RLVRWorkflow, RolloutWorkflow, WorkflowExecutor
from coati.rollout.agent import AgentWorkflow
from coati.rollout.probe import SyncProbe
from coati.rollout.chat import ChatTokens
from coati.rollout.multiturn import MultiTurnWorkflow
from coati.rollout.tools import ToolEnvironment, ToolRunner, configure_python_tool, resolve_tools, tool_schemas
from coati.utils.errors import CoatiUsageError
from coati.utils.registry import AGENTS, TOOL_CALL_PARSERS

from coati.trainer.components import DistillTerm
from coati.trainer.callbacks.health import AlarmThresholds, HealthMonitor

from .runner import _require_dir, build_dataloader, frozen_dtype, frozen_model, run_device




def stop_ids(args: argparse.Namespace, tokenizer: Any) -> List[int]:
    """Tokens that end a completion: the tokenizer's end of sequence, and a conversation config's `stop_ids`."""
    return [tokenizer.eos_token_id, *args.extra_stop_ids]


def reward_specs(args: argparse.Namespace) -> List[str]:
    """`--reward_fn`'s functions; none when it is not given (GRPO's parser refuses a run with no reward at all)."""
    return list(args.reward_fn or [])


def has_teacher(args: argparse.Namespace) -> bool:
    """A distillation teacher is given (`--teacher_model` or `--teacher_url`)."""
    return bool(args.teacher_model or args.teacher_url)


def reward_fn(args: argparse.Namespace, serve: bool = True) -> Optional[WeightedReward]:
    """The flags' reward functions, the built-ins configured by their flags; a `--judge_model` judge is started only
    where `serve` (not when the flags are only checked)."""
    specs = reward_specs(args)
    wants_judge = JUDGE in (split_spec(s)[0] for s in specs)
    check_judge_flags(args, wants_judge)
    if not specs:
        return None
    limits = sandbox_limits(args)
    servers = {spec: RemoteReward(spec, args.reward_server_timeout, args.reward_server_retries)
               for spec in (split_spec(s)[0] for s in specs) if is_url(spec)}
    if any(split_spec(s)[0] == "code_tests" for s in specs):
        check_sandbox(args.sandbox)
    code = CodeTests(limits, args.sandbox_workers, args.code_all_or_nothing, args.sandbox)
    builtins = {**BUILTIN, "code_tests": code, **servers}
    if wants_judge:
        builtins[JUDGE] = judge(args, serve)
    return WeightedReward.from_specs(specs, args.reward_timeout, builtins)


JUDGE = "judge"


def check_judge_flags(args: argparse.Namespace, wanted: bool) -> None:
    """`--reward_fn judge` names its judge in exactly one way, and the judge flags come with it."""
    given = [f"--{name}" for name in ("judge_url", "judge_model") if getattr(args, name)]
    if given and not wanted:
        raise CoatiUsageError(f"{given[0]} is for the judge reward: add `judge` to --reward_fn")
    if wanted and len(given) != 1:
        raise CoatiUsageError("--reward_fn judge needs one judge: --judge_url (an OpenAI-compatible API) or "
                              "--judge_model (a model folder coati serves)")
    check_model_source("judge", args.judge_url, args.judge_model)


def check_model_source(role: str, url: Optional[str], folder: Optional[str]) -> None:
    """`--{role}_url` is an http(s) URL and `--{role}_model` a model folder, where given (judge's, teacher's)."""
    if url and not is_url(url):
        raise CoatiUsageError(f"--{role}_url {url}: expected an http(s):// URL such as http://127.0.0.1:8000/v1")
    if folder and not (Path(folder) / "config.json").is_file():
        raise CoatiUsageError(f"--{role}_model {folder} is not a model folder (no config.json)")


def judge(args: argparse.Namespace, serve: bool) -> LLMJudge:
    """The judge reward on the flags' settings; with `--judge_model` (and `serve`), this rank's judge server started."""
    rubric = check_rubric(Path(args.judge_rubric).read_text(), f"--judge_rubric {args.judge_rubric}") \
        if args.judge_rubric else DEFAULT_RUBRIC
    url, token = args.judge_url, judge_token()
    if args.judge_model and serve:
        local = LocalJudge(judge_server_config(args)).start()
        url, token = local.url, local.token
        if rank() == 0:
            print(f"judge {args.judge_model} serving on {url} (log: {local.log_path})", flush=True)
    return LLMJudge.from_settings(args._run_config.judge, url or "http://127.0.0.1/v1", rubric, token)


def judge_server_config(args: argparse.Namespace) -> JudgeServerConfig:
    """This rank's judge server: on its own GPU where there is one, logging beside the vLLM servers' logs."""
    log_dir = args.log_dir or args.output_dir or args.save_dir
    device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    return JudgeServerConfig(args.judge_model, args.judge_engine, args.vllm_python if args.judge_engine == "vllm" else "",
                             str(Path(log_dir) / f"judge_rank{rank()}.log") if log_dir else None, device,
                             start_timeout_s=args.judge_start_timeout)


def sandbox_limits(args: argparse.Namespace) -> SandboxLimits:
    """One sandboxed run's limits (code_tests rewards and the python tool), from the `--sandbox_*` flags."""
    return SandboxLimits(cpu_s=args.sandbox_timeout, wall_s=2 * args.sandbox_timeout, memory_mb=args.sandbox_memory_mb,
                         processes=args.sandbox_processes)


def check_sandbox(backend: str) -> None:
    """Before training: the code sandbox can contain programs here as `--sandbox` asks, or one line says why not."""
    try:
        resolve_backend(backend)
    except SandboxError as error:
        raise CoatiUsageError(f"code_tests: {error}") from None


def policy_loss(args: argparse.Namespace) -> PolicyLoss:
    """The actor's loss as its section says; options it does not take, or takes with a bad value, are refused."""
    run = args._run_config
    try:
        return PolicyLoss.from_settings(run.actor_loss, run.rollout.sampling.max_new_tokens)
    except ValueError as error:
        raise CoatiUsageError(str(error)) from None


def vllm_config(args: argparse.Namespace) -> VLLMConfig:
    """How the flags run vLLM servers: on `--pretrain`, in the trainer's compute precision, logging under the run's
    log folder (else its output or checkpoint folder)."""
    precision = args.mixed_precision if torch.cuda.is_available() else "fp32"
    return VLLMConfig.from_settings(args._run_config.engine, args.pretrain,
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


def vllm_pool(args: argparse.Namespace, tokenizer: Any, num_engines: int = 1) -> VLLMPool:
    """`num_engines` vLLM servers on the flags' settings, ready, checked after every update by a sync probe on the first
    `--engine_probe_rows` prompts; rank 0 prints their start-up time."""
    pool = VLLMPool(vllm_config(args), stop_ids(args, tokenizer), num_engines)
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


def ptx_loader(args: argparse.Namespace, setup: Any, tokenizer: Any) -> Optional[Any]:
    """`--ptx_dataset`'s supervised batches for the ptx loss, when `--ptx_coef` is above 0."""
    if args.ptx_coef <= 0:
        return None
    return build_dataloader(setup.plugin, load_prepared(args.ptx_dataset, "sft"), args.ptx_batch_size or args.batch_size,
                            SupervisedCollator(tokenizer.pad_token_id, args.max_length), True, args.seed)


def kl_controller(args: argparse.Namespace) -> KLController:
    """`--kl_coef`, adapted towards `--kl_target` when one is given."""
    return KLController.from_settings(args._run_config.kl)


def distillation(args: argparse.Namespace, setup: Any, tokenizer: Any, kwargs: Dict[str, Any]) -> Optional[Teacher]:
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


def step_scorer(args: argparse.Namespace, setup: Any, tokenizer: Any) -> Optional[StepScorer]:
    """`--prm_pretrain`, frozen, scoring the steps of each completion; None without one."""
    if not args.prm_pretrain:
        return None
    model = load_frozen_prm(args.prm_pretrain, run_device(), frozen_dtype(setup), args.trust_remote_code)
    return StepScorer(model, tokenizer, args.prm_coef)


def chat_tokens(args: argparse.Namespace, tokenizer: Any, images: Optional[ImageProcessing] = None) -> ChatTokens:
    """How multi-turn episodes render and tokenize: `tokenizer`'s chat template (`run_tokenizer` has put
    `--chat_template`'s there) with `--tools`' schemas, and `images`, a vision-language model's processor for the
    prompts' images."""
    name = (f"the chat template {args.chat_template}" if args.chat_template
            else f"the chat template of {args.tokenizer_dir or args.pretrain}")
    return ChatTokens(tokenizer, stop_ids(args, tokenizer), tool_schemas(resolve_tools(args.tools)), name, images)


def workflow(args: argparse.Namespace, maker: Any, prompt_rows: PromptRows) -> RolloutWorkflow:
    """What turns a prompt row (made by `prompt_rows`) into a trajectory: single-turn RLVR, with `--tools` a
    multi-turn episode with a tool environment, or with `--agent` the user's agent program against the run's
    endpoint; scored by the maker's scorer."""
    sampling, parser = maker.config.sampling, TOOL_CALL_PARSERS.get(args.tool_parser)
    if args.agent:
        return AgentWorkflow(maker.scorer, chat_tokens(args, maker.tokenizer), AGENTS.get(args.agent), sampling,
                             maker.num_generations, args.agent_timeout, parser)
    if not args.tools:
        return RLVRWorkflow(maker.scorer, sampling, maker.num_generations)
    runner = ToolRunner(resolve_tools(args.tools), args.tool_timeout)
    if "python" in args.tools:
        configure_python_tool(sandbox_limits(args), args.sandbox)
    environment = functools.partial(ToolEnvironment, runner, parser, args.malformed_tool_penalty)
    return MultiTurnWorkflow(maker.scorer, chat_tokens(args, maker.tokenizer, prompt_rows.images), environment, sampling,
                             maker.num_generations, args.max_turns, args.max_total_tokens)


def rollout_side(args: argparse.Namespace, maker: GRPOExperienceMaker, workflow: RolloutWorkflow,
                 prompt_rows: PromptRows) -> Dict[str, Any]:
    """Rank 0's generator pool (Ray actors, or vLLM servers with `--rollout_backend vllm`, started from
    `--pretrain`), the executor running `workflow` (the trainer's own, which it also evaluates with) and the prompt
    stream for `--async_rollout`, its rows made by `prompt_rows` (the synchronous loader's); nothing on the other
    ranks."""
    if rank() != 0:
        return {}
    tokenizer = maker.tokenizer
    if args.rollout_backend == "vllm":
        pool = vllm_pool(args, tokenizer, args.num_generators)
    else:
        pool = GeneratorPool(args.pretrain, tokenizer.pad_token_id, stop_ids(args, tokenizer), args.num_generators,
                             args.generator_max_restarts, args.seed)
    pool.chunk_tokens = args.partial_rollout_tokens
    executor = WorkflowExecutor(pool, workflow, args.batch_size * world_size(),
                                args.max_concurrent_rollouts or 2 * args.batch_size * world_size(), args.max_staleness,
                                batches_per_version=args.num_collect_steps)
    stream = PromptStream(load_prepared(args.dataset, "prompt"), args.seed, prompt_rows)
    return dict(executor=executor, pool=pool, stream=stream)


def scorer(args: argparse.Namespace, tokenizer: Any, config: RolloutConfig) -> Scorer:
    """What scores a rollout: the flags' reward functions and the frozen `--rm_pretrain` reward model."""
    return Scorer(tokenizer, reward_fn(args), frozen_reward_model(args, tokenizer), config.forward_batch_size,
                  config.reward_model_weight, config.sampling.max_new_tokens)


def frozen_reward_model(args: argparse.Namespace, tokenizer: Any) -> Optional[torch.nn.Module]:
    if not args.rm_pretrain:
        return None
    model = load_reward_model(_require_dir(args.rm_pretrain, "--rm_pretrain model directory"), tokenizer.pad_token_id,
                              args.trust_remote_code)
    return model.to(run_device()).eval().requires_grad_(False)
