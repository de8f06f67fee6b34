"""The one argument builder every training script shares: same flags, same defaults, everywhere.

Every numeric flag carries its range (`coati.utils.cli`), so a value out of range is refused by name
before anything is loaded.
"""
import argparse
from dataclasses import fields

from coati.distributed.plugins import PluginConfig, add_plugin_args
from coati.rewards.remote import DEFAULT_RETRIES as DEFAULT_SERVER_RETRIES
from coati.rewards.remote import DEFAULT_TIMEOUT_S as DEFAULT_SERVER_TIMEOUT_S
from coati.utils.cadence import LOGGING_STRATEGIES, Evaluator, LogCadence, Saver
from coati.utils.cli import CoatiArgumentParser, at_least, in_range, non_negative, positive
from coati.utils.metrics_logger import DEFAULT_WANDB_TABLE_ROWS
from coati.utils.registry import (ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, OBJECTIVES, POLICY_LOSSES,
                                  REWARD_SHAPERS, option)

DEFAULT_REWARD_TIMEOUT_S = 600.0


def training_parser(description: str, dataset_flag: str = "--dataset", on_policy: bool = False) -> argparse.ArgumentParser:
    """Flags common to all training scripts; a script adds only its algorithm's own flags. On-policy
    scripts (`on_policy`) name their data `--prompt_dataset` (stored as `args.dataset` all the same) and
    count `--num_episodes` instead of epochs, steps and accumulation, so those flags are not theirs."""
    parser = CoatiArgumentParser(description=description)
    model = parser.add_argument_group("model")
    model.add_argument("--pretrain", required=True,
                       help="model directory, or a Hugging Face model id (from the local HF cache; downloaded when online)")
    model.add_argument("--tokenizer_dir", default=None, help="tokenizer directory (default: --pretrain)")
    model.add_argument("--trust_remote_code", action="store_true", help="allow custom modelling code shipped with the model")
    model.add_argument("--grad_checkpoint", action="store_true", help="recompute activations in backward to save memory")
    model.add_argument("--lora_rank", type=at_least(0), default=0, help="train rank-r LoRA adapters only (0: full fine-tuning)")
    model.add_argument("--lora_alpha", type=positive(), default=16, help="LoRA scaling numerator (scale = alpha / rank)")
    model.add_argument("--lora_dropout", type=in_range(0, 1, high_open=True), default=0.0, help="dropout on the LoRA path")
    model.add_argument("--lora_target_modules", nargs="+", default=["all-linear"],
                       help="module names to adapt (linear or embedding layers), or 'all-linear' for every linear "
                            "layer but the output head")
    model.add_argument("--lora_bias", choices=("none", "all", "lora_only"), default="none",
                       help="biases that train beside the adapters: none, every bias, or those of adapted layers")
    model.add_argument("--lora_init", choices=("kaiming_uniform", "pissa"), default="kaiming_uniform",
                       help="adapter start: A kaiming-uniform and B zero, or PiSSA (A, B from the weight's top singular "
                            "vectors, the base keeps the rest; arXiv:2404.02948)")

    data = parser.add_argument_group("data")
    data.add_argument(dataset_flag, dest="dataset", nargs="+", required=True,
                      help="prepared dataset directories (prepare_dataset.py)")
    data.add_argument("--eval_dataset", nargs="*", default=None, help="prepared evaluation dataset directories")
    data.add_argument("--max_length", type=at_least(0), default=0,
                      help="cut longer rows from the right at batching time (0: keep the length they were prepared with)")
    if not on_policy:
        data.add_argument("--packing", action="store_true",
                          help="concatenate each micro-batch's rows into one sequence, no padding; attention stays "
                               "within each row and the loss is the unpacked one")
        data.add_argument("--max_tokens_per_batch", type=at_least(0), default=0,
                          help="with --packing: fill each micro-batch with rows up to this many tokens (a preference "
                               "row counts chosen + rejected) instead of --batch_size rows (0: --batch_size rows)")

    optim = parser.add_argument_group("optimisation")
    if not on_policy:
        optim.add_argument("--max_epochs", type=at_least(1), default=1, help="passes over the training data")
        optim.add_argument("--max_steps", type=at_least(0), default=0, help="stop after this many optimizer steps (0: no limit)")
    optim.add_argument("--batch_size", type=at_least(1), default=4,
                       help="prompts per rank per collect step" if on_policy else "micro-batch size per rank")
    optim.add_argument("--accumulation_steps", type=at_least(1), default=1,
                       help="learning micro-batches (--train_batch_size) per optimizer step" if on_policy
                       else "micro-batches per optimizer step")
    optim.add_argument("--lr", type=positive(), default=5e-5, help="peak learning rate")
    optim.add_argument("--weight_decay", type=non_negative(), default=0.0, help="AdamW weight decay")
    optim.add_argument("--lr_scheduler", default="cosine", choices=("cosine", "linear", "constant_with_warmup"),
                       help="learning-rate schedule after the warm-up")
    optim.add_argument("--warmup_steps", type=at_least(0), default=0, help="learning-rate warm-up, in optimizer steps")
    optim.add_argument("--seed", type=int, default=42, help="seeds every RNG and the data order")
    optim.add_argument("--skip_nonfinite", type=at_least(0), default=0,
                       help="skip up to N optimizer steps whose loss or gradient norm is NaN/inf (counted in "
                            "the metrics); one more stops the run (0: the first one stops it)")

    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--save_dir", default=None, help="where checkpoints epoch-{e}_step-{s} are written (and, "
                      "without --output_dir, the final model, in save_dir/modeling as ColossalChat writes it)")
    ckpt.add_argument("--save_interval", type=at_least(0), default=0,
                      help=f"save every N {'episodes' if on_policy else 'optimizer steps'} (0: only at the end)")
    ckpt.add_argument("--save_freq_epochs", type=at_least(0), default=0,
                      help=f"also save when every N-th {'pass over the prompts' if on_policy else 'epoch'} ends (0: off)")
    ckpt.add_argument("--save_freq_secs", type=non_negative(), default=0,
                      help="also save once N seconds have passed since the last checkpoint (0: off)")
    ckpt.add_argument("--keep_last", type=at_least(0), default=0, help="keep only the N newest checkpoints (0: keep all)")
    ckpt.add_argument("--checkpoint_path", default=None,
                      help="resume from this checkpoint directory, or 'latest' for the newest complete one in --save_dir")
    ckpt.add_argument("--output_dir", default=None, help="final HF-format model and evaluation results")

    log = parser.add_argument_group("logging")
    log.add_argument("--log_dir", default=None, help="TensorBoard events and metrics.jsonl")
    log.add_argument("--logging_steps", "--log_interval", dest="log_interval", type=at_least(1), default=1 if on_policy else 10,
                     help=f"log the mean of the metrics every N {'episodes' if on_policy else 'optimizer steps'}")
    log.add_argument("--logging_strategy", choices=LOGGING_STRATEGIES, default="steps",
                     help="'steps': log every --logging_steps; 'no': log no training metrics (evaluation still logs)")
    log.add_argument("--logging_first_step", action="store_true", help="also log after the first step")
    log.add_argument("--use_wandb", action="store_true", help="also log to Weights & Biases (WANDB_MODE=offline works)")
    log.add_argument("--wandb_project", default="coati", help="W&B project of the run")
    log.add_argument("--wandb_table_rows", type=at_least(0), default=DEFAULT_WANDB_TABLE_ROWS,
                     help="rows of each sample table sent to W&B (the JSON sidecar under --log_dir keeps them all)")

    add_plugin_args(parser)
    parser.set_defaults(dataset_flag=dataset_flag)
    return parser


