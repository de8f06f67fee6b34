"""Every option of a run, declared once: frozen dataclasses whose fields carry their flag, help and range.

`coati.cli` builds each script's parser (its validation and `--help`) from these classes and builds them back from
the parsed flags; the trainers, experience makers and plugins take them as they are. Light (no torch), so `--help`
answers at once. An option a user sets is a `setting`; a field the run derives is marked `flag=NOT_A_FLAG`.
"""
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from coati.utils.cadence import LogCadence
from coati.utils.errors import CoatiUsageError
from coati.utils.metrics_logger import DEFAULT_WANDB_TABLE_ROWS
from coati.utils.ranges import (at_least, in_range, non_negative, positive, readable_file, renaming,
                                whole_or_fraction)
from coati.utils.registry import (ADVANTAGE_ESTIMATORS, AGENTS, AGGREGATIONS, BEHAVIOUR_CORRECTIONS, DISTILL_LOSSES,
                                  KL_ESTIMATORS, OBJECTIVES, POLICY_LOSSES, REWARD_SHAPERS, TOOL_CALL_PARSERS, TOOLS,
                                  option)
from coati.utils.settings import NOT_A_FLAG, nested, setting

PLUGIN_HELP = {
    "ddp": "torch DistributedDataParallel; CPU (gloo) or GPU",
    "zero2": "ZeRO stage 2 (optimizer states and gradients sharded); CUDA",
    "zero2_cpu": "ZeRO stage 2 with optimizer states offloaded to CPU memory; CUDA",
    "gemini": "Gemini chunk-based ZeRO-3, static placement on the GPU; CUDA",
    "gemini_auto": "Gemini with automatic CPU/GPU placement of parameters; CUDA",
    "3d": "HybridParallelPlugin: --tp/--pp/--sp with --zero_stage; CUDA",
}
PLUGINS = tuple(PLUGIN_HELP)
SP_MODES = ("split_gather", "ring", "all_to_all", "ring_attn")
REPORT_TO = ("tensorboard", "wandb", "none")
TINY_VISION_STYLES = ("qwen2_5_vl", "llava")
"""The vision-language architectures `coati tiny-model --vision` builds: Qwen2.5-VL, and LLaVA (a CLIP tower and a Llama)."""
PREPARE_MAX_LENGTH = 2048
"""Tokens a row is prepared to at most: `coati prepare`'s default, and raw data's where --max_length does not say."""
DEFAULT_DIST_TIMEOUT_S = 600
"""How long a collective waits for a peer before a rank gives up (`--dist_timeout`; NCCL's default, gloo's is 30 min)."""
DEFAULT_REWARD_TIMEOUT_S = 600.0
DEFAULT_SERVER_TIMEOUT_S = 30.0
"""Seconds one reward-server request may take (`--reward_server_timeout`)."""
DEFAULT_SERVER_RETRIES = 3
"""Retries of a failed reward-server request (`--reward_server_retries`)."""


def _options(pairs: Any) -> Dict[str, Any]:
    """`--x_option NAME=VALUE ...` as a dict."""
    return dict(pairs)


def _option_list(**kwargs: Any) -> Any:
    """A field of NAME=VALUE hyperparameters for a registered function."""
    return setting(factory=dict, parse=option, nargs="+", metavar="NAME=VALUE", convert=_options, **kwargs)


# ---- every script ---------------------------------------------------------------------------------
SCHEDULE_OPTIONS = {"cosine": ("num_cycles",), "linear": (), "constant_with_warmup": (), "constant": (),
                    "cosine_with_restarts": ("num_cycles",), "polynomial": ("lr_end", "power"), "inverse_sqrt": (),
                    "cosine_with_min_lr": ("num_cycles", "min_lr", "min_lr_rate"),
                    "warmup_stable_decay": ("num_decay_steps", "num_stable_steps", "warmup_type", "decay_type",
                                            "min_lr_ratio", "num_cycles")}
"""transformers' learning-rate schedules by name -> the settings of their own that its get_scheduler passes on."""


@dataclass(frozen=True)
class ModelSettings:
    """The model to train and how it is held in memory."""

    pretrain: str = setting(aliases=("--model_name_or_path",),
                            help="model directory, or a Hugging Face model id (from the local HF cache; downloaded "
                                 "when online)")
    tokenizer_dir: Optional[str] = setting(None, help="tokenizer directory (default: --pretrain)")
    eos_token: Optional[str] = setting(None, help="a token of the tokenizer's to end each turn or text with (TRL's "
                                                  "eos_token, e.g. <|im_end|> for a base model with a chat template): "
                                                  "the tokenizer's EOS in the data, generation and the saved tokenizer "
                                                  "(default: its own)")
    pad_token: Optional[str] = setting(None, help="a token of the tokenizer's to pad batches with (TRL's pad_token; "
                                                  "default: its own pad token, else its EOS)")
    chat_template: Optional[str] = setting(
        None, metavar="FILE_OR_DIR", aliases=("--chat_template_path",),
        help="the chat template used instead of the tokenizer's, for the data, the rollouts and the saved tokenizer "
             "(TRL's chat_template_path): a Jinja file, or a tokenizer folder or HF id whose template and EOS are "
             "taken; e.g. an instruct template for a base model, or the fix for a template that rewrites earlier "
             "turns in multi-turn rollouts")
    trust_remote_code: bool = setting(False, help="allow custom modelling code shipped with the model")
    grad_checkpoint: bool = setting(False, aliases=("--gradient_checkpointing",), help="recompute activations in backward to save memory")
    use_flash_attn: bool = setting(False, help="FlashAttention-2 where CUDA and flash-attn are there (else a warning "
                                               "and PyTorch SDPA)")
    disable_dropout: bool = setting(False, help="every dropout layer of the trained models (the policy, a reward "
                                                "model, PPO's critic, LoRA's) off, as TRL's disable_dropout")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters (0 rank: full fine-tuning)."""

    lora_rank: int = setting(0, parse=at_least(0), aliases=("--lora_r",), help="train rank-r LoRA adapters only (0: full fine-tuning)")
    lora_alpha: float = setting(16, parse=positive(), help="LoRA scaling numerator (scale = alpha / rank)")
    lora_dropout: float = setting(0.0, parse=in_range(0, 1, high_open=True), help="dropout on the LoRA path")
    lora_target_modules: Tuple[str, ...] = setting(
        ("all-linear",), nargs="+", help="module names to adapt (linear or embedding layers), or 'all-linear' for every "
                                         "linear layer but the output head")
    lora_bias: str = setting("none", choices=("none", "all", "lora_only"),
                             help="biases that train beside the adapters: none, every bias, or those of adapted layers")
    lora_init: str = setting("kaiming_uniform", choices=("kaiming_uniform", "pissa"),
                             help="adapter start: A kaiming-uniform and B zero, or PiSSA (A, B from the weight's top "
                                  "singular vectors, the base keeps the rest; arXiv:2404.02948)")


@dataclass(frozen=True)
class DataSettings:
    """The prepared data (on-policy scripts call it `--prompt_dataset`)."""

    dataset: Tuple[str, ...] = setting(nargs="+", aliases=("--dataset_name",),
                                       help="the training data: JSONL files, folders of them or datasets folders, "
                                            "prepared on the fly (cached), or folders `coati prepare` wrote")
    eval_dataset: Optional[Tuple[str, ...]] = setting(None, nargs="*", help="held-out data, as --dataset takes it")
    max_length: int = setting(0, parse=at_least(0), help="tokens per row: longer conversations are cut from the right, "
                                                         "longer prompts from the left (their end kept), when raw data "
                                                         "is prepared and at batching time (0: the length prepared "
                                                         f"data has; raw data is prepared to {PREPARE_MAX_LENGTH})")
    dataset_train_split: str = setting("train", help="the split trained on where --dataset is a datasets folder or a "
                                                     "folder of files named by split (train.jsonl, test.jsonl), as "
                                                     "datasets.load_dataset reads them")
    dataset_test_split: Optional[str] = setting(None, help="held-out data: this split of --dataset's folders (e.g. test), "
                                                           "where --eval_dataset and --eval_split are not given")
    dataset_config: Optional[str] = setting(None, help="the configuration (subset) of --dataset's datasets folders or "
                                                       "Hub datasets to read, datasets.load_dataset's name (e.g. main "
                                                       "for openai/gsm8k)")
    dataset_columns: Dict[str, str] = setting(
        factory=dict, parse=renaming, nargs="+", metavar="COLUMN=NAME", convert=dict,
        help="read raw data's column COLUMN as NAME, the name coati's formats give it (e.g. question=prompt "
             "answer=completion; OpenRLHF's input_key, verl's prompt_key)")
    eval_split: float = setting(0.0, parse=in_range(0, 1, high_open=True),
                                help="hold out this fraction of the training rows (seeded by --seed) as the evaluation "
                                     "set, where --eval_dataset is not given (0: none)")
    prepared_cache_dir: Optional[str] = setting(None, help="where raw data given to --dataset (a JSONL file, a folder of "
                                                           "them, a datasets folder) is prepared and kept for the next "
                                                           "run (default: $COATI_CACHE, else ~/.cache/coati/prepared)")


@dataclass(frozen=True)
class VisionSettings:
    """Vision-language models (a model folder with an image processor): what trains, and the images' size."""

    freeze_vision_tower: bool = setting(False, help="keep the vision encoder's weights as they are (it still runs)")
    freeze_multi_modal_projector: bool = setting(False, help="keep the projector from image features into the "
                                                             "language model as it is")
    max_pixels: int = setting(0, parse=at_least(0), help="resize each image down to at most this many pixels before "
                                                         "it becomes image tokens (Qwen2-VL-style processors; 0: the "
                                                         "processor's own limit)")
    min_pixels: int = setting(0, parse=at_least(0), help="resize each image up to at least this many pixels "
                                                         "(Qwen2-VL-style processors; 0: the processor's own)")

    def check(self, run: Any) -> None:
        if self.max_pixels and self.min_pixels > self.max_pixels:
            raise CoatiUsageError(f"--min_pixels {self.min_pixels} is above --max_pixels {self.max_pixels}")


