"""One typed run config per trainer: a tree of the settings sections of `coati.config`, the single description of a run.

Each trainer's tree (`SFTRunConfig`, ..., `GRPORunConfig`, `PPORunConfig`) names its sections in order; a section is a
frozen settings dataclass (`run.model.pretrain`, `run.optim.lr`, `run.rollout.num_generations`). The command's parser
is built from the tree (`coati.cli.arguments.run_config_parser`), the tree from the parsed flags, a config file or Python
(`coati.cli.commands.run`), it is validated in one place (`validate`: each section's `check`, which sees the whole run),
and the run saves it, section by section, as `run_config.yaml`. Light (no torch).
"""
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, Dict, Iterator, Tuple

from coati.config import (AgentSettings, AsyncSettings, BackendSettings, CheckpointSettings, CriticSettings,
                          DataSettings, DistillSettings, EpisodeSettings, EpochSettings, EvalSettings, GRPOConfig,
                          HealthSettings, JudgeSettings, KLSettings, KTOLossSettings, LogSettings, LoraSettings,
                          MaxEntSettings, ModelSettings, OnPolicyConfig, OptimSettings, ORPOLossSettings,
                          PackingSettings, PluginConfig, PolicyLossSettings, PPOConfig, PreferenceLossSettings,
                          ProcessRewardSettings, PtxSettings, ReferenceSettings, RewardModelLossSettings,
                          RewardSettings, RolloutConfig, SandboxSettings, StepLabelSettings, VisionSettings)
from coati.utils.errors import CoatiUsageError

ON_POLICY_HELP = {
    "batch_size": "prompts per rank per collect step",
    "accumulation_steps": "learning micro-batches (--train_batch_size) per optimizer step",
    "save_interval": "save every N episodes (0: only at the end)",
    "save_freq_epochs": "also save when every N-th pass over the prompts ends (0: off)",
}
SUPERVISED_HELP = {"steps": "log the mean of the metrics every N optimizer steps",
                   "eval_interval": "also evaluate --eval_dataset every N optimizer steps (always after each epoch)"}
ON_POLICY_EVAL = ("eval_freq_epochs", "eval_freq_secs", "eval_n_samples", "eval_temperature", "eval_top_p",
                  "eval_top_k", "save_best")
"""Held-out evaluation settings of the on-policy trainers only (supervised runs take `eval_interval`)."""


@dataclass(frozen=True)
class Section:
    """How a tree shows one section in its command's `--help`: the group title, and this trainer's changes to some
    fields' defaults, help or flag, or fields it leaves out (by field name)."""

    title: str
    defaults: Dict[str, Any] = field(default_factory=dict)
    helps: Dict[str, str] = field(default_factory=dict)
    flags: Dict[str, str] = field(default_factory=dict)
    skip: Tuple[str, ...] = ()


def section(cls: type, title: str, **changes: Any) -> Any:
    """A tree field holding the settings section `cls`, shown under `title` (see `Section` for `changes`); left out,
    it is `cls` with this trainer's defaults."""
    shown = Section(title, **changes)
    return field(default_factory=partial(with_defaults, cls, shown.defaults), metadata={"nested": cls, "section": shown})


def with_defaults(cls: type, defaults: Dict[str, Any]) -> Any:
    """`cls` with the fields named in `defaults` (its own or its nested settings') set to those values; a section with
    a required setting (the model's `pretrain`, the data's `dataset`) cannot be left out."""
    values = {}
    for f in fields(cls):
        if "nested" in f.metadata:
            values[f.name] = with_defaults(f.metadata["nested"], defaults)
        elif f.name in defaults:
            values[f.name] = defaults[f.name]
    try:
        return cls(**values)
    except TypeError as error:
        raise TypeError(f"a run config needs its {cls.__name__} section given ({error})") from None


def sections(tree: type) -> Iterator[Tuple[str, type, Section]]:
    """(name, settings class, how it is shown) of each section of the tree class `tree`, in order."""
    for f in fields(tree):
        yield f.name, f.metadata["nested"], f.metadata["section"]


def validate(run: Any) -> Any:
    """Every check across settings, each kept with the section it concerns (`check(run)`), then the tree's own
    (`check`); raises `CoatiUsageError` (one line) and returns `run` when all pass."""
    for name, _, _ in sections(type(run)):
        check = getattr(getattr(run, name), "check", None)
        if check is not None:
            check(run)
    run.check()
    return run


