"""OpenRLHF's flags on `coati sft|rm|dpo|ppo|grpo`, read as coati's: `--data.max_len 2048`, `--actor.adam.lr 5e-7`.

OpenRLHF's scripts (`openrlhf.cli.train_sft`, `train_rm`, `train_dpo`, `train_ppo_ray`) name their flags by section.
A command that puts `coati sft --nproc_per_node 8` where `deepspeed --module openrlhf.cli.train_sft` was keeps them:
each becomes coati's flag (`openrlhf_flags`, before parsing); the batch sizes, which OpenRLHF counts over every GPU
(`--train.batch_size` samples an optimizer step, `--rollout.batch_size` prompts a rollout), become coati's per-rank
counts once the flags are parsed (`convert_batches`), and `--actor.num_gpus_per_node`/`--actor.num_nodes` launch
the run (`openrlhf_launch`). A flag for OpenRLHF's engine (DeepSpeed, Ray placement, vLLM's) is named in one note;
one whose meaning coati cannot honour, or that OpenRLHF has not, is refused by name. Light: no torch.

OpenRLHF's `train.max_epochs` is, for PPO and GRPO, passes over each rollout (coati's `--num_update_steps`) and its
`train.num_episodes` passes over the prompts (`--num_epochs`); its steps (`ckpt.save_steps`, `eval.steps`,
`logger.logging_steps`) count rollouts there, as coati's episodes, and optimizer steps in SFT, RM and DPO, as coati's.
"""
import argparse
import difflib
import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from coati.utils.errors import CoatiUsageError, note_user
from coati.utils.ranges import is_number
from coati.utils.settings import take_hidden

OPENRLHF_COMMANDS = ("sft", "rm", "dpo", "ppo", "grpo")
ON_POLICY = ("ppo", "grpo")
SECTIONS = ("ckpt", "logger", "eval", "ds", "fsdp", "train", "model", "data", "adam", "muon", "ref", "actor",
            "critic", "reward", "rollout", "vllm", "algo")
"""OpenRLHF's flag sections: a flag `--SECTION.name` is OpenRLHF's (coati's flags have no dots)."""
TOP_LEVEL = ("lr_warmup_ratio", "min_lr_ratio", "max_norm", "optim", "local_rank", "use_ms")
"""OpenRLHF's flags outside its sections that coati has not (its `--lr_scheduler` is coati's own)."""

Given = Mapping[str, List[str]]
Convert = Callable[[str, List[str], Given], List[str]]
"""(OpenRLHF's flag, its values, every OpenRLHF flag given with its values) -> coati's arguments."""


def _one(name: str, values: List[str]) -> str:
    if len(values) != 1:
        raise CoatiUsageError(f"--{name} takes one value, got {len(values)}")
    return values[0]


def _to(flag: str) -> Convert:
    """The same values under coati's `flag`."""
    return lambda name, values, given: [flag, *values] if values else _refuse_empty(name)


def _refuse_empty(name: str) -> List[str]:
    raise CoatiUsageError(f"--{name} needs a value")


def _switch(*arguments: str) -> Convert:
    """`arguments` for an OpenRLHF switch (a flag without a value)."""
    def convert(name: str, values: List[str], given: Given) -> List[str]:
        if values:
            raise CoatiUsageError(f"--{name} is a switch and takes no value, got {' '.join(values)}")
        return list(arguments)

    return convert


def _minus_one_off(flag: str) -> Convert:
    """OpenRLHF's -1 (never) is coati's 0."""
    return lambda name, values, given: [flag, "0" if _one(name, values) == "-1" else values[0]]


def _comma_list(flag: str) -> Convert:
    """OpenRLHF's comma-separated datasets as coati's list."""
    return lambda name, values, given: [flag, *(part for value in values for part in value.split(",") if part)]


def _named(flag: str, names: Mapping[str, str]) -> Convert:
    def convert(name: str, values: List[str], given: Given) -> List[str]:
        value = _one(name, values)
        if value not in names:
            raise CoatiUsageError(f"--{name} {value} has no counterpart here; coati takes {', '.join(names)}")
        return [flag, names[value]]

    return convert


def _at(default: str, why: str) -> Convert:
    """Taken at OpenRLHF's `default` only (coati runs as it does there); any other value is refused with `why`."""
    def convert(name: str, values: List[str], given: Given) -> List[str]:
        if values and not _same_values(values, default.split()):
            raise CoatiUsageError(f"--{name} {' '.join(values)}: {why} (taken at {default} only)")
        return []

    return convert


def _same_values(values: Sequence[str], default: Sequence[str]) -> bool:
    """Whether `values` are `default`, numbers compared as numbers (`0.0 1.0` is `0 1`)."""
    return len(values) == len(default) and all(
        float(a) == float(b) if is_number(a) and is_number(b) else a == b for a, b in zip(values, default))


def _refused(why: str) -> Convert:
    def convert(name: str, values: List[str], given: Given) -> List[str]:
        raise CoatiUsageError(f"--{name}: {why}")

    return convert


def _hidden(name: str, values: List[str], given: Given) -> List[str]:
    """A count converted after parsing (`convert_batches`), as the hidden flag `--openrlhf_<name>`."""
    return [f"--openrlhf_{name.replace('.', '_')}", _one(name, values)]


