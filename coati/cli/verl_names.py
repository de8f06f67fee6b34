"""verl's names for the on-policy settings: its `section.key=value` overrides, and config files in its sections
(`data:`, `actor_rollout_ref:`, `algorithm:`, `trainer:`, `custom_reward_function:`, `critic:`), read as coati's.

verl counts as coati's on-policy runs do: its training step is one generation and the learning on it, coati's
episode, so `trainer.total_training_steps`, `save_freq` and `test_freq` carry over. Its batch sizes count over every
GPU (`data.train_batch_size` prompts a step, `actor.ppo_mini_batch_size` prompts an optimizer step) and become
coati's per-rank counts once the flags are parsed (`convert_batches`). `trainer.n_gpus_per_node` and `trainer.nnodes`
launch the run (`coati.cli.main`). A verl key that changes nothing here (verl's engine: FSDP, Ray, its profiler) is
named in the run's "not used" note; any other key coati has nothing for is refused by name. Light: no torch.
"""
import argparse
import difflib
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from coati.utils.errors import CoatiUsageError, note_user
from coati.utils.settings import take_hidden

VERL_COMMANDS = ("ppo", "grpo")
"""The commands that read verl's names (its PPO trainer, with GRPO among its advantage estimators)."""
VERL_SECTIONS = ("actor_rollout_ref", "custom_reward_function", "reward_model", "trainer", "global_profiler",
                 "ray_kwargs", "ray_init", "reward_manager", "transfer_queue", "defaults", "hydra")
"""verl's top-level sections that coati's run configs do not have (Hydra's `defaults` list and `hydra` among them,
as verl's recipe configs open)."""
SHARED_SECTIONS = {
    "data": ("tokenizer", "use_shm", "train_files", "val_files", "train_max_samples", "val_max_samples", "prompt_key",
             "reward_fn_key", "max_prompt_length", "max_response_length", "train_batch_size", "val_batch_size",
             "tool_config_path", "return_raw_input_ids", "return_raw_chat", "return_full_prompt", "shuffle", "seed",
             "dataloader_num_workers", "image_patch_size", "validation_shuffle", "filter_overlong_prompts",
             "filter_overlong_prompts_workers", "truncation", "image_key", "video_key", "trust_remote_code",
             "custom_cls", "return_multi_modal_inputs", "sampler", "datagen", "apply_chat_template_kwargs",
             "gen_batch_size"),
    "algorithm": ("rollout_correction", "gamma", "lam", "adv_estimator", "norm_adv_by_std_in_grpo", "use_kl_in_reward",
                  "kl_penalty", "kl_ctrl", "use_pf_ppo", "pf_ppo", "filter_groups", "_target_"),
    "critic": ("optim", "model", "rollout_n", "strategy", "enable", "ppo_mini_batch_size", "ppo_micro_batch_size",
               "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz", "ppo_max_token_len_per_gpu",
               "forward_max_token_len_per_gpu", "ppo_epochs", "shuffle", "data_loader_seed", "cliprange_value",
               "loss_agg_mode", "checkpoint", "profiler", "forward_micro_batch_size",
               "forward_micro_batch_size_per_gpu", "ulysses_sequence_parallel_size", "grad_clip", "_target_"),
}
"""verl's keys in the sections whose names coati's run configs use too (coati's own keys there stay coati's)."""
VERL_LAUNCH_KEYS = {"trainer.n_gpus_per_node": "--nproc_per_node", "trainer.nnodes": "--nnodes"}
"""verl's keys that say how many processes to start: the `coati` command's launch flags."""
BATCHES = ("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size", "actor_rollout_ref.actor.optim.lr_warmup_steps")
"""verl's batch sizes (and its warm-up, in training steps), converted after parsing (`convert_batches`): they go as
the hidden `--verl_<key>` flags."""

A, R, M = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."


def _same(value: Any) -> Any:
    return value


def _path(value: Any) -> Any:
    """A path, or a list of them, with `~` expanded, as verl expands it."""
    if isinstance(value, (list, tuple)):
        return [_path(item) for item in value]
    return os.path.expanduser(value) if isinstance(value, str) else value


def _off_at_minus_one(value: Any) -> Any:
    """verl's -1 (off, never) is coati's 0."""
    return 0 if value == -1 else value


def _named(names: Dict[str, str], key: str) -> Callable[[Any], Any]:
    """A conversion of verl's value names to coati's (`names`); a name coati has not is refused, naming `key`."""
    def convert(value: Any) -> Any:
        if str(value) not in names:
            raise CoatiUsageError(f"{key}={value} has no counterpart here; coati takes {', '.join(names)}")
        return names[str(value)]

    return convert