@dataclass(frozen=True)
class PackingSettings:
    """Supervised batches without padding."""

    packing: bool = setting(False, help="concatenate each micro-batch's rows into one sequence, no padding; attention "
                                        "stays within each row and the loss is the unpacked one")
    max_tokens_per_batch: int = setting(0, parse=at_least(0),
                                        help="with --packing: fill each micro-batch with rows up to this many tokens (a "
                                             "preference row counts chosen + rejected) instead of --batch_size rows "
                                             "(0: --batch_size rows)")

    def check(self, run: Any) -> None:
        """Packed batches need --packing, and a plugin whose forwards keep attention within each packed row."""
        if self.max_tokens_per_batch and not self.packing:
            raise CoatiUsageError("--max_tokens_per_batch fills packed micro-batches; add --packing")
        if self.packing and run.parallel.plugin == "3d":
            raise CoatiUsageError("--packing is not supported with --plugin 3d (its sharded forwards do not keep "
                                  "attention within packed rows); use ddp, zero2, zero2_cpu, gemini or gemini_auto")


@dataclass(frozen=True)
class EpochSettings:
    """How long a supervised run lasts."""

    max_epochs: float = setting(1, parse=whole_or_fraction(), aliases=("--num_train_epochs",),
                                help="passes over the training data (unless --max_steps is set); a fraction, TRL's "
                                     "1.5, ends the run that far into the last pass")
    max_steps: int = setting(0, parse=at_least(-1), help="train this many optimizer steps, passing over the data as "
                                                        "often as that takes; over --max_epochs, as in TRL (0, or "
                                                        "TRL's -1: --max_epochs decides)")


@dataclass(frozen=True)
class StepSettings:
    """How micro-batches become optimizer steps, and what a non-finite step does."""

    accumulation_steps: int = setting(1, parse=at_least(1), aliases=("--gradient_accumulation_steps",), help="micro-batches per optimizer step")
    skip_nonfinite: int = setting(0, parse=at_least(0),
                                  help="skip up to N optimizer steps whose loss or gradient norm is NaN/inf (counted in "
                                       "the metrics); one more stops the run (0: the first one stops it)")


@dataclass(frozen=True)
class OptimSettings:
    """The optimizer and its schedule."""

    batch_size: int = setting(4, parse=at_least(1), help="micro-batch size per rank")
    eval_batch_size: int = setting(0, parse=at_least(0), aliases=("--per_device_eval_batch_size",),
                                   help="rows per rank in an evaluation batch; on-policy, held-out prompts, each "
                                        "completed once (0: --batch_size)")
    lr: float = setting(5e-5, parse=positive(), aliases=("--learning_rate",), help="peak learning rate")
    weight_decay: float = setting(0.0, parse=non_negative(), help="AdamW weight decay")
    adam_beta1: float = setting(0.9, parse=in_range(0, 1, high_open=True), help="AdamW's beta1 (HF's name)")
    adam_beta2: float = setting(0.999, parse=in_range(0, 1, high_open=True), help="AdamW's beta2 (HF's name)")
    adam_epsilon: float = setting(1e-8, parse=positive(), help="AdamW's epsilon (HF's name)")
    lr_scheduler: str = setting("cosine", choices=tuple(SCHEDULE_OPTIONS), aliases=("--lr_scheduler_type",),
                                help="learning-rate schedule after the warm-up (transformers' get_scheduler)")
    lr_scheduler_options: Dict[str, Any] = _option_list(
        flag="--lr_scheduler_option", aliases=("--lr_scheduler_kwargs",),
        help="the schedule's own settings (HF's lr_scheduler_kwargs): min_lr_rate=0.1 (or min_lr=1e-6) for "
             "cosine_with_min_lr, num_cycles for the cosines, lr_end and power for polynomial, num_decay_steps (and "
             "num_stable_steps, min_lr_ratio, ...) for warmup_stable_decay")
    warmup_steps: int = setting(0, parse=at_least(0), help="learning-rate warm-up, in optimizer steps")
    warmup_ratio: float = setting(0.0, parse=in_range(0, 1, high_open=True),
                                  help="warm-up as a fraction of the run's optimizer steps, where --warmup_steps is 0")
    seed: int = setting(42, parse=int, help="seeds every RNG and the data order")
    steps: StepSettings = nested(StepSettings)

    def check(self, run: Any) -> None:
        """The schedule's options are its own (HF's get_scheduler passes them on); cosine_with_min_lr needs its floor
        and warmup_stable_decay its decay, before any model loads."""
        taken = SCHEDULE_OPTIONS[self.lr_scheduler]
        unknown = sorted(set(self.lr_scheduler_options) - set(taken))
        if unknown:
            raise CoatiUsageError(f"--lr_scheduler_option {', '.join(unknown)}: not a setting of --lr_scheduler "
                                  f"{self.lr_scheduler} ({', '.join(taken) or 'it takes none'})")
        needed = {"cosine_with_min_lr": ("min_lr_rate", "min_lr"), "warmup_stable_decay": ("num_decay_steps",)}
        names = needed.get(self.lr_scheduler, ())
        if names and sum(name in self.lr_scheduler_options for name in names) != 1:
            raise CoatiUsageError(f"--lr_scheduler {self.lr_scheduler} needs "
                                  f"{' or '.join(f'--lr_scheduler_option {name}=...' for name in names)}"
                                  f"{' (one of them)' if len(names) > 1 else ''}")