def _wandb_key(name: str, values: List[str], given: Given) -> List[str]:
    """W&B on, with OpenRLHF's key (True: `wandb login`'s) as WANDB_API_KEY, which the processes it starts inherit
    and no saved record holds (`redacted`)."""
    key = _one(name, values)
    if key.lower() != "true":
        os.environ["WANDB_API_KEY"] = key
    return ["--use_wandb"]


SECRET_FLAGS = ("--logger.wandb.key",)
"""OpenRLHF's flags whose value is a secret: a run's record of its command line leaves it out."""


def redacted(argv: Sequence[str]) -> List[str]:
    """`argv` with the values of `SECRET_FLAGS` hidden, for the run's record."""
    shown: List[str] = []
    for arg in argv:
        flag, equals, _ = arg.partition("=")
        secret = shown and shown[-1] in SECRET_FLAGS and not arg.startswith("--")
        shown.append(f"{flag}=***" if equals and flag in SECRET_FLAGS else "***" if secret else arg)
    return shown


def _zero_stage(name: str, values: List[str], given: Given) -> List[str]:
    """DeepSpeed's ZeRO stage as coati's plugin: 0 DDP, 1 and 2 zero2 (zero2_cpu with `--ds.adam_offload`), 3
    Gemini (which places parameters, gradients and optimizer states by chunks)."""
    stage = _one(name, values)
    plugins = {"0": "ddp", "1": "zero2", "2": "zero2", "3": "gemini"}
    if stage not in plugins:
        raise CoatiUsageError(f"--{name} {stage}: DeepSpeed's ZeRO stages are 0 to 3")
    plugin = plugins[stage]
    if "ds.adam_offload" in given and plugin == "zero2":
        plugin = "zero2_cpu"
    return ["--plugin", plugin]


def _adam_offload(name: str, values: List[str], given: Given) -> List[str]:
    """With OpenRLHF's default ZeRO stage 2: coati's zero2_cpu (`_zero_stage` reads it where a stage is given)."""
    return [] if "ds.zero_stage" in given else ["--plugin", "zero2_cpu"]


def _betas(name: str, values: List[str], given: Given) -> List[str]:
    if len(values) != 2:
        raise CoatiUsageError(f"--{name} takes two values (beta1 beta2), got {len(values)}")
    return ["--adam_beta1", values[0], "--adam_beta2", values[1]]


def _min_lr_ratio(name: str, values: List[str], given: Given) -> List[str]:
    return ["--lr_scheduler_option", f"min_lr_rate={_one(name, values)}"]


def _eps_clip(name: str, values: List[str], given: Given) -> List[str]:
    low_high = given.get("actor.eps_clip_low_high")
    if low_high:   # OpenRLHF's pair wins over the one bound
        return []
    value = _one(name, values)
    return ["--clip_eps_low", value, "--clip_eps_high", value]


def _eps_clip_low_high(name: str, values: List[str], given: Given) -> List[str]:
    if len(values) != 2:
        raise CoatiUsageError(f"--{name} takes two values (low high), got {len(values)}")
    return ["--clip_eps_low", values[0], "--clip_eps_high", values[1]]


def _remote_url(name: str, values: List[str], given: Given) -> List[str]:
    """OpenRLHF's remote reward model (coati's reward server speaks its protocol) or its `reward_func` file."""
    specs = [part for value in values for part in value.split(",") if part]
    return ["--reward_fn", *(spec if "://" in spec or not spec.endswith(".py") else f"{spec}:reward_func"
                             for spec in specs)]


def _estimator(command: str) -> Convert:
    """OpenRLHF's advantage estimator: GAE is PPO's (a critic), the others GRPO's (a group baseline, no critic)."""
    group = {"group_norm": ["--adv_estimator", "grpo"], "dr_grpo": ["--adv_estimator", "grpo", "--no_std_normalize"],
             "rloo": ["--adv_estimator", "rloo"], "reinforce": ["--adv_estimator", "reinforce_pp"],
             "reinforce_baseline": ["--adv_estimator", "reinforce_pp_baseline"]}

    def convert(name: str, values: List[str], given: Given) -> List[str]:
        value = _one(name, values)
        if value == "gae":
            if command != "ppo":
                raise CoatiUsageError(f"--{name} gae trains a critic: run it as coati ppo")
            return []
        if value not in group:
            raise CoatiUsageError(f"--{name} {value} has no counterpart here; coati takes gae, {', '.join(group)}")
        if command != "grpo":
            raise CoatiUsageError(f"--{name} {value} needs no critic: run it as coati grpo")
        return list(group[value])

    return convert


def _kl_use_loss(command: str) -> Convert:
    def convert(name: str, values: List[str], given: Given) -> List[str]:
        if command == "ppo":
            raise CoatiUsageError(f"--{name}: coati's PPO puts the KL to the reference in the reward; leave it out")
        return []

    return convert


def _kl_coef(command: str) -> Convert:
    """OpenRLHF's KL weight; for GRPO in the reward (`--kl_in_reward`), as OpenRLHF puts it without
    `--algo.kl.use_loss`."""
    def convert(name: str, values: List[str], given: Given) -> List[str]:
        value = _one(name, values)
        in_reward = command == "grpo" and "algo.kl.use_loss" not in given and is_number(value) and float(value) > 0
        return ["--kl_coef", value, *(["--kl_in_reward"] if in_reward else [])]

    return convert


