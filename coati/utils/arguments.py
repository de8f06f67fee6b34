"""The one argument builder every training script shares: same flags, same defaults, everywhere."""
import argparse

from coati.distributed.plugins import add_plugin_args


def training_parser(description: str, dataset_flag: str = "--dataset") -> argparse.ArgumentParser:
    """Flags common to all training scripts; a script adds only its algorithm's own flags. On-policy
    scripts name their data `--prompt_dataset` (stored as `args.dataset` all the same)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model = parser.add_argument_group("model")
    model.add_argument("--pretrain", required=True, help="model directory loadable with from_pretrained")
    model.add_argument("--tokenizer_dir", default=None, help="tokenizer directory (default: --pretrain)")
    model.add_argument("--trust_remote_code", action="store_true", help="allow custom modelling code shipped with the model")
    model.add_argument("--grad_checkpoint", action="store_true", help="recompute activations in backward to save memory")
    model.add_argument("--lora_rank", type=int, default=0, help="train rank-r LoRA adapters only (0: full fine-tuning)")
    model.add_argument("--lora_alpha", type=float, default=16, help="LoRA scaling numerator (scale = alpha / rank)")
    model.add_argument("--lora_dropout", type=float, default=0.0)
    model.add_argument("--lora_target_modules", nargs="+", default=["all-linear"],
                       help="module names to adapt, or 'all-linear' for every linear layer but the output head")

    data = parser.add_argument_group("data")
    data.add_argument(dataset_flag, dest="dataset", nargs="+", required=True,
                      help="prepared dataset directories (prepare_dataset.py)")
    data.add_argument("--eval_dataset", nargs="*", default=None, help="prepared evaluation dataset directories")
    data.add_argument("--max_length", type=int, default=0,
                      help="cut longer rows from the right at batching time (0: keep the length they were prepared with)")

    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--max_epochs", type=int, default=1)
    optim.add_argument("--max_steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    optim.add_argument("--batch_size", type=int, default=4, help="micro-batch size per rank")
    optim.add_argument("--accumulation_steps", type=int, default=1, help="micro-batches per optimizer step")
    optim.add_argument("--lr", type=float, default=5e-5)
    optim.add_argument("--weight_decay", type=float, default=0.0)
    optim.add_argument("--lr_scheduler", default="cosine", choices=("cosine", "linear", "constant_with_warmup"))
    optim.add_argument("--warmup_steps", type=int, default=0, help="learning-rate warm-up, in optimizer steps")
    optim.add_argument("--seed", type=int, default=42)

    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--save_dir", default=None, help="where checkpoints epoch-{e}_step-{s} are written")
    ckpt.add_argument("--save_interval", type=int, default=0, help="save every N optimizer steps (0: only at the end)")
    ckpt.add_argument("--keep_last", type=int, default=0, help="keep only the N newest checkpoints (0: keep all)")
    ckpt.add_argument("--checkpoint_path", default=None,
                      help="resume from this checkpoint directory, or 'latest' for the newest complete one in --save_dir")
    ckpt.add_argument("--output_dir", default=None, help="final HF-format model and evaluation results")

    log = parser.add_argument_group("logging")
    log.add_argument("--log_dir", default=None, help="TensorBoard events and metrics.jsonl")
    log.add_argument("--log_interval", type=int, default=10, help="log every N optimizer steps")
    log.add_argument("--use_wandb", action="store_true", help="also log to Weights & Biases (WANDB_MODE=offline works)")
    log.add_argument("--wandb_project", default="coati")

    add_plugin_args(parser)
    return parser


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
    rl.add_argument("--num_episodes", type=int, default=10, help="collect-then-learn episodes")
    rl.add_argument("--num_collect_steps", type=int, default=1, help="prompt batches per episode")
    rl.add_argument("--num_update_steps", type=int, default=1, help="passes over an episode's experience")
    rl.add_argument("--num_generations", type=int, default=8, help="completions per prompt (the group)")
    rl.add_argument("--max_new_tokens", type=int, default=64)
    rl.add_argument("--temperature", type=float, default=1.0)
    rl.add_argument("--top_p", type=float, default=1.0)
    rl.add_argument("--top_k", type=int, default=0)
    rl.add_argument("--reward_fn", nargs="+", default=["math_answer"],
                    help="reward functions, by built-in name or package.module:function, each optionally =weight")
    rl.add_argument("--kl_coef", type=float, default=0.0, help="weight of the KL to the reference in the loss (0: no reference)")
    rl.add_argument("--kl_estimator", default="k3", choices=("k1", "k2", "k3"))
    rl.add_argument("--clip_eps_low", type=float, default=0.2)
    rl.add_argument("--clip_eps_high", type=float, default=0.2, help="DAPO's clip-higher uses 0.28")
    rl.add_argument("--loss_agg", default="token-mean",
                    choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
                    help="token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO)")
    rl.add_argument("--no_std_normalize", action="store_true", help="Dr. GRPO: do not divide advantages by the group std")
    rl.add_argument("--drop_tied_groups", action="store_true", help="DAPO: mask out groups whose rewards all tie")
    rl.add_argument("--entropy_coef", type=float, default=0.0)
    rl.add_argument("--eval_interval", type=int, default=0,
                    help="held-out evaluation every N episodes (always before the first and after the last)")
    rl.add_argument("--sample_log_interval", type=int, default=10,
                    help="a table of prompts, completions, rewards and advantages every N episodes (0: never): "
                         "JSON under --log_dir/samples, and a W&B table with --use_wandb")


def add_async_args(parser: argparse.ArgumentParser) -> None:
    """GRPO's asynchronous rollouts: generator processes (Ray actors) that run ahead of the trainer."""
    group = parser.add_argument_group("asynchronous rollouts")
    group.add_argument("--async_rollout", action="store_true",
                       help="generate in Ray actors while the trainer trains (rank 0 drives them; --plugin ddp)")
    group.add_argument("--max_staleness", type=int, default=1,
                       help="trained samples come from weights at most K episodes older than the trainer's (0: on-policy)")
    group.add_argument("--max_concurrent_rollouts", type=int, default=0,
                       help="prompts in generation at once (0: twice the global batch of prompts)")
    group.add_argument("--num_generators", type=int, default=1, help="generator actors, each with a copy of the policy")
    group.add_argument("--generator_max_restarts", type=int, default=3,
                       help="generators that die are replaced this many times in all; then the run stops with an error")
    group.add_argument("--behaviour_cap", type=float, default=5.0,
                       help="cap on the off-policy weight pi_prox / pi_behaviour of each token (decoupled PPO)")


