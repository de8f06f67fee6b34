"""Every flag of ColossalChat's training and data-preparation scripts, run through coati's scripts: accepted
with its meaning, or refused with one line naming what to use instead; and what the accepted ones do."""
import importlib.util
import json

import pytest
import torch

from coati.cli.commands import preference_loss
from coati.dataset import load_prepared
from coati.dataset.collators import PreferenceCollator, SupervisedCollator
from coati.models.tiny import END_OF_TURN
from coati.models.loss import DPOLoss, KTOLoss
from coati.trainer.kto import balance_kto_weights
from conftest import REPO, parsed_args

COLOSSALCHAT_FLAGS = {
    "sft": "--accumulation_steps --batch_size --checkpoint_path --config_file --dataset --disable_loss_mask "
           "--enable_sequence_parallelism --eval_dataset --grad_checkpoint --grad_clip --log_dir --lora_config --lr "
           "--max_epochs --max_len --microbatch_size --mixed_precision --plugin --pp --pretrain --save_interval "
           "--save_path --sp --sp_mode --tokenizer_dir --tp --use_flash_attn --use_wandb --warmup_steps "
           "--weight_decay --zero_cpu_offload --zero_stage",
    "rm": "--accumulation_steps --batch_size --checkpoint_path --config_file --dataset --enable_sequence_parallelism "
          "--eval_dataset --grad_checkpoint --grad_clip --log_dir --lora_config --loss_fn --lr --max_epochs "
          "--max_length --mixed_precision --plugin --pp --pretrain --save_dir --save_interval --sp --sp_mode "
          "--tokenizer_dir --tp --use_flash_attn --use_wandb --warmup_steps --weight_decay --zero_cpu_offload --zero_stage",
    "dpo": "--accumulation_steps --batch_size --beta --checkpoint_path --config_file --dataset --disable_loss_mask "
           "--disable_reference_model --enable_sequence_parallelism --eval_dataset --gamma --grad_checkpoint "
           "--grad_clip --length_normalization --log_dir --lora_config --loss_type --lr --max_epochs --max_length "
           "--microbatch_size --mixed_precision --model_type --plugin --pp --pretrain --ref_tp --save_dir "
           "--save_interval --sp --sp_mode --tokenizer_dir --tp --use_flash_attn --use_wandb --warmup_steps "
           "--weight_decay --zero_cpu_offload --zero_stage",
    "kto": "--accumulation_steps --auto_weight --batch_size --beta --checkpoint_path --config_file --dataset "
           "--desirable_weight --disable_loss_mask --enable_sequence_parallelism --eval_dataset --grad_checkpoint "
           "--grad_clip --log_dir --lora_config --lr --max_epochs --max_length --mixed_precision --plugin --pp "
           "--pretrain --save_dir --save_interval --sp --sp_mode --tokenizer_dir --tp --undesirable_weight "
           "--use_flash_attn --use_wandb --warmup_steps --weight_decay --zero_cpu_offload --zero_stage",
    "orpo": "--accumulation_steps --batch_size --checkpoint_path --config_file --dataset --disable_loss_mask "
            "--disable_reference_model --enable_sequence_parallelism --eval_dataset --grad_checkpoint --grad_clip "
            "--lam --log_dir --lora_config --lr --max_epochs --max_length --mixed_precision --model_type --plugin "
            "--pp --pretrain --save_dir --save_interval --sp --sp_mode --tokenizer_dir --tp --use_flash_attn "
            "--use_wandb --warmup_steps --weight_decay --zero_cpu_offload --zero_stage",
    "ppo": "--accumulation_steps --checkpoint_path --conversation_template_config --critic_checkpoint_path "
           "--critic_lr --disable_loss_mask --enable_sequence_parallelism --experience_batch_size --grad_checkpoint "
           "--grad_clip --kl_coef --log_dir --lora_config --lr --max_length --max_seq_len --mixed_precision "
           "--no_neural_reward_model --num_collect_steps --num_episodes --num_update_steps --plugin --pp --pretrain "
           "--prompt_dataset --ptx_batch_size --ptx_coef --ptx_dataset --reward_functions --rm_checkpoint_path "
           "--rm_pretrain --save_interval --save_path --sp --sp_mode --tokenizer_dir --tp --train_batch_size "
           "--use_flash_attn --use_wandb --warmup_steps --weight_decay --zero_cpu_offload --zero_stage",
    "grpo": "--accumulation_steps --checkpoint_path --conversation_template_config --disable_loss_mask "
            "--enable_sequence_parallelism --experience_batch_size --final_temperature --grad_checkpoint --grad_clip "
            "--inference_batch_size --initial_temperature --kl_coef --log_dir --logits_forward_batch_size "
            "--lora_config --lr --max_length --max_seq_len --max_tokens_thinking --mixed_precision "
            "--num_collect_steps --num_episodes --num_generations --num_update_steps --plugin --pp --pretrain "
            "--prompt_dataset --ptx_batch_size --ptx_coef --ptx_dataset --reward_functions --rm_checkpoint_path "
            "--rm_pretrain --save_interval --save_path --sp --sp_mode --tokenizer_dir --tp --train_batch_size "
            "--use_flash_attn --use_wandb --warmup_steps --weight_decay --zero_cpu_offload --zero_stage",
}
"""ColossalChat's examples/training_scripts/train_<name>.py flags (hpcaitech/ColossalAI, applications/ColossalChat)."""

