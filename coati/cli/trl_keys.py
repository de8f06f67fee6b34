"""Keys of TRL's and Hugging Face's configs (TRL 1.16's `*Config`, transformers' `TrainingArguments`, TRL's
`ModelConfig`, open-r1's script arguments) that are no coati setting: refused with what to give instead, accepted and
named in one note because they change nothing here, or accepted at one value only, the one that is what coati does
(TRL's default, mostly). `coati.cli.config_file` reads them for config files and command lines alike.
Light: no torch."""
import argparse
from typing import Any, Dict, Optional, Tuple

TRUTH_WORDS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}
"""The words a boolean takes, on a command line or as a config file's string."""
NONE_WORDS = ("none", "null", "")
"""How a command line (or a YAML string) writes TRL's None."""


def truthy(value: str) -> bool:
    """An argparse `type` for TRL's boolean flags: true/false, yes/no, 1/0 (`TRUTH_WORDS`, as switches take them)."""
    if value.lower() not in TRUTH_WORDS:
        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
    return TRUTH_WORDS[value.lower()]


_OWN_CORRECTION = ("coati's correction of vLLM's samples is --behaviour_correction (truncated, masked, icepop, "
                   "sequence, sequence_masked), its cap --behaviour_cap and its band --behaviour_correction_option "
                   "low=L high=H")
REFUSED_KEYS = {
    "accelerate_config": "coati launches with torchrun or colossalai run: give num_processes (--nproc_per_node), "
                         "--nnodes and --hostfile instead, and the plugin with --plugin",
    "env": "set environment variables in the shell that runs coati; a config file holds settings only",
    "system_prompt": "put the system turn in the data: a `prompt` (or `messages`) list that opens with a system "
                     "message",
    "dataset_prompt_column": "name the data's prompt column `prompt` (TRL's standard) or give `messages`",
    "generation_batch_size": "it counts completions over every process; give steps_per_generation, micro-steps of "
                             "per_device_train_batch_size completions per generation on each process (generation_batch_"
                             "size / (per_device_train_batch_size x processes))",
    "vllm_importance_sampling_mode": _OWN_CORRECTION, "vllm_importance_sampling_clip_max": _OWN_CORRECTION,
    "vllm_importance_sampling_clip_min": _OWN_CORRECTION, "vllm_importance_sampling_cap": _OWN_CORRECTION,
}
"""Keys of TRL recipes that coati does not take -> what to do instead."""