@dataclass(frozen=True)
class CheckpointSettings:
    """Where and when checkpoints are written, and where the final model goes."""

    save_dir: Optional[str] = setting(None, help="where checkpoints epoch-{e}_step-{s} are written (and, without "
                                                 "--output_dir, the final model, in save_dir/modeling as ColossalChat "
                                                 "writes it)")
    save_interval: int = setting(0, parse=at_least(0), help="save every N optimizer steps (0: only at the end)")
    save_freq_epochs: int = setting(0, parse=at_least(0), help="also save when every N-th epoch ends (0: off)")
    save_freq_secs: float = setting(0, parse=non_negative(),
                                    help="also save once N seconds have passed since the last checkpoint (0: off)")
    keep_last: int = setting(0, parse=at_least(0), aliases=("--save_total_limit",), help="keep only the N newest checkpoints (0: keep all)")
    checkpoint_path: Optional[str] = setting(None, help="resume from this checkpoint directory, or 'latest' for the "
                                                        "newest complete one in --save_dir")
    output_dir: Optional[str] = setting(None, help="final HF-format model and evaluation results")


@dataclass(frozen=True)
class LogSettings:
    """Where metrics go and how often."""

    log_dir: Optional[str] = setting(None, aliases=("--logging_dir",),
                                     help="TensorBoard events and metrics.jsonl (default: --output_dir/logs)")
    report_to: Tuple[str, ...] = setting(("tensorboard",), nargs="+", choices=REPORT_TO,
                                         help="tensorboard: TensorBoard events and metrics.jsonl under --log_dir; "
                                              "wandb: also Weights & Biases (as --use_wandb); none: neither")
    cadence: LogCadence = nested(LogCadence)
    use_wandb: bool = setting(False, help="also log to Weights & Biases (WANDB_MODE=offline works)")
    wandb_project: str = setting("coati", help="W&B project of the run")
    run_name: Optional[str] = setting(None, help="the run's name in W&B (HF's run_name; default: the trainer's class "
                                                 "name)")
    wandb_table_rows: int = setting(DEFAULT_WANDB_TABLE_ROWS, parse=at_least(0),
                                    help="rows of each sample table sent to W&B (the JSON sidecar under --log_dir keeps "
                                         "them all)")


@dataclass(frozen=True)
class PluginConfig:
    """The plugin and its settings: `build_booster` makes a colossalai `Plugin` and `Booster` from it."""

    plugin: str = setting("ddp", choices=PLUGINS, help="; ".join(f"{k}: {v}" for k, v in PLUGIN_HELP.items()))
    mixed_precision: str = setting("bf16", choices=("fp16", "bf16", "fp32"),
                                   help="compute precision with fp32 master weights; ddp takes fp32 or bf16 (autocast); "
                                        "a machine without CUDA trains in fp32")
    tf32: bool = setting(False, help="let CUDA's fp32 matrix products and convolutions use TF32 (Ampere and newer; "
                                     "HF's tf32)")
    grad_clip: float = setting(1.0, parse=non_negative(), aliases=("--max_grad_norm",),
                               help="clip gradients to this global L2 norm; 0 disables (ZeRO, Gemini and 3d clip inside "
                                    "their optimizer)")
    tp: int = setting(1, parse=at_least(1), help="3d: tensor-parallel size")
    pp: int = setting(1, parse=at_least(1), help="3d: pipeline-parallel size")
    sp: int = setting(1, parse=at_least(1), help="3d: sequence-parallel size")
    sp_mode: Optional[str] = setting(None, choices=SP_MODES, help="3d: sequence-parallel mode; enables sequence parallelism")
    zero_stage: int = setting(0, parse=int, choices=(0, 1, 2), help="3d: ZeRO stage over the data-parallel group")
    zero_cpu_offload: bool = setting(False, help="3d: offload ZeRO optimizer states to CPU")
    microbatch_size: int = setting(1, parse=at_least(1), help="3d with --pp > 1: pipeline micro-batch size")
    dist_timeout: float = setting(DEFAULT_DIST_TIMEOUT_S, parse=positive(), aliases=("--ddp_timeout",),
                                  help="seconds a collective waits for a peer before the run stops with an error (a dead "
                                       "or unreachable node); raise it when rank 0 alone writes very large checkpoints")
    memory_check: bool = setting(True, flag="--no_memory_check", negated=True,
                                 help="start even where the memory estimate says the model states cannot fit (see "
                                      "docs/guides/plugins.md)")
    find_unused_parameters: bool = setting(False, flag=NOT_A_FLAG,
                                           help="ddp: tolerate parameters that get no gradient in a step (a library "
                                                "user's models)")


@dataclass(frozen=True)
class ReferenceSettings:
    """The frozen reference policy (DPO, KTO, GRPO/PPO's KL term)."""

    ref_pretrain: Optional[str] = setting(None, help="reference model directory (default: --pretrain)")
    precompute_ref_logps: bool = setting(False, aliases=("--precompute_ref_log_probs",),
                                         help="score the data with the reference once, store it beside the data, and "
                                              "train without the reference model in memory")
    precompute_ref_batch_size: int = setting(0, parse=at_least(0),
                                             help="rows the reference scores at once with --precompute_ref_logps (0: "
                                                  "--batch_size)")


# ---- each supervised trainer's loss ---------------------------------------------------------------------
RM_LOSSES = ("log_sig", "log_exp")
DEFAULT_BETA = {"sigmoid": 0.1, "ipo": 0.1, "simpo": 2.0, "dpo_loss": 0.1, "simpo_loss": 0.1}
"""DPO's `--beta` where it is not given, by `--loss_type`."""
TRL_SFT_LOSS = "sft"
"""TRL's DPO loss type for the chosen response's NLL, which `loss_type: [sigmoid, sft]` adds (coati's --rpo_alpha)."""
COLOSSALCHAT_MARGIN = 1.4
"""ColossalChat's default --gamma for its simpo_loss."""
DEFAULT_STEP_SEPARATOR = "\n"
"""What follows each step of a process-supervised solution (TRL's PRMTrainer's default; `prepare_dataset.py --type prm`
joins steps with it)."""


@dataclass(frozen=True)
class RewardModelLossSettings:
    """The reward model's pairwise loss."""

    loss_fn: str = setting("log_sig", choices=RM_LOSSES, help="pairwise loss (on chosen - margin, where the data has "
                                                              "TRL's margin column)")
    center_rewards_coefficient: float = setting(0.0, parse=non_negative(),
                                                help="add this times (r_chosen + r_rejected)^2 per pair, keeping the "
                                                     "rewards centred on zero (TRL's; Eisenstein et al. 2023)")


@dataclass(frozen=True)
class PreferenceLossSettings:
    """DPO, IPO or SimPO on preference pairs."""

    loss_type: str = setting("sigmoid", choices=(*DEFAULT_BETA, TRL_SFT_LOSS), nargs="+",
                             help="sigmoid: DPO; ipo: IPO; simpo: SimPO (no reference model); ColossalChat's names: "
                                  "dpo_loss is sigmoid, simpo_loss is DPO on length-normalised log-probs with a margin "
                                  f"(--gamma, default {COLOSSALCHAT_MARGIN}), the reference kept unless "
                                  "--disable_reference_model. TRL's list of one of these and sft (weighted by "
                                  "loss_weights) is that loss plus --rpo_alpha, sft's weight")
    beta: Optional[float] = setting(None, parse=positive(), help="inverse temperature (default: 0.1; simpo 2.0)")
    label_smoothing: float = setting(0.0, parse=in_range(0, 0.5, high_open=True),
                                     help="cDPO: assumed rate of flipped labels")
    gamma: Optional[float] = setting(None, parse=non_negative(),
                                     help="target reward margin (default: simpo 0.5; sigmoid 0, ColossalChat's DPO "
                                          "margin)")
    rpo_alpha: float = setting(0.0, parse=non_negative(),
                               help="RPO (Pang et al. 2024, TRL's rpo_alpha): add this times the chosen response's "
                                    "per-token NLL to each pair's loss (0: off)")


