"""The run config (`coati.run_config`): one tree per trainer from which its command's parser is built, which flags,
config files (flat or by section) and Python build alike, which is validated in one place and which a run saves."""
import argparse
from pathlib import Path

import pytest
import yaml

from coati.cli.arguments import run_config_from
from coati.cli.commands import TRAINING, command_parser
from coati.cli.config_file import (COLOSSALCHAT_SECTION, config_tokens, resolved_config, section_owners, switch_words,
                                   tree_argv)
from coati.cli.options import settings_from
from coati.config import (AsyncSettings, CheckpointSettings, DataSettings, DistillSettings, EpisodeSettings,
                          EvalSettings, GRPOConfig, KLSettings, LogSettings, LoraSettings, ModelSettings, OptimSettings,
                          PackingSettings, PluginConfig, PolicyLossSettings, PreferenceLossSettings,
                          ProcessRewardSettings, RewardSettings, SamplingConfig, ShapingConfig)
from coati.run_config import (RUN_CONFIGS, DPORunConfig, GRPORunConfig, PPORunConfig, PRMRunConfig, SFTRunConfig,
                              sections, validate)
from coati.utils.errors import CoatiUsageError

RECORDED = Path(__file__).resolve().parents[2] / "recorded" / "before_refactor"
MODEL, DATA = ModelSettings(pretrain="m"), DataSettings(dataset=("d",))


def _settings_flags(parser: argparse.ArgumentParser) -> set:
    """The parser's coati settings: every flag but the help, --config, and the groups of the other frameworks' names."""
    groups = [g for g in parser._action_groups
              if not g.title.startswith(("ColossalChat", "TRL", "verl", "OpenRLHF"))]
    return {a.dest for g in groups for a in g._group_actions if a.option_strings and a.dest not in ("help", "config")}


@pytest.mark.parametrize("command", sorted(TRAINING))
def test_each_commands_settings_are_its_run_configs_and_no_section_name_is_a_flag(command):
    parser = command_parser(command)
    owners = section_owners(parser)
    assert _settings_flags(parser) == set(owners)
    names = [name for name, _, _ in sections(RUN_CONFIGS[command])]
    assert not {f"--{name}" for name in names} & set(parser._option_string_actions)


def test_a_tree_built_in_python_reaches_its_command_as_the_same_tree():
    run = GRPORunConfig(
        model=MODEL, data=DATA, lora=LoraSettings(lora_rank=4, lora_target_modules=("q_proj", "v_proj")),
        optim=OptimSettings(lr=3e-4, batch_size=2), checkpoint=CheckpointSettings(output_dir="out", save_dir="ck"),
        logging=LogSettings(log_dir="out/logs"),
        rollout=GRPOConfig(num_generations=4, scale_rewards=False,
                           reward_shaping=("overlong",), shaping=ShapingConfig(overlong_buffer=4),
                           sampling=SamplingConfig(max_new_tokens=16, temperature=0.7)),
        actor_loss=PolicyLossSettings(policy_loss="sapo", policy_loss_options={"temperature_neg": 1.05}),
        kl=KLSettings(kl_coef=0.02), reward=RewardSettings(reward_fn=("math_answer=2", "answer_format")),
        episodes=EpisodeSettings(num_episodes=3), evaluation=EvalSettings(eval_interval=2))
    parser = command_parser("grpo")
    argv = tree_argv(parser, run)
    assert "--no_std_normalize" in argv and argv[argv.index("--policy_loss_option") + 1] == "temperature_neg=1.05"
    back = settings_from(parser.parse_args(argv), GRPORunConfig)
    assert back == run
    assert back.algorithm.evaluation.eval_interval == 2     # the trainer's copy is the run's one section


def test_a_tree_left_out_of_python_has_the_commands_defaults():
    parser = command_parser("ppo")
    from_flags = settings_from(parser.parse_args(["--pretrain", "m", "--prompt_dataset", "d"]), PPORunConfig)
    assert from_flags == PPORunConfig(model=MODEL, data=DATA)
    assert (from_flags.kl.kl_coef, from_flags.reward.reward_fn) == (0.05, ())
    assert SFTRunConfig(model=MODEL, data=DATA).logging.cadence.steps == 10


