"""Options declared once (`coati.config`): the parsers are built from the dataclass fields, and the dataclasses come
back from the parsed flags with the same defaults, ranges and meanings."""
import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from coati.cli.arguments import run_config_parser
from coati.cli.colossalchat import add_colossalchat_flags
from coati.cli.options import CoatiArgumentParser, add_settings, settings_from
from coati.config import (DataSettings, GRPOConfig, LogSettings, OnPolicyConfig, PluginConfig, PPOConfig,
                          SamplingConfig)
from coati.run_config import GRPORunConfig, PPORunConfig, SFTRunConfig
from coati.utils.cadence import LogCadence
from coati.utils.ranges import in_range
from coati.utils.settings import flag_name, setting

REQUIRED = ["--pretrain", "m", "--prompt_dataset", "d"]
GRPO_REQUIRED = [*REQUIRED, "--reward_fn", "math_answer"]
"""GRPO also needs its reward named: it has no default one."""


def _grpo_parser(colossalchat: bool = True) -> argparse.ArgumentParser:
    parser = run_config_parser(GRPORunConfig, "grpo")
    if colossalchat:
        add_colossalchat_flags(parser, "grpo")
    return parser


def _ppo_parser() -> argparse.ArgumentParser:
    return run_config_parser(PPORunConfig, "ppo")


@pytest.mark.parametrize("cls", [GRPOConfig, OnPolicyConfig, PluginConfig, LogSettings])
def test_the_flags_defaults_are_the_dataclass_defaults(cls):
    args = _grpo_parser().parse_args(GRPO_REQUIRED)
    assert settings_from(args, cls) == cls()


def test_ppo_takes_its_own_config_defaults_where_they_differ_from_grpo():
    args = _ppo_parser().parse_args(REQUIRED)
    assert (args.num_generations, args.kl_estimator, args.kl_coef, args.reward_fn) == (1, "k1", 0.05, [])
    assert settings_from(args, PPOConfig) == PPOConfig()
    assert not hasattr(args, "no_std_normalize")          # a GRPO setting PPO has no use for is not its flag


def test_every_setting_of_a_trainer_config_is_a_flag_of_the_script():
    parser = _grpo_parser()
    declared = {flag for cls in (GRPOConfig, OnPolicyConfig, PluginConfig) for flag in _flags(cls)}
    assert declared and declared <= set(parser._option_string_actions)


def _flags(cls):
    for f in dataclasses.fields(cls):
        if "nested" in f.metadata:
            yield from _flags(f.metadata["nested"])
        elif flag_name(f):
            yield flag_name(f)


def test_flags_become_the_fields_they_name():
    args = _grpo_parser().parse_args(GRPO_REQUIRED + [
        "--no_std_normalize", "--adv_estimator", "maxent", "--adv_option", "tau=0.5", "--reward_shaping", "overlong",
        "--overlong_buffer_len", "4", "--max_new_tokens", "16", "--logits_forward_batch_size", "2",
        "--accumulation_steps", "3", "--save_dir", "ckpt", "--eval_n_samples", "4", "--log_interval", "5"])
    grpo = settings_from(args, GRPOConfig)
    assert (grpo.scale_rewards, grpo.advantage_estimator, grpo.advantage_options) == (False, "maxent", {"tau": 0.5})
    assert (grpo.reward_shaping, grpo.shaping.overlong_buffer, grpo.forward_batch_size) == (("overlong",), 4, 2)
    assert grpo.sampling == SamplingConfig(max_new_tokens=16)
    trainer = settings_from(args, OnPolicyConfig, grad_clip=1.0)
    assert (trainer.steps.accumulation_steps, trainer.checkpoints.save_dir, trainer.evaluation.eval_n_samples) == (3, "ckpt", 4)
    assert trainer.logging == LogCadence(steps=5) and trainer.grad_clip == 1.0