def log_cadence(args: argparse.Namespace) -> LogCadence:
    """The logging flags as the trainers take them."""
    return LogCadence(args.logging_strategy, args.log_interval, args.logging_first_step)


def saver(args: argparse.Namespace) -> Saver:
    """When checkpoints are due, from `--save_interval`, `--save_freq_epochs` and `--save_freq_secs`."""
    return Saver(args.save_freq_epochs, args.save_interval, args.save_freq_secs)


def plugin_config(args: argparse.Namespace) -> PluginConfig:
    """The plugin's settings from `add_plugin_args`'s flags."""
    return PluginConfig(**{f.name: getattr(args, f.name) for f in fields(PluginConfig) if hasattr(args, f.name)})


def evaluator(args: argparse.Namespace) -> Evaluator:
    """When held-out evaluation is due, from `--eval_interval`, `--eval_freq_epochs` and `--eval_freq_secs`."""
    return Evaluator(args.eval_freq_epochs, args.eval_interval, args.eval_freq_secs)


def add_reference_args(parser: argparse.ArgumentParser, precompute: bool = True) -> None:
    """Flags of trainers with a frozen reference policy (DPO, KTO)."""
    group = parser.add_argument_group("reference policy")
    group.add_argument("--ref_pretrain", default=None, help="reference model directory (default: --pretrain)")
    if precompute:
        group.add_argument("--precompute_ref_logps", action="store_true",
                           help="score the data with the reference once, store it beside the data, and train "
                                "without the reference model in memory")