def _is_correction(name: str, values: List[str], given: Given) -> List[str]:
    """OpenRLHF's correction of vLLM's log-probs: tis (coati's truncated, capped at the high threshold), icepop and
    seq-mask-tis (coati's sequence_masked), their band from `is_correction_threshold`."""
    kind = " ".join(given.get("algo.advantage.is_correction_type") or ["tis"])
    low, high = (given.get("algo.advantage.is_correction_threshold") or ["0.5", "5.0"])[:2]
    if kind == "tis":
        return ["--behaviour_correction", "truncated", "--behaviour_cap", high]
    corrections = {"icepop": "icepop", "seq-mask-tis": "sequence_masked"}
    if kind not in corrections:
        raise CoatiUsageError(f"--algo.advantage.is_correction_type {kind} has no counterpart here; coati takes tis, "
                              "icepop, seq-mask-tis")
    return ["--behaviour_correction", corrections[kind], "--behaviour_correction_option", f"low={low}", f"high={high}"]


def _overlong(name: str, values: List[str], given: Given) -> List[str]:
    return ["--reward_shaping", "overlong", "--overlong_buffer_len", str(int(float(_one(name, values))))]


def _vllm_engines(name: str, values: List[str], given: Given) -> List[str]:
    return ["--rollout_backend", "vllm"] if int(_one(name, values)) > 0 else []


COMMON: Dict[str, Convert] = {
    "ckpt.output_dir": _to("--output_dir"), "ckpt.path": _to("--save_dir"), "ckpt.max_num": _to("--keep_last"),
    "ckpt.save_steps": _minus_one_off("--save_interval"),
    "ckpt.load_enable": _switch("--checkpoint_path", "latest"),
    "logger.logging_steps": _to("--log_interval"), "logger.tensorboard_dir": _to("--log_dir"),
    "logger.wandb.key": _wandb_key,
    "logger.wandb.project": _to("--wandb_project"), "logger.wandb.run_name": _to("--run_name"),
    "eval.steps": _minus_one_off("--eval_interval"), "eval.dataset": _comma_list("--eval_dataset"),
    "eval.split": _at("train", "coati reads --eval_dataset's train split (or every JSONL file of its folder)"),
    "train.seed": _to("--seed"), "ds.zero_stage": _zero_stage, "ds.adam_offload": _adam_offload,
    "ds.param_dtype": _to("--mixed_precision"), "ds.packing_samples": _switch("--packing"),
    "ds.lora.rank": _to("--lora_rank"), "ds.lora.alpha": _to("--lora_alpha"), "ds.lora.dropout": _to("--lora_dropout"),
    "ds.lora.target_modules": _to("--lora_target_modules"),
    "ds.load_in_4bit": _refused("coati trains no 4-bit quantized model; leave it out (LoRA: --ds.lora.rank)"),
    "ds.tensor_parallel_size": _at("1", "coati's tensor parallelism is --plugin 3d --tp N"),
    "ds.ring_attn_size": _at("1", "coati's sequence parallelism is --plugin 3d --sp N"),
    "data.dataset_probs": _refused("coati trains on every row of each dataset given; mix them beforehand"),
    "data.input_template": _refused("coati tokenizes plain-text rows as they are (TRL's standard format) and rows of "
                                    "messages with the chat template: write the rows as messages, or as the text"),
    "data.tokenizer_chat_template": _refused("write the template to a file and give --chat_template FILE"),
    "adam.lr": _to("--lr"), "adam.betas": _betas, "adam.eps": _to("--adam_epsilon"),
    "adam.weight_decay": _to("--weight_decay"),
    "optim": _at("adam", "coati trains with AdamW"),
    "lr_warmup_ratio": _to("--warmup_ratio"), "min_lr_ratio": _min_lr_ratio, "max_norm": _to("--grad_clip"),
    "train.batch_size": _hidden,
    "use_ms": _refused("coati reads models from Hugging Face's hub or local folders, not ModelScope's"),
}
SUPERVISED: Dict[str, Convert] = {
    "model.model_name_or_path": _to("--pretrain"), "model.gradient_checkpointing_enable": _switch("--grad_checkpoint"),
    "model.aux_loss_coef": _at("0", "coati adds no MoE balancing loss"),
    "data.dataset": _comma_list("--dataset"), "data.dataset_split": _to("--dataset_train_split"),
    "data.max_len": _to("--max_length"), "train.micro_batch_size": _to("--batch_size"),
    "train.max_epochs": _to("--max_epochs"),
}
RM: Dict[str, Convert] = {
    "model.loss_type": _named("--loss_fn", {"sigmoid": "log_sig", "logexpwithlogit": "log_exp"}),
}
DPO: Dict[str, Convert] = {
    "model.beta": _to("--beta"), "model.ipo_enable": _switch("--loss_type", "ipo"),
    "model.label_smoothing": _to("--label_smoothing"), "model.nll_loss_coef": _to("--rpo_alpha"),
    "ref.model_name_or_path": _to("--ref_pretrain"),
}