@pytest.mark.parametrize("run, message", [
    (SFTRunConfig(model=MODEL, data=DATA, batching=PackingSettings(max_tokens_per_batch=64)),
     "--max_tokens_per_batch fills packed micro-batches; add --packing"),
    (SFTRunConfig(model=MODEL, data=DATA, batching=PackingSettings(packing=True), parallel=PluginConfig(plugin="3d")),
     "--packing is not supported with --plugin 3d"),
    (PRMRunConfig(model=MODEL, data=DATA, batching=PackingSettings(packing=True)), "--packing is not for train_prm.py"),
    (GRPORunConfig(model=MODEL, data=DATA), "GRPO needs a reward"),
    (PPORunConfig(model=MODEL, data=DATA), "PPO needs a reward"),
    (GRPORunConfig(model=MODEL, data=DATA, reward=RewardSettings(reward_fn=("math_answer",)),
                   kl=KLSettings(kl_target=6.0)), "--kl_target 6.0 adapts --kl_coef"),
    (GRPORunConfig(model=MODEL, data=DATA, process_reward=ProcessRewardSettings(prm_pretrain="prm")),
     "--prm_pretrain: GRPO reads step scores through --adv_estimator process, not grpo"),
    (GRPORunConfig(model=MODEL, data=DATA, distillation=DistillSettings(teacher_model="t", teacher_url="http://x")),
     "--teacher_model and --teacher_url: give one teacher"),
    (GRPORunConfig(model=MODEL, data=DATA, reward=RewardSettings(reward_fn=("math_answer",)),
                   asynchronous=AsyncSettings(partial_rollout_tokens=8)), "--partial_rollout_tokens needs --async_rollout"),
    (GRPORunConfig(model=MODEL, data=DATA, reward=RewardSettings(reward_fn=("math_answer",)),
                   asynchronous=AsyncSettings(async_rollout=True), parallel=PluginConfig(plugin="gemini")),
     "--async_rollout supports --plugin ddp, zero2 and zero2_cpu"),
    (GRPORunConfig(model=MODEL, data=DATA, reward=RewardSettings(reward_fn=("math_answer",)),
                   evaluation=EvalSettings(save_best="rewards/math_answer")), "--save_best rewards/math_answer compares"),
    (GRPORunConfig(model=MODEL, data=DATA, reward=RewardSettings(reward_fn=("math_answer",)),
                   parallel=PluginConfig(plugin="3d", pp=2)), "--pp > 1 (pipeline parallelism) is not supported"),
])
def test_each_check_across_settings_is_one_line_from_validate(run, message):
    with pytest.raises(CoatiUsageError) as refused:
        validate(run)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_sound_tree_validates():
    run = DPORunConfig(model=MODEL, data=DATA, loss=PreferenceLossSettings(loss_type="ipo", beta=0.2))
    assert validate(run) is run


def _grpo(argv):
    parser = command_parser("grpo")
    return parser, parser.parse_args(["--pretrain", "m", "--prompt_dataset", "d", "--reward_fn", "math_answer", *argv])


def test_a_saved_config_is_grouped_by_section_and_reads_back_to_the_same_run(tmp_path):
    parser, args = _grpo(["--lr", "1e-4", "--num_generations", "4", "--no_std_normalize", "--adv_estimator", "process",
                          "--adv_option", "aggregation=sum", "--prm_pretrain", "prm",
                          "--lora_rank", "2", "--max_len", "77"])
    saved = resolved_config(parser, args)
    names = [name for name, _, _ in sections(GRPORunConfig)]
    assert list(saved) == [n for n in names if n in saved] + [COLOSSALCHAT_SECTION]
    assert saved["optim"]["lr"] == 1e-4 and saved["rollout"]["no_std_normalize"] is True
    assert saved["rollout"]["adv_option"] == {"aggregation": "sum"} and saved["data"]["max_length"] == 77
    path = tmp_path / "run_config.yaml"
    path.write_text(yaml.safe_dump(saved, sort_keys=False))
    parser2 = command_parser("grpo")
    reread = parser2.parse_args(["--config", str(path)])
    assert settings_from(reread, GRPORunConfig) == settings_from(args, GRPORunConfig)