def add_grpo_args(parser: argparse.ArgumentParser) -> None:
    """Rollout, reward and loss flags shared by GRPO and PPO (`add_ppo_args` adds PPO's own)."""
    rl = parser.add_argument_group("on-policy")
    rl.add_argument("--num_episodes", type=at_least(1), default=10, help="collect-then-learn episodes")
    rl.add_argument("--num_collect_steps", type=at_least(1), default=1, help="prompt batches per episode")
    rl.add_argument("--num_update_steps", type=at_least(1), default=1, help="passes over an episode's experience")
    rl.add_argument("--num_generations", type=at_least(1), default=8,
                    help="completions per prompt (GRPO's group: at least 2)")
    rl.add_argument("--max_new_tokens", type=at_least(1), default=64, help="longest completion, in tokens")
    rl.add_argument("--train_batch_size", type=at_least(0), default=0,
                    help="completions per learning micro-batch on each rank (0: each collect step's whole batch)")
    rl.add_argument("--temperature", type=positive(), default=1.0, help="sampling temperature")
    rl.add_argument("--top_p", type=in_range(0, 1, low_open=True), default=1.0,
                    help="nucleus sampling: sample from the smallest set of tokens whose probability reaches P")
    rl.add_argument("--top_k", type=at_least(0), default=0, help="0: no top-k cut")
    rl.add_argument("--reward_fn", nargs="+", default=None,
                    help="reward functions, by built-in name or package.module:function, each optionally =weight "
                         "(default: math_answer, or none beside --rm_pretrain)")
    rl.add_argument("--rm_pretrain", default=None,
                    help="a trained reward model (train_rm.py's exported model): its score is added to the rewards")
    rl.add_argument("--rm_checkpoint_path", default=None,
                    help="the reward model's weights from a train_rm.py checkpoint (save_dir/modeling, or a "
                         "save_dir/epoch-E_step-S folder), in place of --rm_pretrain's")
    rl.add_argument("--inference_batch_size", type=at_least(0), default=0,
                    help="completions generated at once on each rank (0: every completion of a collect step)")
    rl.add_argument("--logits_forward_batch_size", type=at_least(0), default=0,
                    help="rows per forward when the experience's log-probs, values and reward-model scores are "
                         "computed (0: all at once)")
    rl.add_argument("--reward_timeout", type=positive(), default=DEFAULT_REWARD_TIMEOUT_S,
                    help="seconds one call of a reward function may take; a call that takes longer stops the run")
    rl.add_argument("--reward_server_timeout", type=positive(), default=DEFAULT_SERVER_TIMEOUT_S,
                    help="a --reward_fn http://... server: seconds one request may take")
    rl.add_argument("--reward_server_retries", type=at_least(0), default=DEFAULT_SERVER_RETRIES,
                    help="a --reward_fn http://... server: retries of a failed request (backoff 1 s, doubling)")
    ptx = parser.add_argument_group("ptx (InstructGPT's supervised loss beside the policy's)")
    ptx.add_argument("--ptx_dataset", nargs="*", default=None, help="prepared sft data for the ptx loss")
    ptx.add_argument("--ptx_coef", type=non_negative(), default=0.0, help="weight of the ptx (supervised) loss")
    ptx.add_argument("--ptx_batch_size", type=at_least(1), default=None, help="ptx micro-batch per rank (default: --batch_size)")
    code = parser.add_argument_group("code_tests reward (programs run in a sandbox)")
    code.add_argument("--code_all_or_nothing", action="store_true",
                      help="code_tests scores 1 only when every test passes (default: the fraction passed)")
    code.add_argument("--sandbox_timeout", type=positive(), default=5.0,
                      help="CPU seconds one test run may use; its wall-clock limit is twice this")
    code.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "namespaces", "unisolated"],
                      help="how test runs are contained: auto (bubblewrap where it works, else coati's own namespaces "
                           "as root, else an error naming what to install), bwrap, namespaces (root), or unisolated "
                           "(rlimits only: a program can then read this user's files and kill the run)")
    code.add_argument("--sandbox_memory_mb", type=at_least(32), default=512,
                      help="memory of one test run: its whole process tree where a memory cgroup can be made (root), "
                           "and each process's address space")
    code.add_argument("--sandbox_processes", type=at_least(1), default=32, help="processes one test run may have at once")
    code.add_argument("--sandbox_workers", type=at_least(0), default=0,
                      help="test runs at once on each rank (0: the CPU count, at most 8)")
    add_rollout_backend_args(parser)
    rl.add_argument("--rm_weight", type=non_negative(), default=1.0,
                    help="weight of --rm_pretrain's score in the reward, beside --reward_fn's weights (the component "
                         "rewards/reward_model is logged unweighted)")
    rl.add_argument("--stop_on_alarm", nargs="*", default=[], metavar="ALARM",
                    help="end the run (with a checkpoint, exit status 4) when one of these health alarms fires: all, "
                         "eval_drop, eval_falls_reward_rises, entropy_collapse, length_collapse, length_at_limit, "
                         "zero_std_groups, kl_runaway, engine_ratio_drift, grad_spike (every alarm warns either way)")
    rl.add_argument("--alarm_threshold", nargs="*", default=[], metavar="NAME=VALUE",
                    help="change when alarms fire, e.g. eval_drop=0.2 patience=5 (coati.trainer.callbacks.health."
                         "AlarmThresholds)")
    rl.add_argument("--kl_coef", type=non_negative(), default=0.0,
                    help="weight of the KL to the reference in the loss (0: no reference)")
    rl.add_argument("--kl_estimator", default="k3", type=KL_ESTIMATORS.choice(),
                    help=f"{' | '.join(KL_ESTIMATORS.names())} | package.module:function: estimator of the KL to the "
                         "reference")
    rl.add_argument("--kl_target", type=non_negative(), default=0.0,
                    help="adaptive KL (InstructGPT): move --kl_coef after every episode towards the value that keeps "
                         "the mean summed KL of a completion at this (0: --kl_coef stays fixed)")
    rl.add_argument("--kl_horizon", type=at_least(1), default=10000,
                    help="adaptive KL: completions over which the coefficient may move by the full step")
    rl.add_argument("--kl_max_step", type=in_range(0, 1, low_open=True), default=0.2,
                    help="adaptive KL: the proportional error KL/target - 1 is clipped to +-this")
    rl.add_argument("--policy_loss", default="ppo", type=POLICY_LOSSES.choice(),
                    help=f"{' | '.join(POLICY_LOSSES.names())} | package.module:function. ppo: token-level clipped "
                         "ratio; gspo: sequence-level ratio (GSPO; use --clip_eps_low/high ~3e-4/4e-4 and "
                         "--loss_agg seq-mean-token-mean); cispo: truncated, stop-gradient importance weight on every "
                         "token (cap 1 + --clip_eps_high; ScaleRL uses 4); sapo: soft sigmoid gate instead of the clip "
                         "(temperature_pos/temperature_neg options)")
    rl.add_argument("--objective", default="policy_gradient", type=OBJECTIVES.choice(),
                    help=f"{' | '.join(OBJECTIVES.names())} | package.module:factory: the actor's loss on each micro-batch "
                         "(policy_gradient: --policy_loss with the entropy bonus and the KL/ptx terms; your own, e.g. "
                         "online DPO, is a factory taking an ObjectiveConfig, see the README's Adding an algorithm)")
    rl.add_argument("--objective_option", nargs="+", default=[], type=option, metavar="NAME=VALUE",
                    help="the objective's own hyperparameters, in its ObjectiveConfig.options")
    rl.add_argument("--policy_loss_option", nargs="+", default=[], type=option, metavar="NAME=VALUE",
                    help="the policy loss's own hyperparameters, e.g. temperature_neg=1.05 for sapo")
    rl.add_argument("--clip_eps_low", type=in_range(0, 1, high_open=True), default=0.2,
                    help="the ratio is clipped below at 1 - this")
    rl.add_argument("--clip_eps_high", type=non_negative(), default=0.2, help="DAPO's clip-higher uses 0.28")
    rl.add_argument("--loss_agg", default="token-mean", type=AGGREGATIONS.choice(),
                    help="token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO), or "
                         "package.module:function")
    rl.add_argument("--no_std_normalize", action="store_true", help="Dr. GRPO: do not divide advantages by the group std")
    rl.add_argument("--drop_tied_groups", action="store_true", help="DAPO: mask out groups whose rewards all tie")
    rl.add_argument("--entropy_coef", type=non_negative(), default=0.0, help="weight of the entropy bonus")
    rl.add_argument("--eval_interval", type=at_least(0), default=0,
                    help="held-out evaluation every N episodes (always before the first and after the last)")
    rl.add_argument("--eval_n_samples", type=at_least(0), default=0,
                    help="besides the greedy completion, sample N completions of each held-out prompt (at "
                         "--eval_temperature) and log eval/<reward>/pass@k (unbiased, k = 1, 2, 4, ..., N), maj@N and "
                         "mean@N (0: greedy only)")
    rl.add_argument("--eval_temperature", type=positive(), default=None,
                    help="sampling temperature of --eval_n_samples (default: --temperature)")
    rl.add_argument("--save_best", default=None, metavar="METRIC",
                    help="after each evaluation that beats the earlier ones on this eval metric (higher is better, "
                         "e.g. rewards/math_answer), export the model to <output>/best (best.json says when)")
    rl.add_argument("--eval_freq_epochs", type=at_least(0), default=0,
                    help="also evaluate when every N-th pass over the prompts ends (0: off)")
    rl.add_argument("--eval_freq_secs", type=non_negative(), default=0,
                    help="also evaluate once N seconds have passed since the last evaluation (0: off)")
    rl.add_argument("--sample_log_interval", type=at_least(0), default=10,
                    help="a table of prompts, completions, rewards and advantages every N episodes (0: never): "
                         "JSON under --log_dir/rich_completions, and a W&B table with --use_wandb")