def _on_policy(command: str) -> Dict[str, Convert]:
    table: Dict[str, Convert] = {
        "actor.model_name_or_path": _to("--pretrain"),
        "actor.gradient_checkpointing_enable": _switch("--grad_checkpoint"),
        "actor.adam.lr": _to("--lr"), "actor.adam.betas": _betas, "actor.adam.eps": _to("--adam_epsilon"),
        "actor.adam.weight_decay": _to("--weight_decay"), "actor.optim": _at("adam", "coati trains with AdamW"),
        "actor.lr_scheduler": _to("--lr_scheduler"), "actor.lr_warmup_ratio": _to("--warmup_ratio"),
        "actor.min_lr_ratio": _min_lr_ratio, "actor.aux_loss_coef": _at("0", "coati adds no MoE balancing loss"),
        "actor.eps_clip": _eps_clip, "actor.eps_clip_low_high": _eps_clip_low_high,
        "actor.dual_clip": lambda name, values, given: ["--policy_loss_option", f"dual_clip={_one(name, values)}"],
        "actor.max_norm": _to("--grad_clip"), "rollout.top_k": _to("--top_k"),
        "actor.entropy_coef": _to("--entropy_coef"),
        "actor.policy_loss_type": _named("--policy_loss", {"ppo": "ppo", "gspo": "gspo"}),
        "actor.freeze_visual_encoder": _switch("--freeze_vision_tower"),
        "reward.model_name_or_path": _to("--rm_pretrain"), "reward.remote_url": _remote_url,
        "reward.normalize_enable": _refused("OpenRLHF scales the reward model's scores by the mean and std its RM "
                                            "training stored, which coati's reward models do not keep; leave it out "
                                            "(coati whitens PPO's advantages, and GRPO's groups normalise theirs)"),
        "reward.stop_properly_penalty_coef": _refused("coati has no penalty for a truncated completion; "
                                                      "--mask_truncated_completions leaves them out of the loss"),
        "data.prompt_dataset": _comma_list("--prompt_dataset"), "data.prompt_split": _to("--dataset_train_split"),
        "data.prompt_probs": _refused("coati trains on every prompt of each dataset given; mix them beforehand"),
        "data.max_len": _hidden, "rollout.batch_size": _hidden, "rollout.max_new_tokens": _to("--max_new_tokens"),
        "rollout.micro_batch_size": _to("--logits_forward_batch_size"), "rollout.temperature": _to("--temperature"),
        "rollout.top_p": _to("--top_p"), "rollout.n_samples_per_prompt": _to("--num_generations"),
        "train.micro_batch_size": _to("--train_batch_size"),
        "train.max_epochs": _to("--num_update_steps"), "train.num_episodes": _to("--num_epochs"),
        "train.async_enable": _switch("--async_rollout"), "train.async_queue_size": _to("--max_staleness"),
        "train.partial_rollout_enable": _refused("coati's partial rollouts are --partial_rollout_tokens N, a "
                                                 "completion's tokens generated before each update"),
        "train.agent_func_path": _refused("coati's agents are --agent (an OpenAI-client agent) or --tools"),
        "train.enable_ema": _refused("coati keeps no moving average of the weights"),
        "algo.advantage.estimator": _estimator(command), "algo.kl.init_coef": _kl_coef(command),
        "algo.kl.target": _to("--kl_target"), "algo.kl.horizon": _to("--kl_horizon"),
        "algo.kl.estimator": _to("--kl_estimator"), "algo.kl.use_loss": _kl_use_loss(command),
        "algo.advantage.is_correction_enable": _is_correction,
        "algo.dynamic_filtering_range": _at("0 1", "coati's dynamic sampling replaces groups whose rewards all tie"),
        "vllm.num_engines": _vllm_engines, "vllm.gpu_memory_utilization": _to("--vllm_gpu_memory_utilization"),
        "vllm.enforce_eager": _switch("--vllm_enforce_eager"),
        "eval.temperature": _to("--eval_temperature"), "eval.n_samples_per_prompt": _to("--eval_n_samples"),
    }
    if command == "ppo":
        table.update({
            "critic.model_name_or_path": _to("--critic_pretrain"), "critic.adam.lr": _to("--critic_lr"),
            "critic.value_clip": _to("--value_clip"), "critic.freezing_steps": _to("--critic_warmup_episodes"),
            "algo.advantage.lambd": _to("--lam"), "algo.advantage.gamma": _to("--gamma"),
            "algo.advantage.no_std_norm": _switch("--no_whiten_advantages"),
            "reward.overlong_buffer_len": _refused("coati's overlong penalty is GRPO's (--reward_shaping overlong)"),
        })
    else:
        table.update({
            "algo.advantage.no_std_norm": _switch("--no_std_normalize"),
            "algo.dynamic_filtering_enable": _switch("--dynamic_sampling"),
            "reward.overlong_buffer_len": _overlong, "reward.overlong_penalty_factor": _to("--overlong_penalty_factor"),
        })
    return table