def test_a_key_in_another_section_or_unknown_in_one_is_one_line():
    parser = command_parser("sft")
    with pytest.raises(CoatiUsageError, match=r"model\.lr is a setting of section 'optim', not 'model'"):
        config_tokens(parser, {"model": {"lr": 0.1}}, "f.yaml")
    with pytest.raises(CoatiUsageError, match=r"unknown key 'optim\.lrr' \(did you mean lr\?\)"):
        config_tokens(parser, {"optim": {"lrr": 0.1}}, "f.yaml")
    with pytest.raises(CoatiUsageError, match=r"unknown section 'optimizer' \(did you mean optim\?\)"):
        config_tokens(parser, {"optimizer": {"lr": 0.1}}, "f.yaml")
    assert config_tokens(parser, {"gradient_checkpointing_kwargs": {"use_reentrant": False}}, "f.yaml") == []
    assert config_tokens(parser, {"optim": {"learning_rate": 0.1}, "model": {"model_name_or_path": "m"}}, "f.yaml") == \
        ["--learning_rate", "0.1", "--model_name_or_path", "m"]


@pytest.mark.parametrize("values, message", [
    ({"learning_rate": 0.1, "optim": {"lr": 0.2}}, "learning_rate and optim.lr set the same setting; keep one"),
    ({"model": "m"}, "'model' is a section: give its settings under it, e.g. `model: {pretrain: ...}`, not 'm'"),
    ({"optim": {"per_device_train_batch_size": 8}}, "optim.per_device_train_batch_size is TRL's or ColossalChat's "
                                                    "name, converted to coati's settings: give it at the top level"),
    ({"rollout": {"num_generations": 4}}, "unknown section 'rollout' (a section of coati grpo, coati ppo, not of "
                                          "this command)"),
])
def test_a_file_that_says_a_setting_twice_or_a_section_wrongly_is_one_line(values, message):
    with pytest.raises(CoatiUsageError) as refused:
        config_tokens(command_parser("sft"), values, "f.yaml")
    assert str(refused.value).startswith("--config f.yaml: ") and message in str(refused.value)
    assert config_tokens(command_parser("sft"), {"lora": None, "learning_rate": 0.1}, "f.yaml") == ["--learning_rate",
                                                                                                    "0.1"]


def test_a_tree_built_wrongly_in_python_says_which_section():
    with pytest.raises(TypeError, match=r"GRPORunConfig.optim takes a OptimSettings \(coati.config\), not dict"):
        GRPORunConfig(model=MODEL, data=DATA, optim={"lr": 1e-4})
    with pytest.raises(TypeError, match=r"a run config needs its ModelSettings section given"):
        SFTRunConfig(data=DATA)


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_flat_configs_saved_before_the_tree_still_load(command):
    parser = command_parser(command)
    args = parser.parse_args(["--config", str(RECORDED / command / "run_config.yaml"), "--output_dir", "/tmp/x"])
    run = run_config_from(args, parser.run_config)
    assert run.model.pretrain == "/tmp/walk/assets/model" and run.checkpoint.output_dir == "/tmp/x"


@pytest.mark.parametrize("given, expected", [
    (["--gradient_checkpointing", "true"], ["--gradient_checkpointing"]),
    (["--gradient_checkpointing=False"], ["--off:grad_checkpoint"]),   # the hidden flag that turns it back off
    (["--packing", "yes", "--lr", "0.1"], ["--packing", "--lr", "0.1"]), (["--packing"], ["--packing"]),
])
def test_a_switch_takes_a_written_true_or_false_as_hugging_faces_parser_does(given, expected):
    assert switch_words(command_parser("sft"), given) == expected