def add_rollout_backend_args(parser: argparse.ArgumentParser) -> None:
    """What generates the rollouts: the training model itself (`hf`) or vLLM servers in an environment of their own
    (`vllm`), and the off-policy weight that corrects for generating with other weights or other kernels."""
    group = parser.add_argument_group("rollout backend")
    group.add_argument("--rollout_backend", choices=("hf", "vllm"), default="hf",
                       help="hf: generate with the training model; vllm: with vLLM servers (one per rank, or the "
                            "--num_generators of --async_rollout) that get the new weights after every update")
    group.add_argument("--vllm_python", default="",
                       help="the interpreter of vLLM's environment (default: $COATI_VLLM_PYTHON, else .venv-vllm/bin/python "
                            "beside coati's source, which `make vllm-env` builds)")
    group.add_argument("--vllm_start_timeout", type=positive(), default=600.0,
                       help="seconds a vLLM server may take to load its model")
    group.add_argument("--vllm_timeout", type=positive(), default=600.0, help="seconds one vLLM request may take")
    group.add_argument("--vllm_max_restarts", type=at_least(0), default=1,
                       help="vLLM servers that die are restarted this many times in all; then the run stops")
    group.add_argument("--vllm_threads", type=at_least(0), default=0,
                       help="CPU threads of each vLLM server on a machine without a GPU (0: the trainer's)")
    group.add_argument("--vllm_kv_cache_gib", type=at_least(1), default=1, help="each vLLM server's KV cache on a CPU, GiB")
    group.add_argument("--vllm_gpu_memory_utilization", type=in_range(0, 1, low_open=True), default=0.4,
                       help="fraction of its GPU's memory each vLLM server takes")
    group.add_argument("--behaviour_cap", type=in_range(1), default=5.0,
                       help="cap on each token's weight pi_old / pi_behaviour where the samples' own log-probs differ "
                            "from the trainer's: vLLM's (truncated importance sampling) or older weights' "
                            "(--async_rollout, decoupled PPO)")