_NO_UPLOAD = "coati does not upload"
_PLUGIN_DECIDES = "the --plugin's own settings decide"
_OWN_EVALUATION = "coati's evaluation logs the trainer's own held-out metrics"
_TRL_SERVER = "for TRL's vllm_mode server; coati starts its own vLLM servers (--rollout_backend vllm)"
_COLLATED = "batches are collated in place"
_COMPLETIONS_TABLE = "coati's completions table (log_completions, --sample_log_interval) holds a batch's"
_LOADED_IN_FP32 = "coati loads in fp32 and trains in --mixed_precision (bf16 by default on GPU)"
IGNORED_KEYS = {
    "overwrite_output_dir": "coati writes into the output folder as it is",
    "push_to_hub": "coati does not upload: push OUTPUT_DIR/model with huggingface-cli upload",
    **dict.fromkeys(("hub_model_id", "hub_strategy", "hub_private_repo", "hub_token", "hub_revision",
                     "hub_always_push"), _NO_UPLOAD),
    "log_level": "coati prints what a run does",
    **dict.fromkeys(("log_level_replica", "log_on_each_node"), "coati prints on the first rank"),
    "disable_tqdm": "coati's progress bar and step lines are its own",
    "logging_nan_inf_filter": "coati logs each loss as computed; a NaN or infinite loss stops the run "
                              "(--skip_nonfinite N skips such steps)",
    "skip_memory_metrics": "coati's performance callback measures its own",
    "include_num_input_tokens_seen": "coati's performance callback counts tokens per second",
    **dict.fromkeys(("do_train", "do_predict"), "the command trains"),
    "do_eval": "evaluation follows the held-out data and eval_strategy",
    "dataset_num_proc": "data is tokenized once and cached",
    **dict.fromkeys(("dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
                     "dataloader_prefetch_factor", "dataloader_in_order"), _COLLATED),
    "remove_unused_columns": "coati keeps the columns it reads (GRPO's and PPO's reward functions get every column)",
    "gradient_checkpointing_kwargs": "coati's checkpointing is non-reentrant (use_reentrant: false)",
    **dict.fromkeys(("torch_dtype", "dtype"), _LOADED_IN_FP32),
    "attn_implementation": "coati picks SDPA, or FlashAttention with --use_flash_attn",
    "use_liger_kernel": "coati has no Liger kernels",
    "model_revision": "the model folder (or a model id's local snapshot) is loaded as it is",
    "lora_task_type": "coati sets the adapters' task from the command (SEQ_CLS for a reward model, with its score head "
                      "trained beside them)",
    "optim": "coati trains with AdamW (colossalai's HybridAdam on CUDA), TRL's adamw_torch",
    "local_rank": "torchrun gives each process its rank",
    **dict.fromkeys(("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph"),
                    _PLUGIN_DECIDES),
    "ddp_backend": "coati's processes talk over NCCL on CUDA, gloo on a CPU",
    "ignore_bias_buffers": "TRL's work-around for DDP and a model's bias buffers",
    **dict.fromkeys(("prediction_loss_only", "eval_do_concat_batches", "batch_eval_metrics", "eval_accumulation_steps",
                     "include_for_metrics", "label_names", "eval_use_gather_object"), _OWN_EVALUATION),
    **dict.fromkeys(("bf16_full_eval", "fp16_full_eval"), "evaluation runs in the training precision"),
    "torch_empty_cache_steps": "coati manages the CUDA cache itself",
    "pad_to_multiple_of": "coati's collators pad each micro-batch to its longest row (or pack it, --packing)",
    "use_cache": "coati uses the KV cache when generating and not when training",
    **dict.fromkeys(("project", "trackio_space_id"), "coati reports to TensorBoard, W&B and metrics.jsonl (report_to)"),
    **dict.fromkeys(("ref_model_sync_steps", "ref_model_mixup_alpha"), "used with sync_ref_model only"),
    **dict.fromkeys(("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
                     "vllm_group_port"), _TRL_SERVER),
    "ds3_gather_for_generation": "DeepSpeed's; coati shards with --plugin",
    **dict.fromkeys(("num_completions_to_print", "log_unique_prompts"), _COMPLETIONS_TABLE),
    "log_multimodal": "coati's completions table holds text",
    "f_alpha_divergence_coef": "used with f_divergence_type alpha_divergence only",
    "discopop_tau": "used with loss_type discopop only", "length_column_name": "coati measures each row itself",
    **dict.fromkeys(("entropy_target", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta"),
                    "used with use_adaptive_entropy only"),
    **dict.fromkeys(("vespo_k_pos", "vespo_k_neg", "vespo_lambda_pos", "vespo_lambda_neg"),
                    "used with loss_type vespo only"),
}
"""Keys of TRL recipes that do not change what coati trains -> why they are not needed: accepted, named in one note."""

_NOT_SHARDED_THAT_WAY = "coati shards with --plugin (zero2, zero2_cpu, gemini, 3d)"
_PLAIN_LORA = "coati's adapters are plain LoRA (--lora_rank, scaled by lora_alpha / r)"
_NOT_COMPILED = "coati does not compile the model"
_HF_GENERATE = "the hf engine generates with transformers' generate"
_NO_QUANTIZATION = "coati trains the model's own weights, not bitsandbytes-quantized ones (LoRA: --lora_rank)"
ONE_VALUE_KEYS: Dict[str, Tuple[Any, str]] = {
    "shuffle_dataset": (True, "coati shuffles the training data every epoch (by --seed)"),
    "train_sampling_strategy": ("random", "coati shuffles the training data every epoch (by --seed)"),
    "dataloader_drop_last": (False, "coati keeps an epoch's last, smaller batch"),
    "dataset_streaming": (False, "coati reads and tokenizes the whole dataset once, then caches it"),
    "ignore_data_skip": (False, "a resumed coati run goes on from the row where it stopped"),
    "save_only_model": (False, "coati's checkpoints hold the optimizer and the data position, so that a run resumes "
                               "exactly; the model alone is exported to OUTPUT_DIR/model"),
    "save_on_each_node": (False, "coati saves each checkpoint once, into --save_dir"),
    "restore_callback_states_from_checkpoint": (False, "a resumed coati run restores the trainer's own state"),
    "data_seed": (None, "--seed orders the data too (one seed for every random stream)"),
    "load_best_model_at_end": (False, "coati exports the last model to OUTPUT_DIR/model; GRPO and PPO also keep the "
                                      "best one in OUTPUT_DIR/best with --save_best METRIC"),
    "metric_for_best_model": (None, "GRPO and PPO keep the model best on a held-out metric with --save_best METRIC "
                                    "(higher is better); a supervised run exports its last model"),
    "neftune_noise_alpha": (None, "coati adds no noise to the embeddings"),
    "label_smoothing_factor": (0.0, "coati's losses take no label smoothing"),
    "auto_find_batch_size": (False, "coati trains with the batch size given; its memory estimate refuses one that "
                                    "cannot fit before loading (--no_memory_check)"),
    "full_determinism": (False, "coati seeds every random stream with --seed, without torch's deterministic "
                                "algorithms"),
    "use_cpu": (False, "coati trains on CUDA where there is a GPU, else on the CPU"),
    "torch_compile": (False, _NOT_COMPILED), "torch_compile_backend": (None, _NOT_COMPILED),
    "torch_compile_mode": (None, _NOT_COMPILED),
    "eval_on_start": (False, "a supervised run evaluates every --eval_interval steps and after each epoch; GRPO and "
                             "PPO also before the first episode"),
    "eval_delay": (0, "evaluation follows eval_strategy from the first step"),
    "debug": ("", "coati has no debug modes"),
    "deepspeed": (None, _NOT_SHARDED_THAT_WAY), "fsdp": (None, _NOT_SHARDED_THAT_WAY),
    "fsdp_config": (None, _NOT_SHARDED_THAT_WAY), "accelerator_config": (None, _NOT_SHARDED_THAT_WAY),
    "parallelism_config": (None, _NOT_SHARDED_THAT_WAY),
    "load_in_4bit": (False, _NO_QUANTIZATION), "load_in_8bit": (False, _NO_QUANTIZATION),
    "use_bnb_nested_quant": (False, _NO_QUANTIZATION), "bnb_4bit_quant_type": ("nf4", _NO_QUANTIZATION),
    "use_dora": (False, _PLAIN_LORA), "use_rslora": (False, _PLAIN_LORA),
    "lora_modules_to_save": (None, "coati trains the adapters alone (and a reward model's score head)"),
    "lora_target_parameters": (None, "coati's adapters go on the modules of --lora_target_modules"),
    "model_init_kwargs": (None, "coati loads the model with from_pretrained's defaults (fp32; --trust_remote_code)"),
    "cast_lm_head_to_fp32": (False, "the output layer runs in --mixed_precision as the rest does"),
    "chat_template_kwargs": (None, "coati renders the chat template with its defaults"),
    "sync_ref_model": (False, "coati's reference model stays the starting model (TR-DPO's syncing is not built)"),
    "vllm_mode": ("colocate", "coati starts a vLLM server beside each rank, on its GPU (--rollout_backend vllm, "
                              "--vllm_gpu_memory_utilization); TRL's separate `trl vllm-serve` is not used"),
    "vllm_tensor_parallel_size": (1, "each coati vLLM server runs on its rank's GPU"),
    "vllm_enable_sleep_mode": (False, "coati's vLLM servers keep their memory (--vllm_gpu_memory_utilization)"),
    "vllm_model_impl": ("vllm", "coati's vLLM servers run vLLM's own model code"),
    "vllm_max_model_length": (None, "coati's vLLM servers take the model's own context length"),
    "use_transformers_paged": (False, _HF_GENERATE), "use_transformers_continuous_batching": (False, _HF_GENERATE),
    "transformers_continuous_batching_config": (None, _HF_GENERATE),
    "cache_implementation": (None, "the hf engine uses transformers' default KV cache"),
    "generation_kwargs": (None, "coati's sampling settings are temperature, top_k, top_p, min_p and "
                                "repetition_penalty"),
    "top_entropy_quantile": (1.0, "coati trains on every completion token"),
    "off_policy_mask_threshold": (None, "coati masks no sample as off-policy; --behaviour_correction weights them"),
    "delta": (None, "coati's ratio clip is PPO's (--clip_eps_low, --clip_eps_high), without a second bound"),
    "multi_objective_aggregation": ("sum_then_normalize", "coati adds the weighted rewards, then normalizes them "
                                                          "within each group"),
    "num_generations_eval": (None, "each held-out prompt gets one greedy completion (--eval_n_samples adds samples)"),
    "use_adaptive_entropy": (False, "coati's entropy bonus is --entropy_coef, fixed"),
    "log_completions_hub_repo": (None, "coati writes the completions table under OUTPUT_DIR/logs"),
    "use_bias_correction_kl": (False, "coati's KL term is the estimate of --kl_estimator, not weighted by the ratio"),
    "vllm_importance_sampling_correction": (True, "coati weights vLLM's samples by --behaviour_correction (truncated "
                                                  "by default: min(r, --behaviour_cap))"),
    "average_tokens_across_devices": (True, "coati's token-mean losses average over the tokens of every process"),
    "enable_jit_checkpoint": (False, "a stopped coati run resumes from its last checkpoint (--checkpoint_path "
                                     "latest; --save_interval saves every N steps)"),
    "activation_offloading": (False, "coati keeps activations on the GPU (--grad_checkpoint recomputes them instead)"),
    "dataset_text_field": ("text", "coati reads TRL's standard columns: text, prompt and completion, or messages"),
    "packing_strategy": ("bfd", "coati's --packing puts each micro-batch's rows in one sequence, attention within "
                                "each row, none cut"),
    "use_weighting": (False, "coati weighs every preference pair alike"),
    "generate_during_eval": (False, "coati's evaluation of preferences scores the pairs, generating nothing"),
    "f_divergence_type": ("reverse_kl", "coati's DPO is the DPO paper's, with the reverse KL"),
    "dataset_kwargs": (None, "coati prepares raw data itself and reads the folders `coati prepare` wrote as they are"),
    "eval_packing": (None, "held-out batches are packed as the training's are (--packing)"),
    "ld_alpha": (None, "coati's DPO weighs every response token alike (LD-DPO's length desensitisation is not built)"),
    "router_aux_loss_coef": (None, "coati trains on the task's loss alone, without a MoE router's auxiliary loss"),
    "bnb_4bit_quant_storage": (None, _NO_QUANTIZATION),
    "vllm_structured_outputs_regex": (None, "coati's vLLM rollouts sample without structured outputs"),
}
"""Keys that coati takes at one value only, the one that is what coati does (TRL's default, mostly) -> (that value,
what coati does). At that value the key is named in the note of unused keys; another is refused saying what coati
does."""

COMMAND_VALUES: Dict[str, Dict[str, Tuple[Tuple[Any, ...], str]]] = {
    "sft": {"shuffle_dataset": ((False, True), "TRL's SFT shuffle_dataset (off by default) shuffles the rows once, "
                                               "before packing; coati draws them in a random order every epoch (by "
                                               "--seed)"),
            "loss_type": (("nll",), "coati's SFT loss is the negative log-likelihood")},
    "kto": {"train_sampling_strategy": (("sequential", "random"), "TRL's KTO needs its rows in order for its KL "
                                                                  "pairs; coati pairs mismatched completions within "
                                                                  "each batch, drawn in a random order (by --seed)"),
            "loss_type": (("kto",), "coati's KTO loss is the KTO paper's"),
            "precompute_ref_log_probs": ((False,), "coati's KTO runs the reference model beside the policy")},
}
"""Keys of `ONE_VALUE_KEYS` that mean something else in one command's TRL config, and keys of one command's config
(SFT's and KTO's `loss_type`) -> (the values that command takes, what coati does)."""
NO_SETTING_KEYS = {*REFUSED_KEYS, *IGNORED_KEYS, *ONE_VALUE_KEYS, *(key for keys in COMMAND_VALUES.values()
                                                                   for key in keys)}
"""Every TRL key above: none is a coati setting."""


def _taken(key: str, command: str) -> Tuple[Tuple[Any, ...], str]:
    """(the values of `ONE_VALUE_KEYS`' `key` that `command` takes, what coati does)."""
    if key in COMMAND_VALUES.get(command, {}):
        return COMMAND_VALUES[command][key]
    value, does = ONE_VALUE_KEYS[key]
    return (value,), does


def _one_value(key: str, command: str) -> bool:
    """Whether `key` is taken by `command` at some values only (`ONE_VALUE_KEYS`, `COMMAND_VALUES`)."""
    return key in ONE_VALUE_KEYS or key in COMMAND_VALUES.get(command, {})


def _same(value: Any, taken: Any) -> bool:
    """Whether `value` (a config file's, or a command line's string) is `taken`, as TRL would read it."""
    if isinstance(value, str) and not isinstance(taken, str):
        word = value.strip().lower()
        if taken is None or isinstance(taken, bool):
            return word in NONE_WORDS if taken is None else TRUTH_WORDS.get(word) is taken
        try:
            return float(word) == taken
        except ValueError:
            return False
    if taken is None or isinstance(taken, bool) or isinstance(value, bool):
        return value is taken
    return value == taken


MODEL_INIT_KEYS = {"torch_dtype": IGNORED_KEYS["torch_dtype"], "dtype": IGNORED_KEYS["dtype"],
                   "attn_implementation": IGNORED_KEYS["attn_implementation"],
                   "use_cache": IGNORED_KEYS["use_cache"], "device_map": "coati places the model with --plugin",
                   "revision": IGNORED_KEYS["model_revision"]}
"""The keys of TRL's `model_init_kwargs` that change nothing here -> why; other keys, or values, are refused."""


def unused_reason(key: str, value: Any, command: str = "") -> Optional[str]:
    """Why the TRL key `key` given as `value` to `command` changes nothing here, or None where it is no such key (at
    that value)."""
    if key in IGNORED_KEYS:
        return IGNORED_KEYS[key]
    if key == "model_init_kwargs" and isinstance(value, dict) and value and set(value) <= set(MODEL_INIT_KEYS):
        return "; ".join(f"{name}: {MODEL_INIT_KEYS[name]}" for name in value)
    if _one_value(key, command):
        values, does = _taken(key, command)
        return does if any(_same(value, taken) for taken in values) else None
    return None


def refusal(key: str, value: Any, command: str = "") -> Optional[str]:
    """Why the TRL key `key` given as `value` to `command` is not taken, as what follows the key's name in a sentence
    ("is not taken: ...", "takes only false here: ..."), with what to do instead; None where it is not refused."""
    if key in REFUSED_KEYS:
        return f"is not taken: {REFUSED_KEYS[key]}"
    if _one_value(key, command) and unused_reason(key, value, command) is None:
        values, does = _taken(key, command)
        return f"takes only {' or '.join(_written(taken) for taken in values)} here: {does}"
    return None


def _written(value: Any) -> str:
    """A value as a TRL config writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if value == "" else str(value)