SAPO_TEMPERATURES = {"tau_pos": 1.0, "tau_neg": 1.05}
"""verl's SAPO temperatures and their defaults (coati's sapo's too): `--policy_loss_option temperature_pos=...`."""
KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
"""verl's `kl_loss_type` and `kl_penalty` -> coati's `--kl_estimator`."""
TAKEN: Dict[str, Tuple[str, Callable[[Any], Any]]] = {
    "data.train_files": ("prompt_dataset", _path),
    "data.val_files": ("eval_dataset", _path),
    "data.max_prompt_length": ("max_prompt_length", _same),
    "data.max_response_length": ("max_new_tokens", _same),
    "data.seed": ("seed", _same),
    M + "path": ("pretrain", _path),
    M + "tokenizer_path": ("tokenizer_dir", _path),
    M + "trust_remote_code": ("trust_remote_code", _same),
    M + "enable_gradient_checkpointing": ("grad_checkpoint", _same),
    M + "lora_rank": ("lora_rank", _same),
    M + "lora_alpha": ("lora_alpha", _same),
    M + "target_modules": ("lora_target_modules", _same),
    M + "lora.rank": ("lora_rank", _same),
    M + "lora.alpha": ("lora_alpha", _same),
    M + "lora.dropout": ("lora_dropout", _same),
    A + "optim.lr": ("lr", _same),
    A + "optim.weight_decay": ("weight_decay", _same),
    A + "optim.lr_warmup_steps_ratio": ("warmup_ratio", _same),
    A + "optim.lr_scheduler_type": ("lr_scheduler", _same),
    A + "optim.warmup_style": ("lr_scheduler", _same),
    A + "optim.lr_decay_style": ("lr_scheduler", _named({"constant": "constant", "linear": "linear", "cosine": "cosine",
                                                         "inverse_square_root": "inverse_sqrt"},
                                                        A + "optim.lr_decay_style")),
    A + "optim.clip_grad": ("grad_clip", _same),
    A + "grad_clip": ("grad_clip", _same),
    A + "clip_ratio_low": ("clip_eps_low", _same),
    A + "clip_ratio_high": ("clip_eps_high", _same),
    A + "loss_agg_mode": ("loss_agg", _named({name: name for name in ("token-mean", "seq-mean-token-mean",
                                                                      "seq-mean-token-sum-norm")},
                                             A + "loss_agg_mode")),
    A + "entropy_coeff": ("entropy_coef", _same),
    A + "ppo_epochs": ("num_update_steps", _same),
    A + "policy_loss.loss_mode": ("policy_loss", _named({"vanilla": "ppo", "gspo": "gspo", "cispo": "cispo",
                                                         "sapo": "sapo", "geo_mean": "gmpo"},
                                                        A + "policy_loss.loss_mode")),
    R + "n": ("num_generations", _same),
    R + "temperature": ("temperature", _same),
    R + "top_p": ("top_p", _same),
    R + "top_k": ("top_k", _off_at_minus_one),
    R + "response_length": ("max_new_tokens", _same),
    R + "prompt_length": ("max_prompt_length", _same),
    R + "name": ("rollout_backend", _named({"vllm": "vllm", "hf": "hf"}, R + "name")),
    R + "gpu_memory_utilization": ("vllm_gpu_memory_utilization", _same),
    R + "enforce_eager": ("vllm_enforce_eager", _same),
    R + "log_prob_micro_batch_size_per_gpu": ("logits_forward_batch_size", _same),
    A + "freeze_vision_tower": ("freeze_vision_tower", _same),
    R + "multi_turn.max_assistant_turns": ("max_turns", _same),
    "algorithm.gamma": ("gamma", _same),
    "algorithm.lam": ("lam", _same),
    "critic.optim.lr": ("critic_lr", _same),
    "critic.model.path": ("critic_pretrain", _path),
    "critic.cliprange_value": ("value_clip", _same),
    "trainer.total_epochs": ("num_epochs", _same),
    "trainer.total_training_steps": ("num_episodes", _same),
    "trainer.save_freq": ("save_interval", _off_at_minus_one),
    "trainer.test_freq": ("eval_interval", _off_at_minus_one),
    "trainer.project_name": ("wandb_project", _same),
    "trainer.experiment_name": ("run_name", _same),
    "trainer.default_local_dir": ("save_dir", _path),
    "trainer.max_actor_ckpt_to_keep": ("keep_last", lambda value: 0 if value is None else value),
}
"""verl's keys that mean one coati setting (by a coati or TRL name), each with the conversion of its value."""
ENGINE = "verl's training engine setting; coati's --plugin decides (zero2_cpu offloads, gemini places memory)"
INFERENCE = "verl's inference engine setting (coati's vLLM settings are --vllm_*)"
NOT_USED: Dict[str, str] = {
    "fsdp_config": ENGINE,
    "megatron": ENGINE,
    "strategy": ENGINE,
    "ulysses_sequence_parallel_size": ENGINE,
    "profiler": "verl's profiler",
    "global_profiler": "verl's profiler",
    "_target_": "verl's config class",
    "ray_kwargs": "verl's Ray cluster",
    "ray_init": "verl's Ray cluster",
    "defaults": "Hydra's defaults list: what the run leaves out is coati's default (verl's that differ are noted)",
    "hydra": "Hydra's own settings",
    "gen_batch_size": "DAPO's generation batch: coati draws further batches of data.train_batch_size prompts, at "
                      "most algorithm.filter_groups.max_num_gen_batches",
    "transfer_queue": "verl's Ray data transfer",
    "reward_manager": "verl's reward loop; coati scores with --reward_funcs",
    "checkpoint": "verl's checkpoint contents; coati saves the whole state",
    "use_remove_padding": "coati's learning step packs its rows (--packing) where the plugin allows",
    "use_torch_compile": "verl's torch.compile of the model",
    "entropy_from_logits_with_chunking": ENGINE,
    "entropy_checkpointing": ENGINE,
    "use_fused_kernels": ENGINE,
    "use_liger": ENGINE,
    "use_shm": "verl's model copy in shared memory",
    "router_replay": "verl's MoE router replay",
    "rollout_n": "set from rollout.n",
    "data_loader_seed": "--seed",
    "shuffle": "coati shuffles the prompts each pass, seeded by --seed",
    "hybrid_engine": ENGINE,
    "nccl_timeout": "--dist_timeout",
    "log_prob_micro_batch_size_per_gpu": "--logits_forward_batch_size, from rollout.log_prob_micro_batch_size_per_gpu",
    "log_prob_use_dynamic_bsz": ENGINE,
    "log_prob_max_token_len_per_gpu": ENGINE,
    "use_dynamic_bsz": "coati's micro-batches count completions (ppo_micro_batch_size_per_gpu)",
    "ppo_max_token_len_per_gpu": "coati's micro-batches count completions",
    "tensor_model_parallel_size": "coati's vLLM engine serves each rank whole",
    "mode": "verl's rollout server mode; coati generates on the training processes (or vLLM servers with "
            "rollout.name=vllm)",
    "dtype": "--mixed_precision", "torch_dtype": "--mixed_precision",
    "free_cache_engine": INFERENCE,
    "load_format": INFERENCE,
    "layered_summon": INFERENCE,
    "enable_chunked_prefill": INFERENCE,
    "enable_prefix_caching": INFERENCE,
    "max_num_batched_tokens": INFERENCE,
    "max_num_seqs": INFERENCE,
    "max_model_len": INFERENCE,
    "disable_log_stats": INFERENCE,
    "agent": "verl's agent loop (coati's: --tools, --agent)",
    "checkpoint_engine": INFERENCE,
    "trace": "verl's rollout tracing",
    "prometheus": "verl's metrics server",
    "engine_kwargs": INFERENCE,
    "cudagraph_capture_sizes": INFERENCE,
    "calculate_log_probs": INFERENCE,
    "skip_tokenizer_init": INFERENCE,
    "device": "colossalai's accelerator decides",
    "dataloader_num_workers": "coati's prompts are prepared once, cached",
    "return_raw_chat": "coati keeps conversational prompts as messages",
    "return_raw_input_ids": "coati tokenizes once",
    "return_full_prompt": "coati tokenizes once",
    "filter_overlong_prompts": "coati cuts a prompt longer than data.max_prompt_length from the left, keeping its end",
    "filter_overlong_prompts_workers": "coati's preparation",
    "truncation": "coati cuts a prompt longer than data.max_prompt_length from the left",
    "val_batch_size": "verl's validation batch over every GPU; coati's is --eval_batch_size a process",
    "validation_shuffle": "coati evaluates in order",
    "balance_batch": "verl's balancing of sequence lengths across GPUs",
    "log_val_generations": "coati's sample tables (--sample_log_interval)",
    "rollout_data_dir": "coati's sample tables",
    "validation_data_dir": "coati's sample tables",
    "esi_redundant_time": ENGINE,
    "default_hdfs_dir": "coati saves to --save_dir",
    "del_local_ckpt_after_load": "coati keeps its checkpoints (--keep_last)",
    "max_critic_ckpt_to_keep": "--keep_last keeps whole checkpoints",
    "ray_wait_register_center_timeout": "verl's Ray cluster",
    "use_legacy_worker_impl": ENGINE,
    "val_before_train": "coati evaluates the held-out prompts before training, every trainer.test_freq steps and "
                        "after the last",
    "rollout_correction": "coati corrects for the rollout engine with --behaviour_correction",
    "over_sample_rate": INFERENCE,
    "multi_stage_wake_up": INFERENCE,
    "forward_prefetch": ENGINE,
    "image_key": "coati's vision rows take an images column",
    "video_key": "coati's vision rows take images",
    "image_patch_size": "the model's processor decides",
    "return_multi_modal_inputs": ENGINE,
    "trust_remote_code": "actor_rollout_ref.model.trust_remote_code loads the tokenizer too",
    "multi_turn": "verl's multi-turn rollouts, off (coati's: --tools, --max_turns)",
    "policy_loss": "the settings of verl's clip-cov and kl-cov losses, which coati has not",
    "mtp": "verl's multi-token prediction",
    "tiled_mlp": ENGINE,
    "fused_kernel_options": ENGINE,
    "skip_dump_dir": INFERENCE,
    "enable_rollout_routing_replay": "verl's MoE router replay",
    "quantization_config_file": INFERENCE,
    "pf_ppo": "verl's PF-PPO, off (algorithm.use_pf_ppo)",
}
"""verl's keys (by a part of their name) that change nothing here, with why."""
OVERLONG = ("reward_model.overlong_buffer.", "reward_model.reward_kwargs.overlong_buffer_cfg.")
"""Where verl's DAPO recipes set the overlong penalty (`enable`, `len`, `penalty_factor`, `log`): coati's
`--reward_shaping overlong`."""
OVERLONG_KEYS = ("enable", "len", "penalty_factor", "log")
CONVERTED_UNDER = {"algorithm.kl_ctrl.": ("type", "kl_coef", "horizon", "target_kl"),
                   "algorithm.filter_groups.": ("enable", "metric", "max_num_gen_batches"),
                   "custom_reward_function.": ("path", "name"), OVERLONG[0]: OVERLONG_KEYS, OVERLONG[1]: OVERLONG_KEYS}