NOT_USED = {
    "ds.": "DeepSpeed's engine (coati's is the plugin's)", "fsdp.": "FSDP's engine (coati's is the plugin's)",
    "vllm.": "vLLM's placement and engine settings",
    "ckpt.save_hf": "coati writes the model as a Hugging Face folder always",
    "ckpt.disable_ds": "DeepSpeed's checkpoints (coati's are the booster's)", "ckpt.max_mem": "DeepSpeed's checkpoints",
    "ds.use_universal_ckpt": "DeepSpeed's checkpoints (coati's resume on another number of processes as they are)",
    "logger.wandb.org": "W&B's entity is the logged-in user's default",
    "logger.wandb.group": "coati groups no W&B runs", "local_rank": "DeepSpeed's launcher sets it",
    "data.max_samples": "coati trains on every row", "data.disable_fast_tokenizer": "coati loads the fast tokenizer",
    "data.dataloader_num_workers": "coati's data is prepared beforehand and read in the training process",
    "data.apply_chat_template": "coati applies the chat template to rows of messages (plain-text rows are tokenized "
                                "as they are, TRL's standard format)",
    "data.multiturn": "coati trains every assistant turn of a conversation",
    "model.gradient_checkpointing_reentrant": "coati's gradient checkpointing is the model's own",
    "actor.gradient_checkpointing_reentrant": "coati's gradient checkpointing is the model's own",
    "model.compute_fp32_loss_enable": "coati computes the loss in fp32",
    "model.margin_loss_enable": "coati subtracts a row's margin column wherever the data has one",
    "ds.value_head_prefix": "coati's reward model's head is the sequence classifier's own (score)",
    "train.full_determinism_enable": "coati seeds every RNG (--seed)",
    "ref.": "coati holds the reference in each process",
    "reward.offload": "coati holds the reward model in each process",
    "reward.num_nodes": "coati places every model in each process", "reward.num_gpus_per_node": "coati places every "
    "model in each process", "critic.num_nodes": "coati places every model in each process",
    "critic.num_gpus_per_node": "coati places every model in each process",
    "train.colocate_all": "coati places every model in each process",
    "train.colocate_actor_ref": "coati places every model in each process",
    "train.colocate_critic_reward": "coati places every model in each process",
    "actor.num_nodes": "", "actor.num_gpus_per_node": "",
    "train.dynamic_batch_enable": "coati's micro-batches are rows (--packing with --max_tokens_per_batch fills them by "
                                  "tokens)",
    "train.max_tokens_per_gpu": "coati's micro-batches are rows (--max_tokens_per_batch fills packed ones by tokens)",
    "rollout.max_tokens_per_gpu": "coati generates --batch_size prompts at once",
    "rollout.vllm_generate_batch_size": "coati generates --batch_size prompts at once",
    "reward.clip_range": "coati does not clip rewards", "critic.save_value_network": "coati saves the critic in its "
    "checkpoints", "ckpt.best_metric_key": "coati's best model is --save_best METRIC",
    "algo.advantage.is_correction_type": "", "algo.advantage.is_correction_threshold": "",
    "data.image_key": "", "data.max_images_per_prompt": "coati takes every image of a row",
    "muon.": "Muon is not coati's optimizer (AdamW)",
    "data.input_key": "", "data.output_key": "", "data.label_key": "", "data.chosen_key": "",
    "data.rejected_key": "", "data.prompt_key": "", "model.pretrain_mode_enable": "",
    "critic.": "coati's critic trains with the actor's settings but --critic_lr",
    "train.ema_beta": "coati keeps no moving average of the weights",
}
"""OpenRLHF's flags (or, ending in a dot, sections) that change nothing here, with why; '' where another flag's
conversion reads them (`is_correction_type` with `is_correction_enable`, the data's keys in `--dataset_columns`)."""


def _table(command: str) -> Dict[str, Convert]:
    table = dict(COMMON)
    if command in ON_POLICY:
        table.update(_on_policy(command))
    else:
        table.update(SUPERVISED)
        table.update({"rm": RM, "dpo": DPO}.get(command, {}))
    return table


def is_openrlhf_flag(arg: str) -> bool:
    """Whether `arg` is an OpenRLHF flag: `--SECTION.name` of one of its sections, or one of `TOP_LEVEL`."""
    name = arg[2:].partition("=")[0] if arg.startswith("--") else ""
    return name.split(".")[0] in SECTIONS and "." in name or name in TOP_LEVEL


def _given(argv: Sequence[str]) -> Tuple[Dict[str, List[str]], List[str]]:
    """(OpenRLHF's flags in `argv` with their values: the arguments up to the next flag; the other arguments)."""
    given: Dict[str, List[str]] = {}
    rest: List[str] = []
    current: Optional[List[str]] = None
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            current = None
            if is_openrlhf_flag(arg):
                name, equals, value = arg[2:].partition("=")
                if name in given:
                    raise CoatiUsageError(f"--{name} is given twice; keep one")
                current = given[name] = [value] if equals else []
                continue
        elif current is not None and not (arg.startswith("-") and not is_number(arg)):
            current.append(arg)
            continue
        current = None
        rest.append(arg)
    return given, rest


def dataset_columns(command: str, given: Given) -> Dict[str, str]:
    """OpenRLHF's keys naming the data's columns -> coati's `--dataset_columns` (OpenRLHF's column: coati's name):
    SFT's input and output (a conversation's `messages` without an output key, `text` in pretrain mode), the
    preference data's prompt, chosen and rejected, the prompts' input, label (`OpenRLHFReward`'s `labels`) and
    images."""
    def column(key: str) -> Optional[str]:
        return _one(key, given[key]) if key in given else None

    if command == "sft":
        output = column("data.output_key")
        whole = "text" if "model.pretrain_mode_enable" in given else "messages"
        names = {"data.input_key": "prompt" if output else whole, "data.output_key": "completion"}
    elif command in ON_POLICY:
        names = {"data.input_key": "prompt", "data.label_key": "label", "data.image_key": "images"}
    else:
        names = {"data.prompt_key": "prompt", "data.chosen_key": "chosen", "data.rejected_key": "rejected"}
    return {column(key): name for key, name in names.items() if column(key) not in (None, name)}