def add_group_advantage_args(parser: argparse.ArgumentParser) -> None:
    """GRPO's choice of outcome-reward advantage estimator (the registry's names), its MaxEnt temperature, DAPO's
    dynamic sampling and the reward shapers."""
    group = parser.add_argument_group("advantages")
    group.add_argument(
        "--adv_estimator", default="grpo", type=ADVANTAGE_ESTIMATORS.choice(),
        help=f"{' | '.join(ADVANTAGE_ESTIMATORS.names())} | package.module:function. grpo: group mean/std; rloo: "
             "leave-one-out group baseline; reinforce_pp: REINFORCE++, global batch mean/std (--no_std_normalize "
             "drops the std where one is used); maxent: n * softmax(rewards / tau) - 1 within the group")
    group.add_argument("--adv_option", nargs="+", default=[], type=option, metavar="NAME=VALUE",
                       help="the estimator's own hyperparameters, in its AdvantageConfig.options (an estimator of "
                            "your own reads them)")
    group.add_argument("--maxent_tau", type=positive(), default=1.0, help="maxent: the softmax temperature tau")
    group.add_argument("--maxent_target_entropy", type=in_range(0, 1), default=0.0,
                       help="maxent: adapt tau after every episode towards this entropy of the weights, as a fraction "
                            "of log(--num_generations) (0: tau stays fixed)")
    group.add_argument("--maxent_tau_lr", type=positive(), default=0.1, help="maxent: step of log(tau) per episode")
    group.add_argument("--dynamic_sampling", action="store_true",
                       help="DAPO: replace groups whose rewards all tie by groups of newly drawn prompts until the "
                            "batch is full (logged as dynamic_sampling/extra_rollouts)")
    group.add_argument("--max_sampling_rounds", type=at_least(1), default=4,
                       help="dynamic sampling: extra prompt batches drawn at most per collect step; tied groups fill "
                            "what is still missing and are masked out of the loss")
    group.add_argument("--reward_shaping", nargs="+", default=[], type=REWARD_SHAPERS.choice(),
                       help=f"reward shapers added to each completion's reward: {' | '.join(REWARD_SHAPERS.names())}. "
                            "overlong: DAPO's soft penalty over the last --overlong_buffer_len tokens before "
                            "--max_new_tokens, from 0 down to -1")
    group.add_argument("--overlong_buffer_len", type=at_least(0), default=0,
                       help="overlong: tokens before --max_new_tokens where the penalty grows (0: a quarter of it)")
    group.add_argument("--overlong_penalty_factor", type=non_negative(), default=1.0, help="overlong: the penalty's weight")


