"""A run described in Python (`coati.cli.commands.run` on a run config tree) trains, exports and saves its run config
by section, exactly as the command would; a tree that fails its checks is refused in one line."""
import pytest
import yaml

from coati.cli.commands import run
from coati.config import CheckpointSettings, DataSettings, EpochSettings, ModelSettings, OptimSettings, PackingSettings
from coati.run_config import GRPORunConfig, SFTRunConfig
from coati.trainer import Callback


class LoggedSteps(Callback, list):
    """The steps of every `on_log`."""

    def on_log(self, step, metrics):
        self.append(step)


def test_an_sft_run_built_in_python_trains_and_saves_its_tree(tiny_assets, tmp_path, world_of_one):
    out = tmp_path / "out"
    logged = LoggedSteps()
    run(SFTRunConfig(model=ModelSettings(pretrain=str(tiny_assets["model"])),
                     data=DataSettings(dataset=(str(tiny_assets["sft_train"]),)),
                     optim=OptimSettings(lr=1e-3, batch_size=8), epochs=EpochSettings(max_steps=2),
                     checkpoint=CheckpointSettings(output_dir=str(out))), callbacks=[logged])
    assert (out / "model" / "config.json").is_file() and logged == [2]      # yours beside the trainer's own
    text = (out / "run_config.yaml").read_text()
    assert f"#   coati sft --config {out / 'run_config.yaml'} --output_dir NEW_DIR" in text.splitlines()[1]
    saved = yaml.safe_load(text)
    assert list(saved)[:3] == ["model", "lora", "data"]
    assert (saved["optim"]["lr"], saved["optim"]["batch_size"], saved["epochs"]["max_steps"]) == (1e-3, 8, 2)
    assert [r["train/loss"] for r in map(yaml.safe_load, (out / "logs" / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in r]


def test_a_tree_that_fails_its_checks_is_one_line(tiny_assets, capsys):
    with pytest.raises(SystemExit) as exited:
        run(SFTRunConfig(model=ModelSettings(pretrain=str(tiny_assets["model"])),
                         data=DataSettings(dataset=(str(tiny_assets["sft_train"]),)),
                         batching=PackingSettings(max_tokens_per_batch=64)))
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --max_tokens_per_batch fills packed micro-batches; add --packing"]
    with pytest.raises(TypeError, match="run config"):
        run(ModelSettings(pretrain="m"))


SCORED = []


def length_reward(completions, **kwargs):
    """A reward function of the test's own, passed to the run as the function itself."""
    SCORED.append(len(completions))
    return [float(len(c[0]["content"]) if isinstance(c, list) else len(c)) for c in completions]


def test_a_grpo_run_built_in_python_takes_your_reward_function_and_callbacks_themselves(tiny_assets, tmp_path,
                                                                                       world_of_one):
    from coati.config import GRPOConfig, RewardSettings, SamplingConfig
    from coati.config import EpisodeSettings

    logged = LoggedSteps()
    out = tmp_path / "grpo"
    run(GRPORunConfig(model=ModelSettings(pretrain=str(tiny_assets["model"])),
                      data=DataSettings(dataset=(str(tiny_assets["prompt_train"]),)),
                      optim=OptimSettings(batch_size=2), episodes=EpisodeSettings(num_episodes=2),
                      rollout=GRPOConfig(num_generations=2, sampling=SamplingConfig(max_new_tokens=4)),
                      reward=RewardSettings(reward_fn=(length_reward,)), checkpoint=CheckpointSettings(output_dir=str(out))),
        callbacks=[logged])
    assert SCORED == [4, 4] and logged == [1, 2]          # 2 prompts x 2 completions an episode
    assert yaml.safe_load((out / "run_config.yaml").read_text())["reward"]["reward_fn"] == [
        "test_run_from_python:length_reward"]


def test_a_reward_function_that_cannot_be_named_is_one_line(tiny_assets):
    from coati.cli.config_file import tree_argv
    from coati.cli.commands import command_parser
    from coati.config import RewardSettings
    from coati.utils.errors import CoatiUsageError

    tree = GRPORunConfig(model=ModelSettings(pretrain=str(tiny_assets["model"])),
                         data=DataSettings(dataset=(str(tiny_assets["prompt_train"]),)),
                         reward=RewardSettings(reward_fn=(lambda completions, **kwargs: [0.0] * len(completions),)))
    with pytest.raises(CoatiUsageError, match=r"define it at the top level of a module \(not a lambda, closure or"):
        tree_argv(command_parser("grpo"), tree)