def openrlhf_flags(command: str, argv: Sequence[str]) -> Tuple[List[str], List[str], Dict[str, str], Dict[str, str]]:
    """(coati's arguments for OpenRLHF's flags in `argv`, the other arguments, coati's flag -> the OpenRLHF flag it
    came from, OpenRLHF's flags that change nothing here -> why). Every flag coati cannot honour, or that OpenRLHF
    has not, is refused in one line, all of them named."""
    given, rest = _given(argv) if command in OPENRLHF_COMMANDS else ({}, list(argv))
    if not given:
        return [], rest, {}, {}
    table, converted, origins, unused, problems = _table(command), [], {}, {}, []
    vllm = given.get("vllm.num_engines") not in (None, ["0"])
    for name, values in given.items():
        if name.startswith("vllm.") and name != "vllm.num_engines" and not vllm:
            unused[f"--{name}"] = "no vLLM engine (--vllm.num_engines 0): the rollouts are generated by the trainer"
        elif name in table:
            try:
                arguments = table[name](name, values, given)
            except CoatiUsageError as error:
                problems.append(str(error))
                continue
            converted += arguments
            origins.update({arg: f"--{name}" for arg in arguments if arg.startswith("--")})
        elif (reason := _reason(name, command)) is not None:
            if reason:
                unused[f"--{name}"] = reason
        else:
            problems.append(f"--{name}: no OpenRLHF flag coati reads for coati {command}{_nearest(name, table)}")
    folder = _checkpoint_folder(command, given)
    if folder:
        converted += ["--save_dir", folder]
        origins["--save_dir"] = "--ckpt.path"
    columns = dataset_columns(command, given)
    if columns:
        converted += ["--dataset_columns", *(f"{old}={new}" for old, new in columns.items())]
        origins["--dataset_columns"] = next(f"--{key}" for key in given
                                            if key.startswith("data.") and key.endswith("_key"))
    if problems:
        raise CoatiUsageError("; ".join(problems))
    return [*converted, "--openrlhf_flags", *sorted(given)], rest, origins, unused


CHECKPOINT_FOLDERS = {"sft": "sft", "rm": "rm", "dpo": "dpo", "ppo": "ppo_ray", "grpo": "ppo_ray"}
"""OpenRLHF's `--ckpt.path` default, ./ckpt/checkpoints_<script>, by coati's command."""


def _checkpoint_folder(command: str, given: Given) -> Optional[str]:
    """OpenRLHF's default checkpoint folder, where a run saves or resumes checkpoints (`--ckpt.save_steps`,
    `--ckpt.load_enable`) without naming one."""
    saves = given.get("ckpt.save_steps") not in (None, ["-1"]) or "ckpt.load_enable" in given
    return f"./ckpt/checkpoints_{CHECKPOINT_FOLDERS[command]}" if saves and "ckpt.path" not in given else None


def _reason(name: str, command: str) -> Optional[str]:
    """Why OpenRLHF's `name` changes nothing here ('' where another flag's conversion reads it), or None."""
    if command == "grpo" and name.startswith("critic."):
        return "GRPO trains no critic (OpenRLHF's estimators but gae drop it too)"
    if name in NOT_USED:
        return NOT_USED[name]
    return next((why for prefix, why in NOT_USED.items() if prefix.endswith(".") and name.startswith(prefix)), None)


def _nearest(name: str, table: Mapping[str, Convert]) -> str:
    close = difflib.get_close_matches(name, [*table, *(key for key in NOT_USED if not key.endswith("."))], n=2,
                                      cutoff=0.8)
    return (f" (did you mean {' or '.join('--' + key for key in close)}?)" if close else
            " (docs/migration/openrlhf.md lists the OpenRLHF flags coati takes)")