SWITCHES = {"--disable_loss_mask", "--enable_sequence_parallelism", "--grad_checkpoint", "--use_flash_attn",
            "--use_wandb", "--zero_cpu_offload", "--disable_reference_model", "--length_normalization",
            "--auto_weight", "--no_neural_reward_model"}
VALUES = {"--loss_fn": "log_sig", "--loss_type": "sigmoid", "--mixed_precision": "bf16", "--plugin": "3d",
          "--sp_mode": "split_gather", "--zero_stage": "1", "--reward_functions": "gsm8k_reward_fn",
          "--lr": "1e-5", "--critic_lr": "1e-5", "--grad_clip": "1.0", "--weight_decay": "0.0", "--beta": "0.1",
          "--gamma": "0.0", "--lam": "0.1", "--kl_coef": "0.1", "--ptx_coef": "0.0", "--desirable_weight": "1.0",
          "--undesirable_weight": "1.0", "--initial_temperature": "1.0", "--final_temperature": "0.9",
          "--ref_tp": "1", "--tp": "1", "--pp": "1", "--sp": "1"}
PATHS = {"--pretrain", "--tokenizer_dir", "--dataset", "--eval_dataset", "--prompt_dataset", "--ptx_dataset",
         "--checkpoint_path", "--critic_checkpoint_path", "--rm_checkpoint_path", "--rm_pretrain", "--log_dir",
         "--save_dir", "--save_path", "--config_file", "--model_type"}
REQUIRED = {"sft": ["--pretrain", "m", "--dataset", "d"],
            "ppo": ["--pretrain", "m", "--prompt_dataset", "d", "--rm_pretrain", "rm"],
            "grpo": ["--pretrain", "m", "--prompt_dataset", "d", "--reward_functions", "gsm8k_reward_fn"]}
"""Each script's required flags (the supervised ones share sft's); ColossalChat's PPO and GRPO, like coati's, need a
reward."""


def _parse(name: str, argv, monkeypatch):
    """The args `train_<name>.py` would run with (`parsed_args`)."""
    return parsed_args(name, argv, monkeypatch)


def _value(flag: str, files: dict) -> list:
    if flag in SWITCHES:
        return [flag]
    if flag in files:
        return [flag, str(files[flag])]
    if flag in PATHS:
        return [flag, "some_path"]
    return [flag, VALUES.get(flag, "2")]


@pytest.fixture
def files(tmp_path):
    lora = tmp_path / "lora.json"
    lora.write_text(json.dumps({"r": 8, "lora_alpha": 32, "linear_lora_dropout": 0.05, "lora_train_bias": "none"}))
    template = tmp_path / "template.json"
    template.write_text(json.dumps({"chat_template": "{{ messages }}", "stop_ids": [7, 9]}))
    return {"--lora_config": lora, "--conversation_template_config": template}