@dataclass(frozen=True)
class KTOLossSettings:
    """KTO's loss."""

    beta: float = setting(0.1, parse=positive(), help="inverse temperature")
    desirable_weight: float = setting(1.0, parse=positive(), help="weight of desirable completions")
    undesirable_weight: float = setting(1.0, parse=positive(), help="weight of undesirable completions")


@dataclass(frozen=True)
class ORPOLossSettings:
    """ORPO's odds-ratio term."""

    lam: float = setting(0.1, parse=non_negative(), aliases=("--beta",),
                         help="weight of the odds-ratio term (TRL's ORPO beta, the paper's lambda)")


@dataclass(frozen=True)
class StepLabelSettings:
    """How a process reward model finds the steps of a solution."""

    step_separator: str = setting(DEFAULT_STEP_SEPARATOR,
                                  help="what ends each step, saved with the model for PPO/GRPO to find the steps of a "
                                       "completion (prepare_dataset.py --type prm joins steps with \\n)")

    def check(self, run: Any) -> None:
        """A PRM reads its labels at the steps' ends of padded rows: no packing."""
        if run.batching.packing:
            raise CoatiUsageError("--packing is not for train_prm.py: a PRM reads its labels at the steps' ends of "
                                  "padded rows")


# ---- on-policy scripts ----------------------------------------------------------------------------
@dataclass
class SamplingConfig:
    """How to sample: `temperature` 0 (or `do_sample` False) is greedy; `top_k` 0, `top_p` 1, `min_p` 0 and
    `repetition_penalty` 1 are off (the penalty applies to greedy decoding too, as in transformers and vLLM)."""

    max_new_tokens: int = setting(64, parse=at_least(1), aliases=("--max_completion_length",),
                                  help="longest completion, in tokens")
    temperature: float = setting(1.0, parse=positive(), help="sampling temperature")
    top_p: float = setting(1.0, parse=in_range(0, 1, low_open=True),
                           help="nucleus sampling: sample from the smallest set of tokens whose probability reaches P")
    top_k: int = setting(0, parse=at_least(0), help="0: no top-k cut")
    min_p: float = setting(0.0, parse=in_range(0, 1), help="sample only tokens at least this fraction as likely as the "
                                                           "likeliest (0: off)")
    repetition_penalty: float = setting(1.0, parse=positive(),
                                        help="divide the positive logits of tokens already in the prompt or the "
                                             "completion by this, multiply the negative ones (1: off; the trainer's "
                                             "log-probs stay the model's own)")
    do_sample: bool = setting(True, flag=NOT_A_FLAG, help="sample (False: greedy)")
    stop_token_ids: Tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class EpisodeSettings:
    """How an on-policy run is divided: episodes of collect steps, then update passes."""

    num_episodes: int = setting(10, parse=at_least(1), help="collect-then-learn episodes")
    num_epochs: float = setting(0.0, parse=non_negative(), aliases=("--num_train_epochs",),
                                help="passes over the prompts (TRL's num_train_epochs): sets --num_episodes once the "
                                     "prompts are loaded, the last pass rounded up to an episode (0: --num_episodes "
                                     "decides)")
    num_collect_steps: int = setting(1, parse=at_least(1), help="prompt batches per episode")
    num_update_steps: int = setting(1, parse=at_least(1), aliases=("--num_iterations", "--num_ppo_epochs"),
                                    help="passes over an episode's experience (TRL's GRPO num_iterations, PPO "
                                         "num_ppo_epochs)")
    inference_batch_size: int = setting(0, parse=at_least(0), help="completions generated at once on each rank (0: every "
                                                                   "completion of a collect step)")


@dataclass(frozen=True)
class ShapingConfig:
    """Reward shapers' settings: `max_length` is the completion length limit (0: the sampling's `max_new_tokens`)."""

    max_length: int = setting(0, flag=NOT_A_FLAG, help="the completion length limit")
    overlong_buffer: int = setting(0, parse=at_least(0), flag="--overlong_buffer_len",
                                   help="overlong: tokens before --max_new_tokens where the penalty grows (0: a quarter "
                                        "of it)")
    overlong_factor: float = setting(1.0, parse=non_negative(), flag="--overlong_penalty_factor",
                                     help="overlong: the penalty's weight")

    def resolved(self, completion_limit: int) -> "ShapingConfig":
        """This config with `max_length` set, to `completion_limit` where it is 0."""
        return self if self.max_length else replace(self, max_length=completion_limit)


@dataclass(frozen=True)
class RolloutConfig:
    """What every experience maker needs to know."""

    sampling: SamplingConfig = nested(SamplingConfig)
    num_generations: int = setting(8, parse=at_least(1), help="completions per prompt (GRPO's group: at least 2)")
    kl_estimator: str = setting("k3", parse=KL_ESTIMATORS.choice(),
                                help=KL_ESTIMATORS.describe("estimator of the KL to the reference"))
    dynamic_sampling: bool = setting(False, help="DAPO: replace groups whose rewards all tie by groups of newly drawn "
                                                 "prompts until the batch is full (logged as "
                                                 "dynamic_sampling/extra_rollouts)")
    max_sampling_rounds: int = setting(4, parse=at_least(1),
                                       help="dynamic sampling: extra prompt batches drawn at most per collect step; tied "
                                            "groups fill what is still missing and are masked out of the loss")
    old_log_probs_at_collection: bool = setting(
        True, flag=NOT_A_FLAG,
        help="Run the actor over the completions when the experience is made, for the old policy's log-probs. The "
             "runner turns it off when every experience gets exactly one policy update (`--num_update_steps 1` and one "
             "optimizer step per update pass): the old log-probs then equal the learning forward's own, which are "
             "taken detached instead (as TRL does with one iteration), one forward fewer per batch. With a reference "
             "model the forward stays (the KL to it is logged, and adapted, from the experience).")
    forward_batch_size: int = setting(0, parse=at_least(0), flag="--logits_forward_batch_size",
                                      help="rows per forward when the experience's log-probs, values and reward-model "
                                           "scores are computed (0: all at once)")
    packing: bool = setting(False, help="run the update's forwards (the learning, old-policy, reference and critic "
                                        "forwards) packed: no padding, and the completions of one prompt share one "
                                        "forward of it; the values are the padded ones")
    reward_model_weight: float = setting(1.0, parse=non_negative(), flag="--rm_weight",
                                         help="weight of --rm_pretrain's score in the reward, beside --reward_fn's "
                                              "weights (the component rewards/reward_model is logged unweighted)")