OLDER_FLAGS = {
    "reward_pretrain": "reward.model_name_or_path", "ckpt_path": "ckpt.path", "micro_train_batch_size":
    "train.micro_batch_size", "micro_rollout_batch_size": "rollout.micro_batch_size", "rollout_batch_size":
    "rollout.batch_size", "prompt_max_len": "data.max_len", "generate_max_len": "rollout.max_new_tokens",
    "max_samples": "data.max_samples", "actor_learning_rate": "actor.adam.lr", "critic_learning_rate":
    "critic.adam.lr", "init_kl_coef": "algo.kl.init_coef", "prompt_data": "data.prompt_dataset", "input_key":
    "data.input_key", "output_key": "data.output_key", "label_key": "data.label_key", "apply_chat_template":
    "data.apply_chat_template", "normalize_reward": "reward.normalize_enable", "packing_samples": "ds.packing_samples",
    "adam_offload": "ds.adam_offload", "flash_attn": "ds.attn_implementation", "n_samples_per_prompt":
    "rollout.n_samples_per_prompt", "advantage_estimator": "algo.advantage.estimator", "use_kl_loss":
    "algo.kl.use_loss", "remote_rm_url": "reward.remote_url", "vllm_num_engines": "vllm.num_engines",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size", "colocate_all_models": "train.colocate_all",
    "eps_clip": "actor.eps_clip", "lambd": "algo.advantage.lambd", "wandb_run_name": "logger.wandb.run_name",
    "use_tensorboard": "logger.tensorboard_dir", "dataset_probs": "data.dataset_probs", "chosen_key":
    "data.chosen_key", "rejected_key": "data.rejected_key", "prompt_key": "data.prompt_key", "l2": "adam.weight_decay",
    "load_checkpoint": "ckpt.load_enable", "max_ckpt_num": "ckpt.max_num", "dynamic_filtering":
    "algo.dynamic_filtering_enable", "entropy_loss_coef": "actor.entropy_coef", "pretrain_mode":
    "model.pretrain_mode_enable", "nll_loss_coef": "model.nll_loss_coef", "ipo": "model.ipo_enable", "aux_loss_coef":
    "model.aux_loss_coef", "actor_num_gpus_per_node": "actor.num_gpus_per_node", "actor_num_nodes": "actor.num_nodes",
    "agent_func_path": "train.agent_func_path", "save_hf_ckpt": "ckpt.save_hf", "disable_ds_ckpt": "ckpt.disable_ds",
}
"""OpenRLHF's flags before it named them by section (which coati's flags do not spell) -> their current names, for
the unknown-flag error."""
LAUNCH_FLAGS = {"actor.num_gpus_per_node": "--nproc_per_node", "actor.num_nodes": "--nnodes"}
"""OpenRLHF's flags that say how many training processes to start: the `coati` command's launch flags."""


def openrlhf_launch(command: str, argv: Sequence[str]) -> Dict[str, str]:
    """The launch flags that OpenRLHF's `--actor.num_gpus_per_node` and `--actor.num_nodes` give in `argv`, for an
    on-policy `command`."""
    if command not in ON_POLICY:
        return {}
    given, _ = _given(argv)
    return {flag: _one(name, given[name]) for name, flag in LAUNCH_FLAGS.items() if given.get(name)}