@pytest.mark.parametrize("name", sorted(COLOSSALCHAT_FLAGS))
def test_every_colossalchat_flag_is_accepted_or_refused_naming_what_to_use(name, files, monkeypatch, capsys):
    base = REQUIRED.get(name, REQUIRED["sft"])
    accepted, refused = [], []
    for flag in COLOSSALCHAT_FLAGS[name].split():
        argv = [*base, *_value(flag, files)]
        if flag in ("--enable_sequence_parallelism", "--sp_mode", "--zero_stage"):
            argv += ["--plugin", "3d"]
        if flag == "--no_neural_reward_model":
            argv += ["--reward_fn", "math_answer"]
        try:
            _parse(name, argv, monkeypatch)
            accepted.append(flag)
        except SystemExit as exit_:
            message = capsys.readouterr().err.strip().splitlines()[-1]
            assert exit_.code == 2 and f"error: {flag} is ColossalChat's and coati does not take it: " in message, message
            assert len(message.split("does not take it: ")[1]) > 20, message          # it says what to use
            refused.append(flag)
    assert accepted and len(accepted) + len(refused) == len(COLOSSALCHAT_FLAGS[name].split())


def test_a_colossalchat_sft_command_line_means_the_same_here(files, monkeypatch, tmp_path):
    args = _parse("sft", ["--pretrain", "m", "--dataset", "d", "--save_path", str(tmp_path / "out"), "--max_len", "256",
                          "--lora_config", str(files["--lora_config"]), "--disable_loss_mask", "--max_epochs", "2"],
                  monkeypatch)
    assert args.save_dir == str(tmp_path / "out") and args.output_dir is None and args.max_length == 256
    assert (args.lora_rank, args.lora_alpha, args.lora_dropout) == (8, 32, 0.05) and args.disable_loss_mask


def test_colossalchat_rl_flags_map_to_ours(files, monkeypatch):
    args = _parse("grpo", ["--pretrain", "m", "--prompt_dataset", "d", "--experience_batch_size", "3", "--max_seq_len",
                           "40", "--reward_functions", "gsm8k_reward_fn", "--conversation_template_config",
                           str(files["--conversation_template_config"]), "--train_batch_size", "4",
                           "--accumulation_steps", "2"], monkeypatch)
    assert (args.batch_size, args.max_new_tokens, args.train_batch_size, args.accumulation_steps) == (3, 40, 4, 2)
    assert args.reward_fn == ["math_answer", "answer_format"] and args.extra_stop_ids == [7, 9]


@pytest.mark.parametrize("argv, message", [
    (["--enable_sequence_parallelism"], "--enable_sequence_parallelism needs --plugin 3d"),
    (["--ref_tp", "2"], "--ref_tp 2: coati shards the reference model like the policy"),
    (["--lora_config", "BAD"], "--lora_config"),
])
def test_colossalchat_values_coati_cannot_honour_are_refused(argv, message, monkeypatch, capsys, tmp_path):
    if "BAD" in argv:
        bad = tmp_path / "lora.json"
        bad.write_text(json.dumps({"r": 4, "lora_train_bias": "some"}))
        argv = ["--lora_config", str(bad)]
        message = "lora_train_bias='some': expected one of none, all, lora"
    with pytest.raises(SystemExit) as exit_:
        _parse("dpo", ["--pretrain", "m", "--dataset", "d", *argv], monkeypatch)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_disable_loss_mask_makes_every_token_a_label():
    rows = [{"input_ids": [5, 6, 7], "labels": [-100, -100, 7]}]
    assert SupervisedCollator(0)(rows)["labels"].tolist() == [[-100, -100, 7]]
    assert SupervisedCollator(0, loss_on_every_token=True)(rows)["labels"].tolist() == [[5, 6, 7]]
    pair = [{"chosen_input_ids": [1, 2], "chosen_labels": [-100, 2], "rejected_input_ids": [1, 3],
             "rejected_labels": [-100, 3]}]
    batch = PreferenceCollator(0, loss_on_every_token=True)(pair)
    assert batch["chosen_labels"].tolist() == [[1, 2]] and batch["rejected_labels"].tolist() == [[1, 3]]