def test_a_switch_given_another_word_is_one_line():
    with pytest.raises(CoatiUsageError, match="--packing=maybe: a switch takes true or false, or nothing"):
        switch_words(command_parser("sft"), ["--packing=maybe"])


def test_an_unquoted_no_in_a_config_file_is_the_choice_no():
    values = yaml.safe_load("eval_strategy: no\nsave_strategy: no\n")
    assert values == {"eval_strategy": False, "save_strategy": False}   # as YAML reads it
    tokens = config_tokens(command_parser("sft"), values, "f.yaml")
    assert tokens == ["--eval_strategy", "no", "--save_strategy", "no"]


def test_trls_optim_name_is_taken_for_adamw_and_refused_for_another_optimizer(capsys):
    assert config_tokens(command_parser("sft"), {"optim": "adamw_torch", "learning_rate": 0.1}, "f.yaml") == [
        "--learning_rate", "0.1"]
    assert "not used: optim (coati trains with AdamW" in capsys.readouterr().err
    with pytest.raises(CoatiUsageError, match="optim 'adafactor' is not taken: coati trains with AdamW"):
        config_tokens(command_parser("sft"), {"optim": "adafactor"}, "f.yaml")
    assert config_tokens(command_parser("sft"), {"optim": {"lr": 0.1}}, "f.yaml") == ["--lr", "0.1"]   # the section


def test_trls_flags_that_change_nothing_are_dropped_with_their_values_and_named_in_one_note(capsys):
    from coati.cli.config_file import drop_ignored_flags

    argv = ["--push_to_hub", "true", "--lr", "0.1", "--hub_model_id", "me/model", "--overwrite_output_dir",
            "--optim=adamw_torch", "--seed", "3"]
    assert drop_ignored_flags(command_parser("sft"), argv) == ["--lr", "0.1", "--seed", "3"]
    note = capsys.readouterr().err.strip()
    assert note.startswith("note: not used: --push_to_hub (coati does not upload") and "--optim (coati trains" in note
    assert len(note.splitlines()) == 1
    with pytest.raises(CoatiUsageError, match="--optim 'sgd' is not taken: coati trains with AdamW"):
        drop_ignored_flags(command_parser("sft"), ["--optim", "sgd"])


def test_each_schedule_takes_what_transformers_passes_it_and_the_run_builds_adamw_and_the_schedule_as_set():
    """`SCHEDULE_OPTIONS` names settings of transformers' own schedule functions; HF's adam_* names and a
    cosine_with_min_lr floor reach the optimizer and the schedule the runner builds."""
    import inspect

    import torch
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, SchedulerType

    from coati.cli.runner import build_optimizer, build_scheduler
    from coati.config import SCHEDULE_OPTIONS

    for name, taken in SCHEDULE_OPTIONS.items():
        own = set(inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)]).parameters)
        assert set(taken) <= own - {"optimizer", "num_warmup_steps", "num_training_steps", "last_epoch"}, name
    args = argparse.Namespace(lr=1e-3, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.0,
                              lr_scheduler="cosine_with_min_lr", lr_scheduler_option=[("min_lr_rate", 0.1)],
                              warmup_steps=0, warmup_ratio=0.0)
    optimizer = build_optimizer(torch.nn.Linear(2, 2), args)
    assert (optimizer.defaults["betas"], optimizer.defaults["eps"]) == ((0.8, 0.95), 1e-6)
    scheduler = build_scheduler(optimizer, args, 10)
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)    # the floor: min_lr_rate x --lr


def test_hugging_faces_negated_switches_are_the_switch_false():
    from coati.cli.config_file import hf_negations

    parser = command_parser("dpo")
    assert hf_negations(parser, ["--no_remove_unused_columns", "--no_bf16", "--no_gradient_checkpointing", "--lr", "1",
                                 "--no_memory_check", "--no_such_flag"]) == [
        "--remove_unused_columns", "false", "--bf16", "false", "--gradient_checkpointing", "false", "--lr", "1",
        "--no_memory_check", "--no_such_flag"]      # a --no_ flag of coati's own, and an unknown one, stay as given