@dataclass(frozen=True)
class GRPOConfig(RolloutConfig):
    """GRPO's rollouts and advantages."""

    num_generations: int = setting(8, parse=at_least(2),
                                   help="completions per prompt: the group each completion's advantage is relative to")

    scale_rewards: bool = setting(True, flag="--no_std_normalize", negated=True,
                                  help="Dr. GRPO: do not divide advantages by the group std")
    drop_tied_groups: bool = setting(False, help="DAPO: mask out groups whose rewards all tie")
    mask_truncated_completions: bool = setting(
        False, help="DAPO: mask out of the loss the completions cut at the length limit (no stop token); they still "
                    "count in their group's advantages, as in TRL")
    advantage_estimator: str = setting(
        "grpo", parse=ADVANTAGE_ESTIMATORS.choice(), flag="--adv_estimator",
        help=ADVANTAGE_ESTIMATORS.describe("how a completion's advantage comes from the rewards"))
    advantage_options: Dict[str, Any] = _option_list(
        flag="--adv_option", help="the estimator's own hyperparameters, in its AdvantageConfig.options (an estimator of "
                                  "your own reads them)")
    reward_shaping: Tuple[str, ...] = setting(
        (), nargs="+", parse=REWARD_SHAPERS.choice(),
        help=REWARD_SHAPERS.describe("reward shapers added to each completion's reward"))
    shaping: ShapingConfig = nested(ShapingConfig)
    kl_in_reward: bool = setting(False, help="the KL to the reference in each completion's reward instead of the loss: "
                                             "its per-token KL summed, times --kl_coef, subtracted before the "
                                             "advantages (verl's algorithm.use_kl_in_reward, OpenRLHF's REINFORCE++)")

    def check(self, run: Any) -> None:
        """The overlong penalty's buffer lies within the completion limit; step scores go with the process
        estimator, and it with them; the KL in the reward has a weight."""
        if self.kl_in_reward and run.kl.kl_coef <= 0:
            raise CoatiUsageError(f"--kl_coef {run.kl.kl_coef}: --kl_in_reward subtracts it times each completion's KL "
                                  "to the reference from its reward; give it above 0")
        if "overlong" in self.reward_shaping and self.shaping.overlong_buffer > self.sampling.max_new_tokens:
            raise CoatiUsageError(f"--overlong_buffer_len {self.shaping.overlong_buffer} must be at most "
                                  f"--max_new_tokens {self.sampling.max_new_tokens}: the penalty grows over the last "
                                  "tokens before that limit")
        prm = run.process_reward.prm_pretrain
        if prm and self.advantage_estimator != "process":
            raise CoatiUsageError(f"--prm_pretrain: GRPO reads step scores through --adv_estimator process, not "
                                  f"{self.advantage_estimator}; add --adv_estimator process")
        if self.advantage_estimator == "process" and not prm:
            raise CoatiUsageError("--adv_estimator process needs step scores: --prm_pretrain (a train_prm.py model)")


@dataclass(frozen=True)
class PPOConfig(RolloutConfig):
    """PPO's rollouts, reward penalty and GAE."""

    num_generations: int = setting(1, parse=at_least(1), help="completions per prompt")
    dynamic_sampling: bool = setting(False, flag=NOT_A_FLAG, help="off: PPO's advantages do not come from groups")
    max_sampling_rounds: int = setting(0, flag=NOT_A_FLAG, help="none: no dynamic sampling")
    kl_estimator: str = setting("k1", parse=KL_ESTIMATORS.choice(),
                                help=KL_ESTIMATORS.describe("estimator of the per-token KL to the reference in the "
                                                            "reward"))
    gamma: float = setting(1.0, parse=in_range(0, 1), help="GAE discount")
    lam: float = setting(0.95, parse=in_range(0, 1), help="GAE lambda")
    whiten_advantages: bool = setting(True, flag="--no_whiten_advantages", negated=True, help="keep raw GAE advantages")


@dataclass(frozen=True)
class KLSettings:
    """The KL to the reference: its weight, adapted (InstructGPT) when a target is given."""

    kl_coef: float = setting(0.0, parse=non_negative(), aliases=("--beta",), help="weight of the KL to the reference in the loss (0: no "
                                                             "reference)")
    kl_target: float = setting(0.0, parse=non_negative(),
                               help="adaptive KL (InstructGPT): move --kl_coef after every episode towards the value "
                                    "that keeps the mean summed KL of a completion at this (0: --kl_coef stays fixed)")
    kl_horizon: int = setting(10000, parse=at_least(1),
                              help="adaptive KL: completions over which the coefficient may move by the full step")
    kl_max_step: float = setting(0.2, parse=in_range(0, 1, low_open=True),
                                 help="adaptive KL: the proportional error KL/target - 1 is clipped to +-this")

    def check(self, run: Any) -> None:
        """Adaptive KL multiplies the coefficient, so it must start above 0."""
        if self.kl_target > 0 and self.kl_coef <= 0:
            raise CoatiUsageError(f"--kl_target {self.kl_target} adapts --kl_coef, which must start above 0 (it is "
                                  f"{self.kl_coef}; adaptive KL multiplies it)")