class RunConfig:
    """What every trainer's tree does: its `command`, one instance per settings class (`__post_init__`), and its own
    check across sections (`check`)."""

    command = ""

    def __post_init__(self) -> None:
        """A settings class met again inside a later section (the trainer's `OnPolicyConfig` holds the run's
        `evaluation`, `checkpoint`, `ptx` and step settings) is the first section's instance, so a setting set once
        in Python is the same wherever it is read."""
        first: Dict[type, Any] = {}
        for name, cls, _ in sections(type(self)):
            given = getattr(self, name)
            if not isinstance(given, cls):
                raise TypeError(f"{type(self).__name__}.{name} takes a {cls.__name__} (coati.config), not "
                                f"{type(given).__name__}")
            object.__setattr__(self, name, _shared(given, first))

    def check(self) -> None:
        """What concerns the run as a whole (each section checks its own part)."""


def _shared(settings: Any, first: Dict[type, Any]) -> Any:
    """`settings` with each nested settings object replaced by the first instance of its class in `first` (recording
    the new ones)."""
    if type(settings) in first:
        return first[type(settings)]
    changes = {f.name: _shared(getattr(settings, f.name), first) for f in fields(settings) if "nested" in f.metadata}
    first[type(settings)] = replace(settings, **changes) if changes else settings
    return first[type(settings)]


@dataclass(frozen=True)
class SupervisedRun(RunConfig):
    """The sections every supervised trainer has."""

    model: ModelSettings = section(ModelSettings, "model")
    lora: LoraSettings = section(LoraSettings, "LoRA")
    data: DataSettings = section(DataSettings, "data")
    batching: PackingSettings = section(PackingSettings, "batching")
    epochs: EpochSettings = section(EpochSettings, "length of the run")
    evaluation: EvalSettings = section(EvalSettings, "held-out evaluation", skip=ON_POLICY_EVAL,
                                       helps=SUPERVISED_HELP)
    optim: OptimSettings = section(OptimSettings, "optimisation", helps=SUPERVISED_HELP)
    checkpoint: CheckpointSettings = section(CheckpointSettings, "checkpoints", helps=SUPERVISED_HELP)
    logging: LogSettings = section(LogSettings, "logging", helps=SUPERVISED_HELP, defaults={"steps": 10})
    parallel: PluginConfig = section(PluginConfig, "parallelism")


@dataclass(frozen=True)
class SFTRunConfig(SupervisedRun):
    """Supervised fine-tuning."""

    command = "sft"
    vision: VisionSettings = section(VisionSettings, "vision-language models")


@dataclass(frozen=True)
class RMRunConfig(SupervisedRun):
    """Reward-model training."""

    command = "rm"
    vision: VisionSettings = section(VisionSettings, "vision-language models")
    loss: RewardModelLossSettings = section(RewardModelLossSettings, "reward model loss")


@dataclass(frozen=True)
class DPORunConfig(SupervisedRun):
    """DPO, IPO or SimPO."""

    command = "dpo"
    vision: VisionSettings = section(VisionSettings, "vision-language models")
    loss: PreferenceLossSettings = section(PreferenceLossSettings, "preference loss")
    reference: ReferenceSettings = section(ReferenceSettings, "reference policy")


@dataclass(frozen=True)
class KTORunConfig(SupervisedRun):
    """KTO."""

    command = "kto"
    loss: KTOLossSettings = section(KTOLossSettings, "KTO loss")
    reference: ReferenceSettings = section(ReferenceSettings, "reference policy", skip=("precompute_ref_logps",))


@dataclass(frozen=True)
class ORPORunConfig(SupervisedRun):
    """ORPO."""

    command = "orpo"
    vision: VisionSettings = section(VisionSettings, "vision-language models")
    loss: ORPOLossSettings = section(ORPOLossSettings, "ORPO loss")


@dataclass(frozen=True)
class PRMRunConfig(SupervisedRun):
    """Process reward model training."""

    command = "prm"
    step_labels: StepLabelSettings = section(StepLabelSettings, "process reward model")