def add_openrlhf_names(parser: argparse.ArgumentParser, command: str) -> None:
    """The hidden flags OpenRLHF's counts go as (`--openrlhf_<flag>`, and the OpenRLHF flags given,
    `--openrlhf_flags`), and their conversion after parsing, for the processes the run has."""
    from coati.cli.options import add_post_parse
    from coati.distributed.launch import launched_world_size

    group = parser.add_argument_group("OpenRLHF's names (--section.name; see coati.cli.openrlhf_names)")
    for name in ("train_batch_size", "rollout_batch_size", "data_max_len"):
        group.add_argument(f"--openrlhf_{name}", dest=f"openrlhf_{name}", type=int, default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
    group.add_argument("--openrlhf_flags", nargs="+", action="extend", default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)

    def after_parse(args: argparse.Namespace) -> None:
        given, world_size = getattr(parser, "given", {}), launched_world_size()
        if command in ON_POLICY:
            convert_lengths(args, given)
            convert_rollout_batches(args, world_size, given)
        else:
            convert_batches(args, world_size, given)
        flags = take_hidden(args, "openrlhf_flags") or []
        take_min_lr_ratio(args, flags)
        note_other_defaults(args, flags, given, command)

    add_post_parse(parser, after_parse)


def _refuse_both(given: Mapping[str, str], flags: Sequence[str], openrlhf: str) -> None:
    for flag in flags:
        if flag in given:
            raise CoatiUsageError(f"{given[flag]} and OpenRLHF's {openrlhf} both set the batches; give one")


def convert_batches(args: argparse.Namespace, world_size: int, given: Mapping[str, str]) -> None:
    """SFT, RM and DPO: OpenRLHF's `--train.batch_size` (rows an optimizer step over every GPU) -> coati's
    `--accumulation_steps`, micro-batches of `--train.micro_batch_size` rows a process (`--batch_size`); it must
    divide."""
    overall = take_hidden(args, "openrlhf_train_batch_size")
    if overall is None:
        return
    _refuse_both(given, ("accumulation_steps",), "--train.batch_size")
    step = args.batch_size * world_size
    if overall % step:
        raise CoatiUsageError(f"--train.batch_size {overall} is not a whole number of micro-batches: "
                              f"--train.micro_batch_size {args.batch_size} x {world_size} processes = {step} rows")
    args.accumulation_steps = overall // step


def convert_lengths(args: argparse.Namespace, given: Mapping[str, str]) -> None:
    """PPO and GRPO: OpenRLHF's `--data.max_len` bounds prompt and completion together -> `--max_length` (the prompt)
    = it less `--max_new_tokens` (OpenRLHF's `--rollout.max_new_tokens`; half of it where not given)."""
    total = take_hidden(args, "openrlhf_data_max_len")
    if total is None:
        return
    if "max_new_tokens" not in given:
        args.max_new_tokens = max(1, total // 2)
        note_user(f"--data.max_len {total} without --rollout.max_new_tokens: completions of up to "
                  f"{args.max_new_tokens} tokens after prompts of up to {total - args.max_new_tokens} (coati bounds "
                  "the two apart; OpenRLHF gives each completion what its prompt leaves)")
    if args.max_new_tokens >= total:
        raise CoatiUsageError(f"--rollout.max_new_tokens {args.max_new_tokens} leaves no room for the prompt within "
                              f"--data.max_len {total}")
    args.max_length = total - args.max_new_tokens


def convert_rollout_batches(args: argparse.Namespace, world_size: int, given: Mapping[str, str]) -> None:
    """PPO and GRPO: OpenRLHF's `--rollout.batch_size` (prompts a rollout over every GPU) -> `--batch_size` a
    process; its `--train.batch_size` (samples an optimizer step over every GPU) -> `--accumulation_steps` of
    `--train.micro_batch_size` samples a process (`--train_batch_size`); each must divide."""
    prompts, samples = take_hidden(args, "openrlhf_rollout_batch_size"), take_hidden(args, "openrlhf_train_batch_size")
    if prompts is not None:
        _refuse_both(given, ("batch_size",), "--rollout.batch_size")
        if prompts % world_size:
            raise CoatiUsageError(f"--rollout.batch_size {prompts} prompts is not a whole number for each of the "
                                  f"{world_size} processes; make it a multiple of {world_size}")
        args.batch_size = prompts // world_size
    if samples is None:
        return
    _refuse_both(given, ("accumulation_steps",), "--train.batch_size")
    rollout = args.batch_size * world_size * args.num_generations
    if rollout % samples or samples % world_size:
        raise CoatiUsageError(f"--train.batch_size {samples} does not split the {rollout} samples of a rollout "
                              f"(--rollout.batch_size x --rollout.n_samples_per_prompt) into whole optimizer steps "
                              f"over {world_size} processes")
    per_process = samples // world_size
    if per_process % args.train_batch_size:
        raise CoatiUsageError(f"--train.micro_batch_size {args.train_batch_size} does not divide the {per_process} "
                              f"samples of an optimizer step on each process (--train.batch_size {samples} / "
                              f"{world_size} processes)")
    args.accumulation_steps = per_process // args.train_batch_size


_SUPERVISED_DEFAULTS = {"warmup_ratio": ("lr_warmup_ratio", 0.03), "adam_beta2": ("adam.betas", 0.95)}
_ON_POLICY_DEFAULTS = {"lr": ("actor.adam.lr", 1e-6), "kl_coef": ("algo.kl.init_coef", 0.01),
                       "warmup_ratio": ("actor.lr_warmup_ratio", 0.03), "adam_beta2": ("actor.adam.betas", 0.95)}
OTHER_DEFAULTS = {
    "sft": {"lr": ("adam.lr", 5e-6), "max_epochs": ("train.max_epochs", 2), **_SUPERVISED_DEFAULTS},
    "rm": {"lr": ("adam.lr", 9e-6), **_SUPERVISED_DEFAULTS},
    "dpo": {"lr": ("adam.lr", 1e-5), **_SUPERVISED_DEFAULTS},
    "ppo": {**_ON_POLICY_DEFAULTS, "critic_lr": ("critic.adam.lr", 9e-6), "value_clip": ("critic.value_clip", 0.5),
            "lam": ("algo.advantage.lambd", 1.0)},
    "grpo": _ON_POLICY_DEFAULTS,
}
"""coati's settings whose default is not OpenRLHF's, by command: (OpenRLHF's flag, its default), said in a note where
a run in OpenRLHF's flags leaves them out. Its schedule too: cosine to a tenth of the peak (`cosine_with_min_lr`)."""
MIN_LR_RATIO = 0.1
"""OpenRLHF's `--min_lr_ratio` default: where its cosine_with_min_lr schedule ends, as a fraction of the peak."""


def take_min_lr_ratio(args: argparse.Namespace, flags: Sequence[str]) -> None:
    """A run in OpenRLHF's flags on `cosine_with_min_lr` without its floor ends at OpenRLHF's (`MIN_LR_RATIO`)."""
    options = dict(args.lr_scheduler_option)
    if flags and args.lr_scheduler == "cosine_with_min_lr" and not {"min_lr", "min_lr_rate"} & set(options):
        args.lr_scheduler_option = [*options.items(), ("min_lr_rate", MIN_LR_RATIO)]
        note_user(f"--lr_scheduler cosine_with_min_lr ends at OpenRLHF's --min_lr_ratio default, {MIN_LR_RATIO} of "
                  "the peak")


def note_other_defaults(args: argparse.Namespace, flags: Sequence[str], given: Mapping[str, str], command: str) -> None:
    """One note, for a run given in OpenRLHF's flags, naming the settings it leaves at coati's default where
    OpenRLHF's differs, with both values."""
    if not flags:
        return
    def here(name: str) -> str:
        value = getattr(args, name)
        return f"--{name} {value}" if value is not None else f"--{name} unset: --lr"

    differ = [f"--{flag} (OpenRLHF {default}, here {here(name)})"
              for name, (flag, default) in OTHER_DEFAULTS[command].items()
              if flag not in flags and name not in given and getattr(args, name, default) != default]
    scheduler = "actor.lr_scheduler" if command in ON_POLICY else "lr_scheduler"
    if "lr_scheduler" not in given and args.lr_scheduler != "cosine_with_min_lr":
        differ.append(f"--{scheduler} (OpenRLHF cosine_with_min_lr to a tenth of the peak, here {args.lr_scheduler})")
    if differ:
        note_user(f"coati's defaults where OpenRLHF's differ, for what this run does not give: {'; '.join(differ)}")