@pytest.mark.parametrize("argv, expected", [
    (["--clip_eps_low", "1.5"], "error: argument --clip_eps_low: must be in [0, 1), got 1.5"),
    (["--max_seq_len", "0"], "error: argument --max_seq_len: must be >= 1, got 0"),    # the alias keeps the range
    (["--logging_steps", "0"], "error: argument --logging_steps: must be >= 1, got 0"),
    (["--adv_option", "tau"], "error: argument --adv_option: 'tau': expected NAME=VALUE"),
])
def test_a_value_out_of_the_fields_range_is_refused_by_its_flag(argv, expected, capsys):
    with pytest.raises(SystemExit) as exited:
        _grpo_parser().parse_args(GRPO_REQUIRED + argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(expected)


def test_colossalchat_aliases_land_in_the_fields():
    args = _grpo_parser().parse_args(GRPO_REQUIRED + ["--max_seq_len", "12", "--experience_batch_size", "3"])
    assert (settings_from(args, SamplingConfig).max_new_tokens, args.batch_size) == (12, 3)
    sft = run_config_parser(SFTRunConfig, "sft")
    add_colossalchat_flags(sft, "sft")
    assert settings_from(sft.parse_args(["--pretrain", "m", "--dataset", "d", "--max_len", "99"]), DataSettings).max_length == 99


def test_a_script_without_the_colossalchat_layer_has_every_value_the_run_reads():
    args = _grpo_parser(colossalchat=False).parse_args(GRPO_REQUIRED)
    assert (args.extra_stop_ids, args.disable_loss_mask, args.use_flash_attn) == ([], False, False)


@dataclass(frozen=True)
class _MySettings:
    """My algorithm's settings."""

    margin: float = setting(0.5, parse=in_range(0, 1), help="the margin")
    warm: bool = setting(False, help="warm start")


def test_a_settings_class_of_ones_own_becomes_flags_with_ranges_and_help(capsys):
    parser = CoatiArgumentParser(prog="mine")
    add_settings(parser, _MySettings)
    assert settings_from(parser.parse_args([]), _MySettings) == _MySettings()
    assert settings_from(parser.parse_args(["--margin", "0.25", "--warm"]), _MySettings) == _MySettings(0.25, True)
    parser.print_help()
    text = " ".join(capsys.readouterr().out.split())
    assert "My algorithm's settings:" in text and "the margin (default: 0.5) [in [0, 1]]" in text


CHANGED_SETTINGS = {
    "judge": {"judge_model_name": "grader", "judge_parser": "verdict", "judge_max_score": 5.0, "judge_api": "completions",
              "judge_batch_size": 3, "judge_concurrency": 2, "judge_max_tokens": 9, "judge_timeout": 7.0,
              "judge_retries": 1, "judge_cache": 5},
    "vllm": {"vllm_threads": 2, "vllm_kv_cache_gib": 3, "vllm_gpu_memory_utilization": 0.5, "vllm_start_timeout": 9.0,
             "vllm_timeout": 8.0, "vllm_max_restarts": 4, "vllm_enforce_eager": True},
}
"""A value other than the default for each setting a part is built from."""


@pytest.mark.parametrize("part", sorted(CHANGED_SETTINGS))
def test_a_part_built_from_its_settings_section_takes_each_value_from_its_setting(part):
    """`LLMJudge.from_settings` and `VLLMConfig.from_settings`: every field they map comes from a setting of the
    section, and the value set there reaches the part."""
    from coati.config import BackendSettings, JudgeSettings
    from coati.inference import vllm
    from coati.rewards import judge

    module, cls, section = {"judge": (judge, judge.LLMJudge, JudgeSettings),
                            "vllm": (vllm, vllm.VLLMConfig, BackendSettings)}[part]
    changed = CHANGED_SETTINGS[part]
    assert set(module.FROM_SETTINGS) <= {f.name for f in dataclasses.fields(cls)}
    assert set(module.FROM_SETTINGS.values()) == set(changed)
    settings = dataclasses.replace(section(), **changed)
    assert all(getattr(section(), name) != value for name, value in changed.items())
    built = (cls.from_settings(settings, "http://127.0.0.1/v1", judge.DEFAULT_RUBRIC, None) if part == "judge" else
             cls.from_settings(settings, "model", "python", None, "log", "float32", 0, 0))
    assert {name: getattr(built, name) for name in module.FROM_SETTINGS} == {
        name: changed[setting] for name, setting in module.FROM_SETTINGS.items()}