def add_async_args(parser: argparse.ArgumentParser) -> None:
    """GRPO's asynchronous rollouts: generator processes (Ray actors) that run ahead of the trainer."""
    group = parser.add_argument_group("asynchronous rollouts")
    group.add_argument("--async_rollout", action="store_true",
                       help="generate in Ray actors (or vLLM servers, with --rollout_backend vllm) while the trainer "
                            "trains (rank 0 drives them; --plugin ddp)")
    group.add_argument("--max_staleness", type=at_least(0), default=1,
                       help="trained samples come from weights at most K episodes older than the trainer's (0: on-policy)")
    group.add_argument("--max_concurrent_rollouts", type=at_least(0), default=0,
                       help="prompts in generation at once (0: twice the global batch of prompts)")
    group.add_argument("--num_generators", type=at_least(1), default=1,
                       help="generator actors (or vLLM servers), each with a copy of the policy")
    group.add_argument("--generator_max_restarts", type=at_least(0), default=3,
                       help="generators that die are replaced this many times in all; then the run stops with an error")


def add_ppo_args(parser: argparse.ArgumentParser) -> None:
    """PPO's critic and GAE flags, on top of `add_grpo_args`. Here `--kl_coef` weighs
    the per-token KL penalty in the reward (k1 by default), and `--reward_fn` is optional."""
    group = parser.add_argument_group("ppo")
    group.add_argument("--critic_pretrain", default=None,
                       help="critic initialisation (default: --rm_pretrain, else --pretrain with a new value head)")
    group.add_argument("--critic_lr", type=positive(), default=None, help="critic learning rate (default: --lr)")
    group.add_argument("--critic_warmup_episodes", type=at_least(0), default=0,
                       help="train only the critic for the first N episodes, so the policy's first advantages come "
                            "from values fitted to its own returns (OpenRLHF's --freezing_actor_steps)")
    group.add_argument("--gamma", type=in_range(0, 1), default=1.0, help="GAE discount")
    group.add_argument("--lam", type=in_range(0, 1), default=0.95, help="GAE lambda")
    group.add_argument("--value_clip", type=positive(), default=0.2, help="clipping range of the value loss")
    group.add_argument("--no_whiten_advantages", action="store_true", help="keep raw GAE advantages")
    parser.set_defaults(reward_fn=[], kl_coef=0.05, kl_estimator="k1", num_generations=1)