"""verl's sections whose keys a conversion of several keys reads (`_convert`), with the keys verl has there."""
VERL_COLUMNS = {"data.prompt_key": "prompt", "data.reward_fn_key": "data_source"}
"""verl's keys that name a column of the data -> the name coati's rows give that column (`--dataset_columns`)."""
CONVERTED = (A + "use_kl_loss", A + "kl_loss_coef", A + "kl_loss_type", A + "clip_ratio", A + "clip_ratio_c",
             A + "tau_pos", A + "tau_neg", R + "val_kwargs.do_sample", R + "val_kwargs.n", R + "val_kwargs.temperature",
             R + "val_kwargs.top_p", R + "val_kwargs.top_k",
             "algorithm.adv_estimator", "algorithm.use_kl_in_reward", "algorithm.norm_adv_by_std_in_grpo",
             "algorithm.kl_penalty", "trainer.logger", "trainer.critic_warmup", "trainer.resume_mode",
             "trainer.resume_from_path", "reward_model.enable", "reward_model.model.path", *VERL_COLUMNS,
             *CONVERTED_UNDER)
"""verl's keys (a name ending in a dot: every key under it) that a conversion of several keys reads (`_convert`)."""
KEYS_UNDER = {**CONVERTED_UNDER, A + "policy_loss.": ("loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                                       "kl_cov_ratio", "ppo_kl_coef")}
"""verl's keys under the sections whose keys are read together (besides its config classes' `_target_`): a key
under one of them that verl has not is refused, where Hydra would refuse it, not read as nothing."""
NOT_USED_UNDER = {
    "actor_rollout_ref.ref.": "the reference is the actor's model at the start; its log-probs are computed in "
                              "--logits_forward_batch_size rows",
    M + "lora.": "Megatron's LoRA settings (coati's LoRA adapts --lora_target_modules, HF's module names)",
    "critic.optim.": "coati's critic takes the actor's optimizer settings, but --critic_lr",
    "critic.model.": "coati's critic is --critic_pretrain with a value head, on the actor's plugin",
    "critic.": "coati's critic learns on the actor's batches",
    "reward_model.sandbox_fusion.": "verl's remote sandbox; coati's code_tests reward runs code in a sandbox of "
                                    "its own",
    "reward_model.": "coati's reward model (--rm_pretrain) and reward functions score on the training processes",
}
"""verl's sections whose other keys change nothing here, with why (the first prefix that matches)."""
AT_DEFAULT: Dict[str, Any] = {
    A + "optim.optimizer": "AdamW", A + "optim.optimizer_impl": "torch.optim",
    A + "optim.min_lr_ratio": 0.0, A + "optim.num_cycles": 0.5, A + "optim.betas": [0.9, 0.999],
    A + "optim.override_optimizer_config": None, A + "optim.total_training_steps": -1,
    A + "use_prefix_grouper": False, A + "calculate_entropy": False, A + "loss_scale_factor": None,
    A + "calculate_sum_pi_squared": False, A + "sum_pi_squared_checkpointing": False, R + "ignore_eos": False,
    R + "do_sample": True, R + "multi_turn.enable": False, R + "data_parallel_size": 1,
    R + "expert_parallel_size": 1, R + "pipeline_model_parallel_size": 1, R + "skip_rollout": False,
    R + "quantization": None, R + "logprobs_mode": "processed_logprobs", R + "scheduling_policy": "fcfs",
    M + "custom_chat_template": None, M + "external_lib": None, M + "override_config": {}, M + "hf_config_path": None,
    M + "enable_activation_offload": False, M + "exclude_modules": None, M + "lora_adapter_path": None,
    "data.train_max_samples": -1, "data.val_max_samples": -1, "data.tokenizer": None, "data.tool_config_path": None,
    "algorithm.use_pf_ppo": False, "trainer.val_only": False,
    "data.custom_cls.path": None, "data.custom_cls.name": None, "data.sampler.class_path": None,
    "data.sampler.class_name": None, "data.datagen.path": None, "data.datagen.name": None,
    "data.apply_chat_template_kwargs": {},
}
"""verl's keys coati has no setting for, at the value coati's run matches (verl's default): taken and noted there,
refused at any other value."""


def is_verl_key(command: str, section: str, key: Optional[str] = None) -> bool:
    """Whether `section` (and its `key`) of a config file or an override is verl's, for `command`."""
    if command not in VERL_COMMANDS:
        return False
    if section in VERL_SECTIONS:
        return True
    return key is not None and key in SHARED_SECTIONS.get(section, ())


def split_verl(values: Mapping[str, Any], command: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the config's values that are not verl's, verl's by dotted key, its interpolations resolved)."""
    rest, verl = verl_part(resolved(values) if command in VERL_COMMANDS else values, command)
    flat: Dict[str, Any] = {}
    for section, value in verl.items():
        _flatten(value, section, flat)
    return rest, flat


def verl_part(values: Mapping[str, Any], command: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the config's values that are not verl's, verl's), both nested as given: a section shared with coati's run
    config is split by key."""
    rest: Dict[str, Any] = {}
    verl: Dict[str, Any] = {}
    for section, value in values.items():
        section = str(section)
        if is_verl_key(command, section):
            verl[section] = value
        elif section in SHARED_SECTIONS and isinstance(value, Mapping) and command in VERL_COMMANDS:
            own = {k: v for k, v in value.items() if not is_verl_key(command, section, str(k))}
            theirs = {k: v for k, v in value.items() if k not in own}
            if theirs:
                verl[section] = theirs
            if own or not theirs:
                rest[section] = own
        else:
            rest[section] = value
    return rest, verl


def overrides_into_file(file_values: Mapping[str, Any], overrides: Mapping[str, Any],
                        command: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the config file's values with verl's keys among `overrides` put in, the other overrides): as in Hydra, the
    command line replaces the file's value before anything reads it, so the file's `rollout.name: sglang` under
    `actor_rollout_ref.rollout.name=hf` is never refused, and keys read together (use_kl_loss with kl_loss_coef) are
    read together."""
    rest, verl = verl_part(overrides, command)
    if not verl or not file_values:
        return dict(file_values), dict(overrides)
    return _merged(file_values, verl), rest


def _merged(base: Mapping[str, Any], update: Mapping[str, Any]) -> Dict[str, Any]:
    """`base` with `update`'s values put in, mapping into mapping."""
    merged = dict(base)
    for key, value in update.items():
        merged[key] = _merged(merged[key], value) if isinstance(value, Mapping) and isinstance(
            merged.get(key), Mapping) else value
    return merged


INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")
MISSING = object()


def resolved(values: Mapping[str, Any]) -> Dict[str, Any]:
    """`values` with OmegaConf's interpolations resolved as verl's Hydra resolves them, so a config verl wrote or a
    copy of its own reads as it means: `${a.b}` (from the top), `${.b}` (beside the key), `${oc.select:a.b,default}`,
    `${oc.env:NAME,default}`; one that finds nothing is its default, else null, as is Hydra's `???` (not given)."""
    def lookup(path: str, here: Mapping[str, Any]) -> Any:
        node: Any = here if path.startswith(".") else values
        for part in path.lstrip(".").split("."):
            if not isinstance(node, Mapping) or part not in node:
                return MISSING
            node = node[part]
        return node

    def resolve(value: Any, here: Mapping[str, Any], depth: int = 0) -> Any:
        if isinstance(value, Mapping):
            return {key: resolve(inner, value, depth) for key, inner in value.items()}
        if isinstance(value, list):
            return [resolve(inner, here, depth) for inner in value]
        if value == "???":
            return None
        match = INTERPOLATION.fullmatch(value.strip()) if isinstance(value, str) else None
        if match is None or depth > 8:
            return value
        kind, _, expression = match.group(1).strip().rpartition(":") if match.group(1).startswith("oc.") else \
            ("", "", match.group(1).strip())
        path, _, fallback = expression.partition(",")
        default = yaml_value(fallback.strip())
        found = os.environ.get(path.strip(), MISSING) if kind == "oc.env" else lookup(path.strip(), here)
        return default if found is MISSING else resolve(found, here, depth + 1)

    return resolve(values, values)


def yaml_value(text: str) -> Any:
    """A value as Hydra's overrides and OmegaConf's defaults write it (`[a, b]` a list, `true` a boolean, `1e-6` as
    written, nothing null), read as a config file would hold it."""
    import yaml

    try:
        return yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return text


NOT_FLATTENED = ("override_config", "engine_kwargs", "apply_chat_template_kwargs")
"""verl's keys whose value is one mapping of options, not a section."""


def _flatten(value: Any, prefix: str, into: Dict[str, Any]) -> None:
    """`into[prefix.key.subkey...] = value` for each leaf of the section `value` (an empty mapping is a leaf)."""
    if isinstance(value, Mapping) and value and not prefix.endswith(NOT_FLATTENED):
        for key, inner in value.items():
            _flatten(inner, f"{prefix}.{key}", into)
    else:
        into[prefix] = value


def verl_settings(verl: Mapping[str, Any], command: str) -> Tuple[List[Tuple[str, Any, str]], Dict[str, str]]:
    """((coati's flag name without dashes, value, the verl key it comes from) for verl's `verl` (dotted key ->
    value); verl's keys that change nothing here, with why). Every key coati cannot honour is refused in one line,
    all of them named."""
    settings: List[Tuple[str, Any, str]] = []
    unused: Dict[str, str] = {}
    problems: List[str] = []
    lora_off = not any(verl.get(key) for key in (M + "lora_rank", M + "lora.rank"))
    read_by_loss = READ_BY_LOSS.get(verl.get(A + "policy_loss.loss_mode"))
    problems += [f"{key}: verl has no such key{_nearest(key)}" for key in verl if not _known_under(key)]
    for key, value in verl.items():
        if key in VERL_LAUNCH_KEYS or _converted(key) or key == read_by_loss:
            continue
        if lora_off and key.startswith(LORA_KEYS):
            unused[key] = "LoRA is off (actor_rollout_ref.model.lora_rank 0)"
            continue
        if key in TAKEN:
            name, convert = TAKEN[key]
            try:
                settings.append((name, None if value is None else convert(value), key))
            except CoatiUsageError as error:
                problems.append(str(error))
        elif key in BATCHES:
            settings.append((f"verl_{key.rsplit('.', 1)[-1]}", value, key))
        elif key in AT_DEFAULT:
            if value == AT_DEFAULT[key] or value is None and AT_DEFAULT[key] in ({}, None):
                unused[key] = "verl's default, which coati's run matches"
            else:
                problems.append(_at_default_refusal(key, value))
        elif (reason := _reason(key)) is None:
            problems.append(f"{key}: no verl key coati reads{_nearest(key)}")
        elif reason:
            unused[key] = reason
    try:
        settings += _convert(verl, command, unused)
        settings = _one_each(settings, command, unused)
    except CoatiUsageError as error:
        problems.append(str(error))
    if problems:
        raise CoatiUsageError("; ".join(problems))
    return [*settings, ("verl_keys", sorted(verl), "verl")], unused


READ_BY_LOSS = {"geo_mean": A + "loss_agg_mode", "cispo": A + "clip_ratio_low"}
"""verl's keys whose meaning its policy loss (`policy_loss.loss_mode`) changes: read by `_policy_loss_options`."""
LORA_KEYS = (M + "lora_alpha", M + "target_modules", M + "exclude_modules", M + "lora_adapter_path", M + "lora.")
"""verl's LoRA settings beside its rank, which change nothing while LoRA is off (rank 0, verl's default)."""
PPO_ONLY = ("critic_lr", "critic_pretrain", "value_clip", "gamma", "lam", "critic_warmup_episodes")
"""coati's settings of PPO's critic and GAE, which verl's keys may give a GRPO run too (verl's config holds them)."""


def _one_each(settings: List[Tuple[str, Any, str]], command: str, unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """`settings` with one value per setting: two verl keys for one (`data.max_response_length` and
    `rollout.response_length`, as verl's config holds both) agree or one is null; PPO's settings in a GRPO run, the
    epochs where the steps are given (verl's steps win) and vLLM's settings without vLLM are named as not used."""
    kept: Dict[str, Tuple[str, Any, str]] = {}
    by_name = {name: value for name, value, _ in settings if value is not None}
    for name, value, key in settings:
        if command == "grpo" and name in PPO_ONLY:
            unused[key] = "PPO's critic and GAE (coati ppo)"
            continue
        if name == "num_epochs" and "num_episodes" in by_name:
            unused[key] = "trainer.total_training_steps decides the run's length, as in verl"
            continue
        if name == "warmup_ratio" and (by_name.get("verl_lr_warmup_steps") or -1) > 0:
            unused[key] = "optim.lr_warmup_steps decides the warm-up, as in verl"
            continue
        if name.startswith("vllm_") and by_name.get("rollout_backend") != "vllm":
            unused[key] = "vLLM's, and the rollouts are not on vLLM (actor_rollout_ref.rollout.name)"
            continue
        earlier = kept.get(name)
        if earlier is not None and value is not None and earlier[1] is not None and earlier[1] != value:
            raise CoatiUsageError(f"{earlier[2]}={earlier[1]} and {key}={value} set the same setting; keep one")
        if earlier is None or earlier[1] is None:
            kept[name] = (name, value, key)
    return list(kept.values())


AT_DEFAULT_HINTS = {
    A + "optim.betas": "give --adam_beta1 and --adam_beta2",
    R + "multi_turn.enable": "coati's multi-turn rollouts are --tools (and --max_turns)",
    M + "exclude_modules": "coati's LoRA adapts --lora_target_modules",
    "data.train_max_samples": "coati trains on every row",
    M + "custom_chat_template": "write the template to a file and give --chat_template FILE",
}
"""What to do instead, for the keys of `AT_DEFAULT` given another value."""


def _at_default_refusal(key: str, value: Any) -> str:
    """Why `key` at `value` is refused: coati runs as verl's default for it, and what to do instead where known."""
    default = AT_DEFAULT[key]
    runs_as = f"coati runs as verl's default {default!r} and has no setting for it" if default not in (None, {}) else \
        "coati has no setting for it"
    hint = AT_DEFAULT_HINTS.get(key)
    return f"{key}={value}: {runs_as}" + (f" ({hint})" if hint else "")


def _converted(key: str) -> bool:
    """Whether `_convert` reads verl's `key` (one of `CONVERTED`, or under one of its sections)."""
    return key in CONVERTED or key.startswith(tuple(name for name in CONVERTED if name.endswith(".")))


def _known_under(key: str) -> bool:
    """Whether `key`, where it lies under one of `KEYS_UNDER`'s sections, is one of verl's keys there."""
    prefix = next((prefix for prefix in KEYS_UNDER if key.startswith(prefix)), None)
    return prefix is None or key[len(prefix):] in (*KEYS_UNDER[prefix], "_target_")


def _nearest(key: str) -> str:
    """' (did you mean X?)' for the verl keys coati takes that are closest to `key`, else where they are listed."""
    names = [*TAKEN, *BATCHES, *AT_DEFAULT, *(name for name in CONVERTED if not name.endswith(".")),
             *(prefix + name for prefix, under in KEYS_UNDER.items() for name in under)]
    close = difflib.get_close_matches(key, list(dict.fromkeys(names)), n=2, cutoff=0.8)
    return f" (did you mean {' or '.join(close)}?)" if close else \
        " (docs/migration/verl.md lists the verl keys coati takes)"


def _reason(key: str) -> Optional[str]:
    """Why verl's `key` changes nothing here, or None where it is no key coati knows: the reason of the outermost
    part of its name that has one (`fsdp_config`, `profiler`, ..., then its own), else of a section it is in."""
    for part in key.split("."):   # the outermost first: megatron.tensor_model_parallel_size is the engine's
        if part in NOT_USED:
            return NOT_USED[part]
    return next((why for prefix, why in NOT_USED_UNDER.items() if key.startswith(prefix)), None)


def _convert(verl: Mapping[str, Any], command: str, unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """The settings that come from several of verl's keys, or from one with a meaning of its own: the KL, the reward
    function, checkpoints and resuming, the logger, the advantage's scaling, the critic's warm-up, the columns."""
    settings: List[Tuple[str, Any, str]] = _kl(verl, command, unused)
    if verl.get(A + "clip_ratio") is not None:   # verl's clip_ratio_low and _high, where given, come first
        settings += [(name, verl[A + "clip_ratio"], A + "clip_ratio") for name, own in (
            ("clip_eps_low", A + "clip_ratio_low"), ("clip_eps_high", A + "clip_ratio_high")) if verl.get(own) is None]
    settings += _policy_loss_options(verl, unused)
    columns = {verl[key]: name for key, name in VERL_COLUMNS.items() if verl.get(key) not in (None, name)}
    if columns:
        settings.append(("dataset_columns", columns, next(key for key in VERL_COLUMNS if verl.get(key) in columns)))
    correction = [k for k in verl if k.startswith("algorithm.rollout_correction.") and
                  k.endswith(("rollout_is", "rollout_rs")) and verl[k] is not None]
    if correction:
        raise CoatiUsageError(f"{correction[0]}={verl[correction[0]]}: coati corrects for the rollout engine's "
                              "log-probs with --behaviour_correction")
    if "algorithm.norm_adv_by_std_in_grpo" in verl and command == "grpo":
        settings.append(("no_std_normalize", not verl["algorithm.norm_adv_by_std_in_grpo"],
                         "algorithm.norm_adv_by_std_in_grpo"))
    elif "algorithm.norm_adv_by_std_in_grpo" in verl:
        unused["algorithm.norm_adv_by_std_in_grpo"] = "GRPO's; PPO's advantages are whitened (--no_whiten_advantages)"
    if "algorithm.adv_estimator" in verl:
        settings += _advantages(verl["algorithm.adv_estimator"], command, unused)
    settings += _reward(verl) + _checkpoints(verl) + _evaluation(verl, unused) + _overlong(verl, unused) + \
        _filter_groups(verl, unused)
    if verl.get("trainer.logger") is not None:
        settings += _report_to(verl["trainer.logger"], unused)
    if verl.get("trainer.critic_warmup", 0) and command == "ppo":
        settings.append(("critic_warmup_episodes", verl["trainer.critic_warmup"], "trainer.critic_warmup"))
    return settings


def _kl(verl: Mapping[str, Any], command: str, unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """verl's KL to the reference: in the actor's loss (`use_kl_loss`, `kl_loss_coef`, `kl_loss_type`), or in the
    reward (`algorithm.use_kl_in_reward`, `kl_ctrl.kl_coef`, `kl_penalty`), at most one of them. coati's GRPO has
    both places (`--kl_in_reward`), its PPO the reward alone. verl's adaptive controller aims at a per-token mean KL,
    coati's `--kl_target` at a completion's summed KL, so it is refused."""
    in_loss, in_reward = bool(verl.get(A + "use_kl_loss")), bool(verl.get("algorithm.use_kl_in_reward"))
    loss_keys, reward_keys = (A + "kl_loss_coef", A + "kl_loss_type"), ("algorithm.kl_penalty", "algorithm.kl_ctrl.")
    if in_loss and in_reward:
        raise CoatiUsageError(f"{A}use_kl_loss=true and algorithm.use_kl_in_reward=true: coati puts the KL to the "
                              "reference in one place; keep one")
    if in_loss and command == "ppo":
        raise CoatiUsageError(f"{A}use_kl_loss=true: coati's PPO puts the KL to the reference in the reward; give "
                              "algorithm.use_kl_in_reward=true and its algorithm.kl_ctrl.kl_coef")
    for keys, used, why in ((loss_keys, in_loss, "the KL loss's, and actor.use_kl_loss is off"),
                            (reward_keys, in_reward, "the KL in the reward's, and algorithm.use_kl_in_reward is off")):
        unused.update({key: why for key in verl if key.startswith(keys) and not used})
    if not in_reward:
        settings = [("kl_estimator", _named(KL_ESTIMATORS, A + "kl_loss_type")(verl[A + "kl_loss_type"]),
                     A + "kl_loss_type")] if A + "kl_loss_type" in verl and in_loss else []
        if A + "use_kl_loss" in verl or A + "kl_loss_coef" in verl:   # verl adds the KL loss only with use_kl_loss
            settings.append(("kl_coef", verl.get(A + "kl_loss_coef", 0.001) if in_loss else 0.0, A + "use_kl_loss"))
        return settings
    if verl.get("algorithm.kl_ctrl.type", "fixed") != "fixed":
        raise CoatiUsageError(f"algorithm.kl_ctrl.type={verl['algorithm.kl_ctrl.type']}: verl's adaptive KL aims at a "
                              "per-token mean KL, coati's at a completion's summed KL: give --kl_target in coati's "
                              "sense (and --kl_horizon)")
    for key in ("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon"):
        if key in verl:
            unused[key] = "verl's adaptive KL's, and algorithm.kl_ctrl.type is fixed"
    settings = [("kl_coef", verl.get("algorithm.kl_ctrl.kl_coef", 0.001), "algorithm.kl_ctrl.kl_coef"),
                ("kl_estimator", _named(KL_ESTIMATORS, "algorithm.kl_penalty")(verl.get("algorithm.kl_penalty", "kl")),
                 "algorithm.kl_penalty")]
    return settings + ([("kl_in_reward", True, "algorithm.use_kl_in_reward")] if command == "grpo" else [])


def _policy_loss_options(verl: Mapping[str, Any], unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """The hyperparameters of verl's policy losses as coati's `--policy_loss_option`s, for the loss they belong to:
    SAPO's temperatures (`tau_pos`, `tau_neg`) and the dual clip (`clip_ratio_c`) of verl's vanilla loss, coati's
    ppo; CISPO's floor on its weight, 1 - `clip_ratio_low` (verl's default 0.2 gives 0.8); and GMPO's mean over
    sequences (`--loss_agg seq-mean-token-mean`), which verl's geo_mean takes whatever `loss_agg_mode` says."""
    mode = verl.get(A + "policy_loss.loss_mode") or "vanilla"
    options: Dict[str, Tuple[Any, str]] = {}
    for key, default in SAPO_TEMPERATURES.items():
        if verl.get(A + key, default) == default:
            continue
        if mode == "sapo":
            options[f"temperature_{key[4:]}"] = (verl[A + key], A + key)
        else:
            unused[A + key] = f"SAPO's temperature, and the loss is verl's {mode}"
    if mode == "cispo":   # verl's CISPO clamps its weight to [1 - low, 1 + high]
        options.update(_cispo_floor(verl, unused))
    if mode == "geo_mean" and A + "loss_agg_mode" in verl:
        unused[A + "loss_agg_mode"] = "verl's GMPO (geo_mean) averages over sequences whatever it says"
    if verl.get(A + "clip_ratio_c") is not None and mode == "vanilla":
        options["dual_clip"] = (verl[A + "clip_ratio_c"], A + "clip_ratio_c")
    elif verl.get(A + "clip_ratio_c") is not None:
        unused[A + "clip_ratio_c"] = f"the dual clip of verl's vanilla loss, which its {mode} loss does not apply"
    averaged = [("loss_agg", "seq-mean-token-mean", A + "policy_loss.loss_mode")] if mode == "geo_mean" else []
    if not options:
        return averaged
    return averaged + [("policy_loss_option", [f"{name}={value}" for name, (value, _) in options.items()],
                        next(iter(options.values()))[1])]


def _cispo_floor(verl: Mapping[str, Any], unused: Dict[str, str]) -> Dict[str, Tuple[Any, str]]:
    """coati's cispo option `floor` from verl's CISPO, whose weight has 1 - `clip_ratio_low` (else `clip_ratio`,
    0.2) as its floor: none where that is not above 0."""
    key = A + "clip_ratio_low" if verl.get(A + "clip_ratio_low") is not None else A + "clip_ratio"
    try:
        floor = 1 - float(verl.get(key, 0.2))
    except (TypeError, ValueError):
        raise CoatiUsageError(f"{key}={verl[key]}: not a number") from None
    if floor > 0:
        return {"floor": (round(floor, 12), key)}
    if key == A + "clip_ratio_low":
        unused[key] = "CISPO's floor on the weight is 1 - it, here none, as coati's cispo by default"
    return {}


ADV_ESTIMATORS = {"grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp",
                  "reinforce_plus_plus_baseline": "reinforce_pp_baseline"}
"""verl's `algorithm.adv_estimator`s that `coati grpo` has, by coati's name (`coati ppo` is verl's gae)."""


def _advantages(estimator: str, command: str, unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """verl's `algorithm.adv_estimator`: gae is `coati ppo` (a critic), the others `coati grpo`'s `--adv_estimator`."""
    key = f"algorithm.adv_estimator={estimator}"
    if command == "ppo":
        if estimator != "gae":
            raise CoatiUsageError(f"{key} learns without a critic: run `coati grpo` with these settings")
        unused["algorithm.adv_estimator"] = "coati ppo's advantages are GAE's"
        return []
    if estimator == "gae":
        raise CoatiUsageError(f"{key} learns a critic: run `coati ppo` with these settings")
    if estimator not in ADV_ESTIMATORS:
        raise CoatiUsageError(f"{key} has no counterpart here; coati grpo takes {', '.join(ADV_ESTIMATORS)} "
                              "(and its own --adv_estimator names)")
    return [("adv_estimator", ADV_ESTIMATORS[estimator], "algorithm.adv_estimator")]


def _reward(verl: Mapping[str, Any]) -> List[Tuple[str, Any, str]]:
    """verl's `custom_reward_function.path` and `.name` (default `compute_score`) -> `--reward_fn PATH:NAME`; its
    reward model, `reward_model.model.path` with `reward_model.enable`, -> `--rm_pretrain`."""
    path = verl.get("custom_reward_function.path")
    other = [key for key in verl if key.startswith("custom_reward_function.") and
             key not in ("custom_reward_function.path", "custom_reward_function.name")]
    if other:
        raise CoatiUsageError(f"{other[0]}: coati calls verl's reward function with its four arguments only "
                              "(data_source, solution_str, ground_truth, extra_info)")
    settings = []
    if verl.get("reward_model.enable"):
        if not verl.get("reward_model.model.path"):
            raise CoatiUsageError("reward_model.enable=true needs reward_model.model.path")
        settings.append(("rm_pretrain", _path(verl["reward_model.model.path"]), "reward_model.model.path"))
    if path:
        name = verl.get("custom_reward_function.name") or "compute_score"
        settings.append(("reward_fn", [f"{_path(path)}:{name}"], "custom_reward_function.path"))
    return settings


def _checkpoints(verl: Mapping[str, Any]) -> List[Tuple[str, Any, str]]:
    """verl's checkpoints: every `trainer.save_freq` steps into `trainer.default_local_dir` (verl's default
    checkpoints/PROJECT/EXPERIMENT), resumed from the newest there unless `trainer.resume_mode` is disable, or from
    `trainer.resume_from_path` with resume_path."""
    settings: List[Tuple[str, Any, str]] = []
    saving = verl.get("trainer.save_freq", -1) not in (-1, 0, None)
    if saving and "trainer.default_local_dir" not in verl:
        settings.append(("save_dir", f"checkpoints/{verl.get('trainer.project_name', 'verl_examples')}/"
                                     f"{verl.get('trainer.experiment_name', 'gsm8k')}", "trainer.save_freq"))
    mode = verl.get("trainer.resume_mode", "auto")
    if mode == "resume_path":
        if not verl.get("trainer.resume_from_path"):
            raise CoatiUsageError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        settings.append(("checkpoint_path", _path(verl["trainer.resume_from_path"]), "trainer.resume_from_path"))
    elif mode == "auto" and (saving or "trainer.default_local_dir" in verl):
        settings.append(("checkpoint_path", "latest", "trainer.resume_mode"))
    elif mode not in ("auto", "disable"):
        raise CoatiUsageError(f"trainer.resume_mode={mode}: verl's modes are auto, disable and resume_path")
    return settings


def _report_to(logger: Any, unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """verl's `trainer.logger` list -> `--report_to`: console is always on here; wandb and tensorboard as named;
    console alone keeps coati's default (TensorBoard events and metrics.jsonl in --log_dir), said in the note."""
    names = [logger] if isinstance(logger, str) else list(logger)
    unknown = [name for name in names if name not in ("console", "wandb", "tensorboard")]
    if unknown:
        raise CoatiUsageError(f"trainer.logger {unknown[0]!r}: coati logs to console, wandb and tensorboard")
    chosen = [name for name in names if name != "console"]
    if not chosen:
        unused["trainer.logger"] = ("coati prints to the console and keeps TensorBoard events and metrics.jsonl in "
                                    "--log_dir too (--report_to none drops them)")
    return [("report_to", chosen, "trainer.logger")] if chosen else []


def _evaluation(verl: Mapping[str, Any], unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """verl's validation sampling: greedy, or with `val_kwargs.do_sample` `val_kwargs.n` completions at its
    temperature, top-p and top-k -> coati's greedy completion of each held-out prompt, and `--eval_n_samples` sampled
    at `--eval_temperature`, `--eval_top_p` and `--eval_top_k` beside it."""
    keys = {name: R + f"val_kwargs.{name}" for name in ("n", "temperature", "top_p", "top_k")}
    if not verl.get(R + "val_kwargs.do_sample"):
        unused.update({key: "verl samples held-out prompts only with val_kwargs.do_sample=true; coati evaluates "
                            "greedily too" for key in keys.values() if key in verl})
        return []
    settings: List[Tuple[str, Any, str]] = [("eval_n_samples", verl.get(keys["n"]) or 1, keys["n"])]
    if verl.get(keys["temperature"]):   # 0 samples greedily: coati's greedy completion is there already
        settings.append(("eval_temperature", verl[keys["temperature"]], keys["temperature"]))
    if verl.get(keys["top_p"]) is not None:
        settings.append(("eval_top_p", verl[keys["top_p"]], keys["top_p"]))
    if verl.get(keys["top_k"]) is not None:
        settings.append(("eval_top_k", _off_at_minus_one(verl[keys["top_k"]]), keys["top_k"]))
    return settings


FILTER_METRICS = ("seq_reward", "score", "seq_final_reward", "acc")
"""verl's DAPO `filter_groups.metric`s: coati's dynamic sampling looks at the reward (acc is it where the reward is
the accuracy, as in DAPO's recipes)."""


def _filter_groups(verl: Mapping[str, Any], unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """DAPO's dynamic sampling as verl's recipe sets it (`algorithm.filter_groups.enable`, `metric`,
    `max_num_gen_batches`) -> `--dynamic_sampling` and `--max_sampling_rounds`; off, its keys are noted."""
    prefix = "algorithm.filter_groups."
    keys = [key for key in verl if key.startswith(prefix)]
    if not verl.get(prefix + "enable"):
        unused.update({key: "DAPO's dynamic sampling, off" for key in keys})
        return []
    metric = verl.get(prefix + "metric") or "acc"
    if metric not in FILTER_METRICS:
        raise CoatiUsageError(f"{prefix}metric={metric}: coati's dynamic sampling replaces groups whose rewards all "
                              f"tie; it takes {', '.join(FILTER_METRICS)}")
    rounds = verl.get(prefix + "max_num_gen_batches")
    if rounds is not None and rounds <= 0:
        raise CoatiUsageError(f"{prefix}max_num_gen_batches={rounds} (no limit): give a bound, the extra prompt "
                              "batches a step may draw")
    if prefix + "metric" in verl:
        unused[prefix + "metric"] = "coati replaces the groups whose rewards all tie"
    settings: List[Tuple[str, Any, str]] = [("dynamic_sampling", True, prefix + "enable")]
    if rounds is not None:
        settings.append(("max_sampling_rounds", rounds, prefix + "max_num_gen_batches"))
    return settings


def _overlong(verl: Mapping[str, Any], unused: Dict[str, str]) -> List[Tuple[str, Any, str]]:
    """DAPO's overlong penalty as verl's recipes set it (`OVERLONG`) -> `--reward_shaping overlong` with its buffer
    length and factor; off, its keys are noted."""
    for prefix in OVERLONG:
        keys = [key for key in verl if key.startswith(prefix)]
        if not verl.get(prefix + "enable"):
            unused.update({key: "DAPO's overlong penalty, off" for key in keys})
            continue
        unused.update({key: "coati logs each reward part" for key in keys if key == prefix + "log"})
        settings: List[Tuple[str, Any, str]] = [("reward_shaping", ["overlong"], prefix + "enable")]
        for name, coati in (("len", "overlong_buffer_len"), ("penalty_factor", "overlong_penalty_factor")):
            if verl.get(prefix + name) is not None:
                settings.append((coati, verl[prefix + name], prefix + name))
        return settings
    return []


def verl_launch(command: str, values: Mapping[str, Any], argv: Sequence[str]) -> Dict[str, str]:
    """The launch flags that verl's `trainer.n_gpus_per_node` and `trainer.nnodes` give, in a config file's `values`
    or as overrides in `argv` (which win), for an on-policy `command`."""
    if command not in VERL_COMMANDS:
        return {}
    found: Dict[str, str] = {}
    trainer = values.get("trainer")
    for key, flag in VERL_LAUNCH_KEYS.items():
        if isinstance(trainer, Mapping) and key.split(".")[1] in trainer:
            found[flag] = str(trainer[key.split(".")[1]])
    for arg in argv:
        key, equals, value = arg.lstrip("+").partition("=")
        if equals and key in VERL_LAUNCH_KEYS:
            found[VERL_LAUNCH_KEYS[key]] = value
    return found


def add_verl_names(parser: argparse.ArgumentParser) -> None:
    """The hidden flags verl's names go as (its batch sizes, `BATCHES`, and the verl keys given, `--verl_keys`), and
    their conversion after parsing, for the processes the run has (`launched_world_size`)."""
    from coati.cli.options import add_post_parse
    from coati.distributed.launch import launched_world_size

    group = parser.add_argument_group("verl's names (section.key=value; see coati.cli.verl_names)")
    for key in BATCHES:
        name = key.rsplit(".", 1)[-1]
        group.add_argument(f"--verl_{name}", dest=f"verl_{name}", type=int, default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
    group.add_argument("--verl_keys", nargs="+", action="extend", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def after_parse(args: argparse.Namespace) -> None:
        given, world_size = getattr(parser, "given", {}), launched_world_size()
        convert_batches(args, world_size, given)
        convert_log_prob_batch(args, world_size)
        convert_warmup(args, given)
        note_other_defaults(args, take_hidden(args, "verl_keys") or [], given)

    add_post_parse(parser, after_parse)


OTHER_DEFAULTS = {"lr": (A + "optim.lr", 1e-6), "lr_scheduler": (A + "optim.lr_scheduler_type", "constant"),
                  "weight_decay": (A + "optim.weight_decay", 0.01),
                  "grad_checkpoint": (M + "enable_gradient_checkpointing", True),
                  "max_new_tokens": ("data.max_response_length", 512)}
"""coati's settings whose default is not verl's: (verl's key, verl's default), said in a note where a run in verl's
names leaves them out."""


def note_other_defaults(args: argparse.Namespace, verl_keys: Sequence[str], given: Mapping[str, str]) -> None:
    """One note, for a run given in verl's names, naming the settings it leaves at coati's default where verl's
    differs, with both values."""
    if not verl_keys:
        return
    keys = set(verl_keys)
    differ = [f"{key} (verl {verl_default}, here --{name} {getattr(args, name)})"
              for name, (key, verl_default) in OTHER_DEFAULTS.items()
              if key not in keys and name not in given and getattr(args, name, verl_default) != verl_default]
    if A + "clip_ratio_c" not in keys and getattr(args, "policy_loss", None) == "ppo" and \
            "dual_clip" not in dict(getattr(args, "policy_loss_option", None) or []):
        differ.append(f"{A}clip_ratio_c (verl's vanilla loss clips at 3.0, here no dual clip: --policy_loss_option "
                      "dual_clip=3)")
    if differ:
        note_user("coati's defaults where verl's differ, for what this run does not give: " + "; ".join(differ))


def convert_batches(args: argparse.Namespace, world_size: int, given: Mapping[str, str]) -> None:
    """verl's batch sizes over every GPU -> coati's per rank: `data.train_batch_size` prompts a step
    (`--batch_size` = it / world), one optimizer step per `ppo_mini_batch_size` prompts (default the whole batch)
    in micro-batches of `ppo_micro_batch_size_per_gpu` completions (or verl's older `ppo_micro_batch_size`, over
    every GPU) (`--train_batch_size`, default the whole mini-batch; `--accumulation_steps` = mini-batch /
    micro-batch); each must divide."""
    batch, mini = take_hidden(args, "verl_train_batch_size"), take_hidden(args, "verl_ppo_mini_batch_size")
    micro = _micro_batch(take_hidden(args, "verl_ppo_micro_batch_size_per_gpu"),
                         take_hidden(args, "verl_ppo_micro_batch_size"), world_size)
    if batch is None and mini is None and micro is None:
        return
    for flag in ("batch_size", "train_batch_size", "accumulation_steps"):
        if flag in given:
            raise CoatiUsageError(f"{given[flag]} and verl's batch sizes (data.train_batch_size, the actor's "
                                  "ppo_mini_batch_size, ppo_micro_batch_size_per_gpu) both set the batches; give one")
    prompts = batch if batch is not None else args.batch_size * world_size
    if prompts % world_size:
        raise CoatiUsageError(f"data.train_batch_size={prompts} prompts is not a whole number for each of the "
                              f"{world_size} processes; make it a multiple of {world_size}")
    args.batch_size = prompts // world_size
    mini = prompts if mini is None else mini
    completions = mini * args.num_generations
    if prompts % mini:
        raise CoatiUsageError(f"{A}ppo_mini_batch_size={mini} does not divide data.train_batch_size={prompts}: a "
                              "step's prompts make whole mini-batches, one optimizer step each")
    if completions % world_size:
        raise CoatiUsageError(f"{A}ppo_mini_batch_size={mini} x rollout.n {args.num_generations} = {completions} "
                              f"completions do not split evenly over the {world_size} processes")
    per_rank = completions // world_size
    micro = per_rank if micro is None else micro
    if per_rank % micro:
        raise CoatiUsageError(f"{A}ppo_micro_batch_size_per_gpu={micro} does not divide the {per_rank} "
                              f"completions of a mini-batch on each process (ppo_mini_batch_size {mini} x rollout.n "
                              f"{args.num_generations} / {world_size} processes)")
    args.train_batch_size, args.accumulation_steps = micro, per_rank // micro


def convert_warmup(args: argparse.Namespace, given: Mapping[str, str]) -> None:
    """verl's `optim.lr_warmup_steps` counts training steps (its schedule steps once a step; -1 or 0: the ratio
    decides) -> coati's `--warmup_steps`, which counts optimizer steps: it times the optimizer steps of an episode."""
    from coati.cli.arguments import optimizer_steps_per_episode

    steps = take_hidden(args, "verl_lr_warmup_steps")
    if steps is None or steps <= 0:
        return
    if "warmup_steps" in given:
        raise CoatiUsageError(f"{given['warmup_steps']} and {A}optim.lr_warmup_steps both set the warm-up; give one")
    args.warmup_steps = steps * optimizer_steps_per_episode(args)


def convert_log_prob_batch(args: argparse.Namespace, world_size: int) -> None:
    """verl's older `rollout.log_prob_micro_batch_size`, rows a forward over every GPU -> `--logits_forward_batch_size`
    a process (a memory setting: rounded down, at least 1)."""
    overall = take_hidden(args, "verl_log_prob_micro_batch_size")
    if overall is not None:
        args.logits_forward_batch_size = max(1, overall // world_size)


def _micro_batch(per_gpu: Optional[int], overall: Optional[int], world_size: int) -> Optional[int]:
    """Completions a micro-batch on each process: verl's `ppo_micro_batch_size_per_gpu`, or its older
    `ppo_micro_batch_size` over every GPU divided by their number."""
    if overall is None:
        return per_gpu
    if per_gpu is not None:
        raise CoatiUsageError(f"{A}ppo_micro_batch_size and ppo_micro_batch_size_per_gpu: give one (verl takes one)")
    if overall % world_size:
        raise CoatiUsageError(f"{A}ppo_micro_batch_size={overall} completions over every process is not a whole "
                              f"number for each of the {world_size}; give ppo_micro_batch_size_per_gpu")
    return overall // world_size