def test_reference_free_and_length_normalised_dpo():
    loss = DPOLoss(beta=0.5, reference_free=True, length_normalization=True)
    assert not loss.needs_reference and loss.length_normalized
    out = loss(torch.tensor([-1.0]), torch.tensor([-3.0]))                  # references taken as 0
    assert out.losses.item() == pytest.approx(-torch.nn.functional.logsigmoid(torch.tensor(0.5 * 2.0)).item())


def test_auto_weight_brings_the_weighted_ratio_into_bounds():
    loss = KTOLoss(desirable_weight=1.0, undesirable_weight=1.0)
    assert balance_kto_weights(loss, [True] * 3 + [False] * 1) == pytest.approx(1 / 3)   # ratio 3 -> 1
    kept = KTOLoss(desirable_weight=1.0, undesirable_weight=1.0)
    assert balance_kto_weights(kept, [True] * 5 + [False] * 4) is None and kept.desirable_weight == 1.0  # 1.25


def test_prepare_dataset_writes_colossalchat_parts_sampled_as_colossalchat_samples(tiny_assets, tmp_path, capsys):
    """ColossalChat's layout: `train[a%:b%]` parts as `arrow/part-NNNNN` folders, at most
    --num_samples_per_datafile rows each, a JSONL sidecar per part; comma-separated inputs; both the folder
    and its parts load for training."""
    from coati.dataset.demo_data import generate_problems, sft_records, write_jsonl
    from coati.dataset.prepare import part_bounds

    spec = importlib.util.spec_from_file_location("prepare_check", REPO / "examples" / "data_preparation_scripts" /
                                                  "prepare_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first = write_jsonl(sft_records(generate_problems(6, "train")), tmp_path / "a" / "raw.jsonl")
    second = write_jsonl(sft_records(generate_problems(4, "eval")), tmp_path / "b" / "raw.jsonl")
    argv = ["--type", "sft", "--data_input_dirs", f"{first.parent},{second.parent}", "--tokenizer_dir",
            str(tiny_assets["model"]), "--data_arrow_output_dir", str(tmp_path / "arrow"), "--data_jsonl_output_dir",
            str(tmp_path / "jsonl"), "--num_spliced_dataset_bins", "3", "--num_samples_per_datafile", "2",
            "--data_cache_dir", str(tmp_path / "cache"), "--max_length", "128"]
    module.main(argv)
    assert part_bounds(10, 3) == [(0, 3), (3, 7), (7, 10)]      # 34 % steps, boundaries rounded to the closest row
    parts = sorted(p.name for p in (tmp_path / "arrow").iterdir() if p.is_dir())
    assert parts == ["part-00000", "part-00001", "part-00002"]
    assert [len(load_prepared([tmp_path / "arrow" / p])) for p in parts] == [2, 2, 2]
    assert len(load_prepared([tmp_path / "arrow"], "sft")) == 6
    jsonl = sorted((tmp_path / "jsonl").iterdir())
    assert [f.name for f in jsonl] == [f"{p}.jsonl" for p in parts]
    row = json.loads(jsonl[0].read_text().splitlines()[0])
    assert row["input_ids"] and row["labels_decode"][0].endswith(END_OF_TURN)
    with pytest.raises(SystemExit):
        module.main(argv)
    err = capsys.readouterr().err
    assert "--data_arrow_output_dir" in err and "already holds part-00000" in err


def test_one_row_lands_in_the_part_colossalchat_puts_it_in():
    """With ColossalChat's default 10 bins, one row is in part 5 alone (`train[50%:60%]`), the part its
    test_templating.sh reads."""
    from coati.dataset.prepare import OutputLayout

    assert [index for index, _ in OutputLayout(bins=10).split([{"row": 0}])] == [5]


@pytest.mark.parametrize("name, argv, message", [
    ("sft", ["--max_len", "-5"], "argument --max_len: must be >= 0"),
    ("grpo", ["--experience_batch_size", "0"], "argument --experience_batch_size: must be >= 1"),
    ("ppo", ["--max_seq_len", "0"], "argument --max_seq_len: must be >= 1"),
])
def test_colossalchat_aliases_keep_our_ranges(name, argv, message, monkeypatch, capsys):
    base = REQUIRED.get(name, REQUIRED["sft"])
    with pytest.raises(SystemExit) as exit_:
        _parse(name, [*base, *argv], monkeypatch)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_rm_checkpoint_path_takes_a_checkpoint_or_its_modeling_folder(tmp_path):
    """ColossalChat chains train_rm.py's `save_dir/modeling` (or a checkpoint folder) into PPO/GRPO."""
    import argparse

    from coati.utils.errors import CoatiUsageError
    from coati.cli.preflight import resolve_model_flags

    modeling = tmp_path / "rm" / "epoch-1_step-8" / "modeling"
    modeling.mkdir(parents=True)
    (modeling / "config.json").write_text("{}")
    for given in (modeling.parent, modeling):
        args = argparse.Namespace(rm_pretrain="base_model_dir", rm_checkpoint_path=str(given))
        resolve_model_flags(args)
        assert args.rm_pretrain == str(modeling)
    with pytest.raises(CoatiUsageError, match="holds no model"):
        resolve_model_flags(argparse.Namespace(rm_checkpoint_path=str(tmp_path / "rm")))


@pytest.mark.parametrize("argv, normalised, margin, reference_free", [
    (["--loss_type", "simpo_loss"], True, 1.4, False),
    (["--loss_type", "simpo_loss", "--gamma", "0.3", "--disable_reference_model"], True, 0.3, True),
    (["--loss_type", "dpo_loss"], False, 0.0, False),
])
def test_colossalchat_loss_type_names(argv, normalised, margin, reference_free, monkeypatch):
    """ColossalChat's `simpo_loss` is its DPO loss on length-normalised log-probs with a margin (1.4 unless
    --gamma), the reference kept unless disabled; `dpo_loss` is DPO."""
    from coati.models.loss import DPOLoss

    args = _parse("dpo", ["--pretrain", "m", "--dataset", "d", *argv], monkeypatch)
    loss = preference_loss(args._run_config.loss, args.disable_reference_model, args.length_normalization)
    assert type(loss) is DPOLoss and loss.loss_type == "sigmoid" and loss.beta == 0.1
    assert (loss.length_normalized, loss.gamma, not loss.needs_reference) == (normalised, margin, reference_free)


def test_a_blank_argument_is_dropped_with_a_warning(monkeypatch, capsys):
    """ColossalChat's GRPO test command ends a line with `\\ \\`: a lone blank argument under a direct launch."""
    args = _parse("grpo", ["--pretrain", "m", "--prompt_dataset", "d", "--max_len", "200", " ", "--max_seq_len", "10",
                           "--reward_functions", "gsm8k_reward_fn"], monkeypatch)
    assert args.max_length == 200 and args.max_new_tokens == 10
    assert "warning: ignoring 1 blank argument(s) [' ']" in capsys.readouterr().err


def test_no_neural_reward_model_with_rm_pretrain_starts_the_critic(monkeypatch, capsys):
    """ColossalChat's own PPO test passes both: the rewards come from the functions, --rm_pretrain starts the critic."""
    base = ["--pretrain", "m", "--prompt_dataset", "d", "--no_neural_reward_model", "--rm_pretrain", "rm"]
    args = _parse("ppo", [*base, "--reward_functions", "gsm8k_reward_fn"], monkeypatch)
    assert (args.rm_pretrain, args.critic_pretrain, args.reward_fn) == (None, "rm", ["math_answer", "answer_format"])
    with pytest.raises(SystemExit):
        _parse("ppo", base, monkeypatch)
    assert "--no_neural_reward_model: the rewards then come from --reward_fn" in capsys.readouterr().err