@dataclass(frozen=True)
class PolicyLossSettings:
    """The actor's per-token policy loss, its clip, aggregation and off-policy weight cap."""

    policy_loss: str = setting(
        "ppo", parse=POLICY_LOSSES.choice(), help=POLICY_LOSSES.describe("the per-token policy loss"))
    policy_loss_options: Dict[str, Any] = _option_list(
        flag="--policy_loss_option", help="the policy loss's own hyperparameters, e.g. temperature_neg=1.05 for sapo")
    clip_eps_low: float = setting(0.2, parse=in_range(0, 1, high_open=True), help="the ratio is clipped below at 1 - this")
    clip_eps_high: float = setting(0.2, parse=non_negative(), aliases=("--epsilon_high",), help="DAPO's clip-higher uses 0.28")
    loss_agg: str = setting("token-mean", parse=AGGREGATIONS.choice(),
                            help=AGGREGATIONS.describe("how the per-token losses become one"))
    behaviour_cap: float = setting(5.0, parse=in_range(1),
                                   help="cap on each token's weight pi_old / pi_behaviour where the samples' own "
                                        "log-probs differ from the trainer's: vLLM's (truncated importance sampling) or "
                                        "older weights' (--async_rollout, decoupled PPO)")
    behaviour_correction: str = setting(
        "truncated", parse=BEHAVIOUR_CORRECTIONS.choice(),
        help=BEHAVIOUR_CORRECTIONS.describe("how that ratio r weights each token"))
    behaviour_correction_options: Dict[str, Any] = _option_list(
        flag="--behaviour_correction_option", help="the correction's own hyperparameters, e.g. low=0.5 high=5 for icepop")

    def check(self, run: Any) -> None:
        """ppo's dual clip bounds a negative advantage's loss at dual_clip |A|, above the clipped ratio's, so it
        must exceed 1 (as verl's clip_ratio_c); cispo's floor lies below an on-policy weight of 1."""
        options = {name: value for name, value in self.policy_loss_options.items()   # a word: refused as one later
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
        dual, floor = options.get("dual_clip"), options.get("floor")
        if dual is not None and dual <= 1:
            raise CoatiUsageError(f"--policy_loss_option dual_clip={dual}: the dual clip bounds the loss of a token "
                                  "with a negative advantage at dual_clip x |A|, and must be above 1 (verl's and the "
                                  "paper's is 3)")
        if floor is not None and floor >= 1:
            raise CoatiUsageError(f"--policy_loss_option floor={floor}: cispo raises importance weights below the "
                                  "floor to it, which must be below 1 (a weight of 1 is on-policy)")


@dataclass(frozen=True)
class EvalSettings:
    """Held-out evaluation: when, how many samples, and which model to keep."""

    eval_interval: int = setting(0, parse=at_least(0), help="held-out evaluation every N episodes (always before the "
                                                            "first and after the last)")
    eval_freq_epochs: int = setting(0, parse=at_least(0),
                                    help="also evaluate when every N-th pass over the prompts ends (0: off)")
    eval_freq_secs: float = setting(0, parse=non_negative(),
                                    help="also evaluate once N seconds have passed since the last evaluation (0: off)")
    eval_n_samples: int = setting(0, parse=at_least(0),
                                  help="besides the greedy completion, sample N completions of each held-out prompt (at "
                                       "--eval_temperature) and log eval/<reward>/pass@k (unbiased, k = 1, 2, 4, ..., "
                                       "N), maj@N and mean@N (0: greedy only)")
    eval_temperature: Optional[float] = setting(None, parse=positive(),
                                                help="sampling temperature of --eval_n_samples (default: --temperature)")
    eval_top_p: Optional[float] = setting(None, parse=in_range(0, 1, low_open=True),
                                          help="nucleus cut of --eval_n_samples (default: --top_p)")
    eval_top_k: Optional[int] = setting(None, parse=at_least(0), help="top-k cut of --eval_n_samples, 0: none "
                                                                      "(default: --top_k)")
    save_best: Optional[str] = setting(None, metavar="METRIC",
                                       help="after each evaluation that beats the earlier ones on this eval metric "
                                            "(higher is better, e.g. rewards/math_answer), export the model to "
                                            "<output>/best (best.json says when)")

    def check(self, run: Any) -> None:
        """--save_best compares evaluations of held-out data and exports the winner into the output folder."""
        if not self.save_best:
            return
        if not run.data.eval_dataset:
            raise CoatiUsageError(f"--save_best {self.save_best} compares evaluations: give --eval_dataset")
        if not (run.checkpoint.output_dir or run.checkpoint.save_dir):
            raise CoatiUsageError(f"--save_best {self.save_best} needs --output_dir (the best model goes to its best/)")
        if run.lora.lora_rank:
            raise CoatiUsageError("--save_best does not support --lora_rank yet (exporting merges the adapters)")


@dataclass(frozen=True)
class PtxSettings:
    """InstructGPT's supervised loss beside the policy's."""

    ptx_dataset: Optional[Tuple[str, ...]] = setting(None, nargs="*", help="prepared sft data for the ptx loss")
    ptx_coef: float = setting(0.0, parse=non_negative(), help="weight of the ptx (supervised) loss")
    ptx_batch_size: Optional[int] = setting(None, parse=at_least(1), help="ptx micro-batch per rank (default: "
                                                                          "--batch_size)")

    def check(self, run: Any) -> None:
        if self.ptx_coef > 0 and not self.ptx_dataset:
            raise CoatiUsageError("--ptx_coef > 0 needs --ptx_dataset (prepared sft data)")


@dataclass(frozen=True)
class OnPolicyConfig:
    """What `OLTrainer` needs besides its parts: the objective, the update's batching, and when it logs, evaluates and
    saves."""

    objective: str = setting(
        "policy_gradient", parse=OBJECTIVES.choice(),
        help=OBJECTIVES.describe("the actor's loss on each micro-batch (your own, e.g. online DPO, is a factory taking "
                                 "an ObjectiveConfig, see docs/concepts/algorithms.md)"))
    objective_options: Dict[str, Any] = _option_list(
        flag="--objective_option", help="the objective's own hyperparameters, in its ObjectiveConfig.options")
    entropy_coef: float = setting(0.0, parse=non_negative(), help="weight of the entropy bonus")
    train_batch_size: int = setting(0, parse=at_least(0),
                                    help="completions per learning micro-batch on each rank (0: each collect step's "
                                         "whole batch)")
    sample_log_interval: int = setting(10, parse=at_least(0),
                                       help="a table of prompts, completions, rewards and advantages every N episodes "
                                            "(0: never): JSON under --log_dir/rich_completions, and a W&B table with "
                                            "--use_wandb")
    grad_clip: float = setting(0.0, flag=NOT_A_FLAG, help="global gradient norm the trainer clips to (0: off, or the "
                                                          "plugin clips inside its optimizer)")
    steps: StepSettings = nested(StepSettings)
    checkpoints: CheckpointSettings = nested(CheckpointSettings)
    logging: LogCadence = nested(LogCadence)
    evaluation: EvalSettings = nested(EvalSettings)
    ptx: PtxSettings = nested(PtxSettings)

    def check(self, run: Any) -> None:
        """Generation and the critic run whole models: no pipeline stages."""
        if run.parallel.pp > 1:
            raise CoatiUsageError("--pp > 1 (pipeline parallelism) is not supported by on-policy trainers (generation "
                                  "and the critic run whole models); use --tp/--sp with --zero_stage for the 3d plugin")


@dataclass(frozen=True)
class SupervisedConfig:
    """What `SLTrainer` needs besides its parts: how long it runs, how micro-batches become optimizer steps, and when
    it logs, evaluates (`evaluation.eval_interval`, in optimizer steps) and saves."""

    epochs: EpochSettings = nested(EpochSettings)
    steps: StepSettings = nested(StepSettings)
    checkpoints: CheckpointSettings = nested(CheckpointSettings)
    logging: LogCadence = nested(LogCadence)
    evaluation: EvalSettings = nested(EvalSettings)


@dataclass(frozen=True)
class RewardSettings:
    """Where rewards come from: functions, servers, a trained reward model."""

    reward_fn: Optional[Tuple[str, ...]] = setting(
        None, nargs="+", aliases=("--reward_funcs",), help="reward functions, by built-in name (math_answer, answer_format, code_tests, judge: an "
                              "LLM judge, see --judge_url), a reward server's http(s):// URL or package.module:function, "
                              "each optionally =weight (default: none; a run needs a reward: these, --rm_pretrain, "
                              "--prm_pretrain or a distillation teacher)")
    rm_pretrain: Optional[str] = setting(None, help="a trained reward model (train_rm.py's exported model): its score is "
                                                    "added to the rewards")
    rm_checkpoint_path: Optional[str] = setting(
        None, help="the reward model's weights from a train_rm.py checkpoint (save_dir/modeling, or a "
                   "save_dir/epoch-E_step-S folder), in place of --rm_pretrain's")
    reward_timeout: float = setting(DEFAULT_REWARD_TIMEOUT_S, parse=positive(),
                                    help="seconds one call of a reward function may take; a call that takes longer "
                                         "stops the run")
    reward_server_timeout: float = setting(DEFAULT_SERVER_TIMEOUT_S, parse=positive(),
                                           help="a --reward_fn http://... server: seconds one request may take")
    reward_server_retries: int = setting(DEFAULT_SERVER_RETRIES, parse=at_least(0),
                                         help="a --reward_fn http://... server: retries of a failed request (backoff "
                                              "1 s, doubling)")


@dataclass(frozen=True)
class ProcessRewardSettings:
    """A process reward model's step scores as rewards (`coati.models.prm`)."""

    prm_pretrain: str = setting("", help="a process reward model (train_prm.py's exported model): its score of each "
                                         "step of a completion is a reward on the token that ends the step (GRPO: "
                                         "with --adv_estimator process; PPO: added to the token rewards)")
    prm_coef: float = setting(1.0, parse=non_negative(), help="weight of the process reward model's step scores")


@dataclass(frozen=True)
class DistillSettings:
    """On-policy distillation: a frozen teacher scores the policy's own samples token by token
    (`coati.experience.distillation`)."""

    teacher_model: str = setting("", help="a teacher model folder (its tokenizer, where it has one, must share the "
                                          "policy's vocabulary); with it the rewards may be left out: distillation "
                                          "alone")
    teacher_url: str = setting("", help="a served teacher instead: its OpenAI-compatible API base returning prompt "
                                        "log-probs by token id (e.g. http://host:8000/v1 of `vllm serve`); its bearer "
                                        "token from $COATI_TEACHER_TOKEN, else $OPENAI_API_KEY")
    teacher_model_name: str = setting("", help="the model name sent to --teacher_url (default: the first it lists)")
    teacher_batch_size: int = setting(16, parse=at_least(1), help="rows per request to --teacher_url")
    teacher_timeout: float = setting(120.0, parse=positive(), help="seconds one --teacher_url request may take")
    teacher_retries: int = setting(3, parse=at_least(0), help="retries of a failed --teacher_url request (backoff 1 s, "
                                                              "doubling)")
    distill_coef: float = setting(1.0, parse=non_negative(),
                                  help="weight of each sampled token's log p_teacher - log p_policy (minus the "
                                       "per-token reverse KL) in its advantage; 0: off")
    distill_loss: Optional[str] = setting(
        None, parse=DISTILL_LOSSES.choice(),
        help=DISTILL_LOSSES.describe("a loss on the teacher's top-k tokens added to the actor's (default: none)"))
    distill_loss_coef: float = setting(1.0, parse=non_negative(), help="weight of --distill_loss")
    distill_top_k: int = setting(16, parse=at_least(1), help="teacher tokens per position --distill_loss reads")
    gkd_beta: float = setting(0.5, parse=in_range(0.0, 1.0), help="--distill_loss gkd's beta: 0 forward KL, 1 reverse "
                                                                  "KL, between them the generalised JSD")

    @property
    def teacher(self) -> bool:
        """A teacher is given, a folder or a served one."""
        return bool(self.teacher_model or self.teacher_url)

    def check(self, run: Any) -> None:
        """One teacher, and one that is used; the distillation loss needs one."""
        if self.teacher_model and self.teacher_url:
            raise CoatiUsageError("--teacher_model and --teacher_url: give one teacher, a folder or a served one")
        if not self.teacher and self.distill_loss:
            raise CoatiUsageError("--distill_loss needs a teacher: --teacher_model or --teacher_url")
        if self.teacher and self.distill_coef == 0 and not self.distill_loss:
            raise CoatiUsageError(f"{'--teacher_url' if self.teacher_url else '--teacher_model'} with --distill_coef 0 "
                                  "and no --distill_loss: the teacher would not be used; give one of them")


@dataclass(frozen=True)
class JudgeSettings:
    """`--reward_fn judge`: an LLM that grades each completion against a rubric (`coati.rewards.judge`)."""

    judge_url: str = setting("", help="the judge's OpenAI-compatible API base (e.g. http://127.0.0.1:8000/v1 of `vllm "
                                      "serve`); its bearer token from $COATI_JUDGE_TOKEN, else $OPENAI_API_KEY")
    judge_model: str = setting("", help="a judge model folder that coati serves itself, one server per rank on "
                                        "loopback with a token of its own (instead of --judge_url)")
    judge_engine: str = setting("hf", choices=("hf", "vllm"),
                                help="what serves --judge_model: transformers, or vLLM in its own environment "
                                     "(--vllm_python)")
    judge_model_name: str = setting("judge", help="the model name sent in each request (a --judge_url server may "
                                                  "serve several)")
    judge_rubric: Optional[str] = setting(None, parse=readable_file,
                                          help="a rubric template file with {prompt}, {completion} and {reference} "
                                               "(the row's gt_answer); default: a 0-10 grade ending in 'Score: N'")
    judge_parser: str = setting("score", choices=("score", "verdict"),
                                help="score: the last 'Score: N' (or N/M) divided by --judge_max_score; verdict: "
                                     "correct/incorrect, yes/no, pass/fail as 1/0")
    judge_max_score: float = setting(10.0, parse=positive(), help="the score the rubric's best answer gets")
    judge_api: str = setting("chat", choices=("chat", "completions"),
                             help="chat: one /chat/completions request per completion (the judge's chat template "
                                  "applies); completions: --judge_batch_size rubrics per /completions request")
    judge_batch_size: int = setting(8, parse=at_least(1), help="rubrics per request with --judge_api completions")
    judge_concurrency: int = setting(4, parse=at_least(1), help="requests in flight at once, per rank")
    judge_max_tokens: int = setting(64, parse=at_least(1), help="tokens the judge may answer with")
    judge_timeout: float = setting(60.0, parse=positive(), help="seconds one judge request may take")
    judge_retries: int = setting(3, parse=at_least(0), help="retries of a failed judge request (backoff 1 s, doubling)")
    judge_cache: int = setting(10000, parse=at_least(0), help="judge answers remembered, so an identical request is "
                                                              "asked once (0: none)")
    judge_start_timeout: float = setting(600.0, parse=positive(), help="seconds --judge_model's server may take to "
                                                                       "start")


@dataclass(frozen=True)
class SandboxSettings:
    """The code_tests reward: programs run in a sandbox."""

    code_all_or_nothing: bool = setting(False, help="code_tests scores 1 only when every test passes (default: the "
                                                    "fraction passed)")
    sandbox_timeout: float = setting(5.0, parse=positive(),
                                     help="CPU seconds one test run may use; its wall-clock limit is twice this")
    sandbox: str = setting("auto", choices=("auto", "bwrap", "namespaces", "unisolated"),
                           help="how test runs are contained: auto (bubblewrap where it works, else coati's own "
                                "namespaces as root, else an error naming what to install), bwrap, namespaces (root), "
                                "or unisolated (rlimits only: a program can then read this user's files and kill the "
                                "run)")
    sandbox_memory_mb: int = setting(512, parse=at_least(32),
                                     help="memory of one test run: its whole process tree where a memory cgroup can be "
                                          "made (root), and each process's address space")
    sandbox_processes: int = setting(32, parse=at_least(1), help="processes one test run may have at once")
    sandbox_workers: int = setting(0, parse=at_least(0), help="test runs at once on each rank (0: the CPU count, at "
                                                              "most 8)")


@dataclass(frozen=True)
class BackendSettings:
    """What generates the rollouts: the training model itself (`hf`) or vLLM servers in an environment of their own."""

    rollout_backend: str = setting("hf", choices=("hf", "vllm"),
                                   help="hf: generate with the training model; vllm: with vLLM servers (one per rank, or "
                                        "the --num_generators of --async_rollout) that get the new weights after every "
                                        "update")
    vllm_python: str = setting("", help="the interpreter of vLLM's environment (default: $COATI_VLLM_PYTHON, else "
                                        ".venv-vllm/bin/python beside coati's source, which `make vllm-env` builds)")
    vllm_start_timeout: float = setting(600.0, parse=positive(), help="seconds a vLLM server may take to load its model")
    vllm_timeout: float = setting(600.0, parse=positive(), help="seconds one vLLM request may take")
    vllm_max_restarts: int = setting(1, parse=at_least(0),
                                     help="vLLM servers that die are restarted this many times in all; then the run "
                                          "stops")
    vllm_threads: int = setting(0, parse=at_least(0), help="CPU threads of each vLLM server on a machine without a GPU "
                                                           "(0: the trainer's)")
    vllm_kv_cache_gib: int = setting(1, parse=at_least(1), help="each vLLM server's KV cache on a CPU, GiB")
    vllm_gpu_memory_utilization: float = setting(0.4, parse=in_range(0, 1, low_open=True),
                                                 help="fraction of its GPU's memory each vLLM server takes")
    vllm_enforce_eager: bool = setting(False, help="run vLLM without torch.compile (and CUDA graphs): a server starts in "
                                                   "a third of the time (11 s against 28-44 s for a small model on a CPU), "
                                                   "and generates slower on larger models")
    vllm_lora_sync: str = setting("auto", choices=("auto", "adapter", "merged"),
                                  help="with --lora_rank, what each update sends the vLLM servers: adapter: the LoRA "
                                       "adapters alone, which vLLM serves over the base weights it started with; "
                                       "merged: every weight, the adapters folded in; auto: adapter on a GPU where vLLM "
                                       "can serve it (kaiming init, --lora_bias none, no embedding targets, no sharded "
                                       "parameters), else merged (on a CPU vLLM runs LoRA uncompiled: 3x slower "
                                       "generation at 100M parameters)")
    engine_probe_rows: int = setting(2, parse=at_least(0),
                                     help="prompts of --prompt_dataset each vLLM server scores after every weight update, "
                                          "compared with the trainer's log-probs (0: no sync probe)")
    engine_probe_tolerance: float = setting(0.0, parse=non_negative(),
                                            help="mean absolute log-prob difference the sync probe allows (0: 1e-3 in "
                                                 "fp32, 0.05 in bf16/fp16)")


@dataclass(frozen=True)
class HealthSettings:
    """Health alarms: which stop the run, and when they fire."""

    stop_on_alarm: Tuple[str, ...] = setting(
        (), nargs="*", metavar="ALARM",
        help="end the run (with a checkpoint, exit status 4) when one of these health alarms fires: all, eval_drop, "
             "eval_falls_reward_rises, entropy_collapse, length_collapse, length_at_limit, zero_std_groups, kl_runaway, "
             "engine_ratio_drift, grad_spike (every alarm warns either way)")
    alarm_threshold: Tuple[str, ...] = setting(
        (), nargs="*", metavar="NAME=VALUE", help="change when alarms fire, e.g. eval_drop=0.2 patience=5 "
                                                  "(coati.trainer.callbacks.health.AlarmThresholds)")


@dataclass(frozen=True)
class MaxEntSettings:
    """The maxent estimator's softmax temperature, fixed or adapted towards a target entropy."""

    maxent_tau: float = setting(1.0, parse=positive(), help="maxent: the softmax temperature tau")
    maxent_target_entropy: float = setting(0.0, parse=in_range(0, 1),
                                           help="maxent: adapt tau after every episode towards this entropy of the "
                                                "weights, as a fraction of log(--num_generations) (0: tau stays fixed)")
    maxent_tau_lr: float = setting(0.1, parse=positive(), help="maxent: step of log(tau) per episode")


@dataclass(frozen=True)
class AsyncSettings:
    """Asynchronous rollouts: generator processes that run ahead of the trainer."""

    async_rollout: bool = setting(False, help="generate in Ray actors (or vLLM servers, with --rollout_backend vllm) "
                                              "while the trainer trains (rank 0 drives them; --plugin ddp)")
    max_staleness: int = setting(1, parse=at_least(0), help="trained samples come from weights at most K episodes older "
                                                            "than the trainer's (0: on-policy)")
    max_concurrent_rollouts: int = setting(0, parse=at_least(0),
                                           help="prompts in generation at once (0: twice the global batch of prompts)")
    num_generators: int = setting(1, parse=at_least(1),
                                  help="generator actors (or vLLM servers), each with a copy of the policy")
    generator_max_restarts: int = setting(3, parse=at_least(0),
                                          help="generators that die are replaced this many times in all; then the run "
                                               "stops with an error")
    partial_rollout_tokens: int = setting(0, parse=at_least(0),
                                          help="partial rollouts: generate completions this many tokens at a time, so a "
                                               "weight update waits for one chunk and the rest of each completion is "
                                               "generated on the new weights, each token keeping its version (0: off)")

    def check(self, run: Any) -> None:
        """Partial rollouts are asynchronous; asynchronous rollouts take whole-parameter plugins and no dynamic
        sampling yet."""
        if self.partial_rollout_tokens and not self.async_rollout:
            raise CoatiUsageError("--partial_rollout_tokens needs --async_rollout: a synchronous run updates the "
                                  "weights between batches, with no generation running")
        if not self.async_rollout:
            return
        if run.rollout.dynamic_sampling:
            raise CoatiUsageError("--dynamic_sampling works with synchronous rollouts only for now; with "
                                  "--async_rollout use --drop_tied_groups, which masks tied groups out of the loss")
        if run.parallel.plugin not in ("ddp", "zero2", "zero2_cpu"):
            raise CoatiUsageError(f"--async_rollout supports --plugin ddp, zero2 and zero2_cpu, whose ranks hold whole "
                                  f"parameters; the generators run beside rank 0, which publishes alone, and "
                                  f"{run.parallel.plugin} would need every rank to gather its shards at each publish")


@dataclass(frozen=True)
class AgentSettings:
    """Multi-turn rollouts with tools: the model calls tools and reads their answers before it answers."""

    tools: Tuple[str, ...] = setting(
        (), nargs="+", parse=TOOLS.choice(),
        help=TOOLS.describe("tools the model may call (typed arguments and a Google-style docstring give a tool's "
                            "schema); turns each rollout into a multi-turn episode (the prompt data must be "
                            "conversational; a row's own `tools` column limits what it offers)"))
    tool_parser: str = setting("hermes", parse=TOOL_CALL_PARSERS.choice(),
                               help=TOOL_CALL_PARSERS.describe("how tool calls are written in a model turn"))
    max_turns: int = setting(4, parse=at_least(1), help="model turns per episode at most (with --tools)")
    max_total_tokens: int = setting(0, parse=at_least(0),
                                    help="tokens after the prompt per episode at most, the model's and the tools' (0: no "
                                         "limit beyond --max_turns x --max_new_tokens)")
    tool_timeout: float = setting(10.0, parse=positive(), help="seconds one tool call may take; a slower one answers the "
                                                               "model with a timeout error")
    malformed_tool_penalty: float = setting(0.0, parse=non_negative(),
                                            help="subtracted from the reward per malformed tool call (logged as "
                                                 "rewards/environment)")
    agent: Optional[str] = setting(None, parse=AGENTS.choice(),
                                   help="package.module:function, an agent program run as each rollout: called as "
                                        "agent(base_url, row) with an OpenAI-compatible endpoint local to the run, it "
                                        "returns its final answer; its requests' tokens are trained on (not with --tools)")
    agent_timeout: float = setting(300.0, parse=positive(), help="seconds an agent's episode may take; a slower one "
                                                                 "ends its episode (rollout/ended/agent_timeout)")

    def check(self, run: Any) -> None:
        if self.agent and self.tools:
            raise CoatiUsageError("--agent runs your own agent program, which calls its own tools; leave out --tools")


@dataclass(frozen=True)
class CriticSettings:
    """PPO's critic."""

    critic_pretrain: Optional[str] = setting(None, help="critic initialisation (default: --rm_pretrain, else --pretrain "
                                                        "with a new value head)")
    critic_lr: Optional[float] = setting(None, parse=positive(), help="critic learning rate (default: --lr)")
    critic_warmup_episodes: int = setting(0, parse=at_least(0),
                                          help="train only the critic for the first N episodes, so the policy's first "
                                               "advantages come from values fitted to its own returns (OpenRLHF's "
                                               "--freezing_actor_steps)")
    value_clip: float = setting(0.2, parse=positive(), help="clipping range of the value loss")


# ---- ColossalChat's LoRA file ----------------------------------------------------------------------
LORA_BIAS = {"none": "none", "all": "all", "lora": "lora_only"}
"""ColossalChat's `lora_train_bias` -> peft's `bias`: which biases train beside the adapters."""
LORA_INIT = {"kaiming_uniform": "kaiming_uniform", "PiSSA": "pissa"}
"""ColossalChat's `lora_initialization_method` -> coati's `--lora_init` (peft's `init_lora_weights`)."""


@dataclass
class LoraConfig:
    """ColossalChat's LoRA settings, as its `lora_config.json` spells them (`coati.models.lora.LoraConfig`).
    `target_modules` None adapts every linear and embedding layer. Embedding adapters take no dropout, in peft
    as in ColossalChat, so `embedding_lora_dropout` is read and not applied."""

    r: int = 0
    lora_alpha: int = 32
    linear_lora_dropout: float = 0.1
    embedding_lora_dropout: float = 0.0
    lora_train_bias: str = "none"
    lora_initialization_method: str = "kaiming_uniform"
    target_modules: Optional[List[str]] = None

    def __post_init__(self) -> None:
        if self.lora_train_bias not in LORA_BIAS:
            raise ValueError(f"lora_train_bias={self.lora_train_bias!r}: expected one of {', '.join(LORA_BIAS)}")
        if self.lora_initialization_method not in LORA_INIT:
            raise ValueError(f"lora_initialization_method={self.lora_initialization_method!r}: expected one of "
                             f"{', '.join(LORA_INIT)}")

    @classmethod
    def from_file(cls, config_file: str) -> "LoraConfig":
        """The settings in a ColossalChat LoRA JSON file; an unknown key or value is one `CoatiUsageError` line."""
        try:
            config = json.loads(Path(config_file).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CoatiUsageError(f"--lora_config {config_file}: {exc}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise CoatiUsageError(f"--lora_config {config_file}: unknown key {unknown[0]!r}; expected {', '.join(sorted(known))}")
        try:
            return cls(**config)
        except ValueError as error:
            raise CoatiUsageError(f"--lora_config {config_file}: {error}") from None

    @property
    def peft_bias(self) -> str:
        return LORA_BIAS[self.lora_train_bias]

    @property
    def peft_init(self) -> str:
        return LORA_INIT[self.lora_initialization_method]