def add_ppo_args(parser: argparse.ArgumentParser) -> None:
    """PPO's critic, reward model, GAE and ptx flags, on top of `add_grpo_args`. Here `--kl_coef` weighs
    the per-token KL penalty in the reward (k1 by default), and `--reward_fn` is optional."""
    group = parser.add_argument_group("ppo")
    group.add_argument("--rm_pretrain", default=None, help="trained reward model directory (train_rm.py --output_dir/model)")
    group.add_argument("--critic_pretrain", default=None,
                       help="critic initialisation (default: --rm_pretrain, else --pretrain with a new value head)")
    group.add_argument("--critic_lr", type=float, default=None, help="critic learning rate (default: --lr)")
    group.add_argument("--gamma", type=float, default=1.0, help="GAE discount")
    group.add_argument("--lam", type=float, default=0.95, help="GAE lambda")
    group.add_argument("--value_clip", type=float, default=0.2, help="clipping range of the value loss")
    group.add_argument("--no_whiten_advantages", action="store_true", help="keep raw GAE advantages")
    group.add_argument("--ptx_dataset", nargs="*", default=None, help="prepared sft data for the ptx loss")
    group.add_argument("--ptx_coef", type=float, default=0.0, help="weight of the ptx (supervised) loss")
    group.add_argument("--ptx_batch_size", type=int, default=None, help="ptx micro-batch per rank (default: --batch_size)")
    parser.set_defaults(reward_fn=[], kl_coef=0.05, kl_estimator="k1", num_generations=1)