@dataclass(frozen=True)
class OnPolicyRun(RunConfig):
    """The sections GRPO and PPO share; each adds its rollouts and advantages, and its own parts."""

    model: ModelSettings = section(ModelSettings, "model")
    lora: LoraSettings = section(LoraSettings, "LoRA")
    data: DataSettings = section(DataSettings, "data", flags={"dataset": "--prompt_dataset"})
    optim: OptimSettings = section(OptimSettings, "optimisation", helps=ON_POLICY_HELP)
    checkpoint: CheckpointSettings = section(CheckpointSettings, "checkpoints", helps=ON_POLICY_HELP)
    logging: LogSettings = section(LogSettings, "logging", helps=ON_POLICY_HELP)
    parallel: PluginConfig = section(PluginConfig, "parallelism")
    rollout: RolloutConfig = section(RolloutConfig, "rollouts and advantages")   # each algorithm's own
    episodes: EpisodeSettings = section(EpisodeSettings, "episodes")
    actor_loss: PolicyLossSettings = section(PolicyLossSettings, "policy loss")
    kl: KLSettings = section(KLSettings, "KL to the reference")
    reward: RewardSettings = section(RewardSettings, "rewards")
    process_reward: ProcessRewardSettings = section(ProcessRewardSettings, "process reward model (step scores)")
    judge: JudgeSettings = section(JudgeSettings, "LLM judge (--reward_fn judge)")
    code_tests: SandboxSettings = section(SandboxSettings, "code_tests reward (programs run in a sandbox)")
    distillation: DistillSettings = section(DistillSettings, "on-policy distillation (a teacher scores the policy's "
                                                             "samples)")
    ptx: PtxSettings = section(PtxSettings, "ptx (InstructGPT's supervised loss beside the policy's)")
    evaluation: EvalSettings = section(EvalSettings, "held-out evaluation")
    health: HealthSettings = section(HealthSettings, "health alarms")
    engine: BackendSettings = section(BackendSettings, "rollout backend")
    multi_turn: AgentSettings = section(AgentSettings, "multi-turn rollouts with tools")
    algorithm: OnPolicyConfig = section(OnPolicyConfig, "on-policy trainer")
    reference: ReferenceSettings = section(ReferenceSettings, "reference policy", skip=("precompute_ref_logps",))

    def check(self) -> None:
        """GRPO and PPO learn from rewards and have no default one: a run naming no reward source (functions, a reward
        model, a process reward model or a teacher) is refused before anything loads, not halfway through."""
        if not (self.reward.reward_fn or self.reward.rm_pretrain or self.process_reward.prm_pretrain
                or self.distillation.teacher):
            raise CoatiUsageError(f"{self.command.upper()} needs a reward: --reward_fn (at least one function; TRL's "
                                  "reward_funcs, verl's custom_reward_function.path, OpenRLHF's --reward.remote_url), "
                                  "--rm_pretrain (a trained reward model; OpenRLHF's --reward.model_name_or_path) "
                                  "and/or --prm_pretrain (a process reward model), or a distillation teacher "
                                  "(--teacher_model or --teacher_url)")


@dataclass(frozen=True)
class GRPORunConfig(OnPolicyRun):
    """GRPO (and the group-relative estimators of its registry)."""

    command = "grpo"
    vision: VisionSettings = section(VisionSettings, "vision-language models")
    rollout: GRPOConfig = section(GRPOConfig, "rollouts and advantages")
    maxent: MaxEntSettings = section(MaxEntSettings, "maxent advantages")
    asynchronous: AsyncSettings = section(AsyncSettings, "asynchronous rollouts")


@dataclass(frozen=True)
class PPORunConfig(OnPolicyRun):
    """PPO with a critic. Here `--kl_coef` weighs the per-token KL penalty in the reward (k1 by default), and
    `--reward_fn` is optional."""

    command = "ppo"
    vision: VisionSettings = section(VisionSettings, "vision-language models")
    rollout: PPOConfig = section(PPOConfig, "rollouts and advantages")
    kl: KLSettings = section(KLSettings, "KL to the reference", defaults={"kl_coef": 0.05})
    reward: RewardSettings = section(RewardSettings, "rewards", defaults={"reward_fn": ()})
    critic: CriticSettings = section(CriticSettings, "ppo")


RUN_CONFIGS: Dict[str, type] = {tree.command: tree for tree in (
    SFTRunConfig, RMRunConfig, DPORunConfig, KTORunConfig, ORPORunConfig, PRMRunConfig, GRPORunConfig, PPORunConfig)}
"""Each training command's run config, by command name."""
