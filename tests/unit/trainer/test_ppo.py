"""PPO's pieces against formulas, its experience from real tiny models, and PPOTrainer in one process:
hooks in order, metrics, sample tables, and a checkpoint that holds and restores the critic."""
import json

import pytest
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.dataset import PromptCollator
from coati.dataset.prepare import load_prepared
from coati.experience.advantages import compute_gae
from coati.experience.distillation import DistillConfig, ModelTeacher
from coati.experience.controllers import KLController
from coati.experience.experience import PPOExperienceMaker, last_token_rewards, whiten
from coati.experience.scorer import Scorer
from coati.config import CheckpointSettings, CriticSettings, OnPolicyConfig, PPOConfig, SamplingConfig
from coati.models.critic import action_values, load_critic
from coati.models.generation import HFEngine
from coati.models.logprobs import action_logps
from coati.models.reward_model import load_reward_model, sequence_rewards
from coati.models.tiny import build_tiny_llama
from coati.rewards import WeightedReward
from coati.trainer.components import explained_variance
from coati.trainer.ppo import CriticParts, PPOTrainer
from coati.trainer.sources import CyclingLoader, LocalRollouts
from coati.utils.stats_tracker import StatsTracker
from coati.cli.runner import build_dataloader
from coati.utils.metrics_logger import MetricsLogger
from support import Recorder

T = torch.tensor


def test_sequence_reward_lands_on_the_last_completion_token():
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert last_token_rewards(T([2.0, -1.0, 0.5]), mask).tolist() == [[0, 0, 2.0, 0], [-1.0, 0, 0, 0], [0, 0, 0, 0.5]]


def test_whiten_and_explained_variance_match_their_formulas():
    values, mask = T([[1.0, 3.0, 100.0]]), T([[1, 1, 0]])
    assert whiten(values, mask)[0].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-4)
    returns = T([[1.0, 2.0, 3.0, 4.0]])
    full = torch.ones(1, 4)
    assert explained_variance(returns, returns, full) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, full) == pytest.approx(0.0)
    predicted = T([[1.5, 2.0, 3.0, 3.5]])                      # residuals .5, 0, 0, -.5: var 0.125 of var 1.25
    assert explained_variance(predicted, returns, full) == pytest.approx(1 - 0.125 / 1.25)


@pytest.fixture()
def ppo_parts(world_of_one, tiny_assets):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    plugin = TorchDDPPlugin()
    actor_booster, critic_booster = Booster(plugin=plugin), Booster(plugin=TorchDDPPlugin())
    actor = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    actor_optim = torch.optim.AdamW(actor.parameters(), lr=1e-3)
    actor, actor_optim, *_ = actor_booster.boost(actor, actor_optim)
    critic = load_critic(str(tiny_assets["model"]), tokenizer.pad_token_id)
    critic_optim = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    critic, critic_optim, *_ = critic_booster.boost(critic, critic_optim)
    reward_model = load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    engine = HFEngine(actor.unwrap(), tokenizer.pad_token_id, [tokenizer.eos_token_id])
    loader = build_dataloader(plugin, load_prepared([tiny_assets["prompt_train"]], "prompt"), 4,
                              PromptCollator(tokenizer.pad_token_id), True, 0)
    return dict(tokenizer=tokenizer, actor=actor, actor_optim=actor_optim, actor_booster=actor_booster, critic=critic,
                critic_optim=critic_optim, critic_booster=critic_booster, reward_model=reward_model,
                reference=reference, engine=engine, loader=loader)


def _maker(parts, whiten_advantages=True, rm_weight=1.0, teacher=None):
    config = PPOConfig(sampling=SamplingConfig(max_new_tokens=8), kl_estimator="k1", gamma=0.9,
                           lam=0.8, whiten_advantages=whiten_advantages)
    scorer = Scorer(parts["tokenizer"], WeightedReward.from_specs(["math_answer"]), parts["reward_model"],
                    reward_model_weight=rm_weight)
    return PPOExperienceMaker(parts["actor"], parts["critic"], parts["engine"], scorer, config, parts["reference"],
                              kl_controller=KLController(0.1), teacher=teacher)


def test_ppo_experience_from_real_models(ppo_parts):
    """Token rewards: the score on the last token, minus the KL penalty, plus a distillation teacher's term."""
    prompts = CyclingLoader(ppo_parts["loader"], torch.device("cpu"))
    teacher_model = build_tiny_llama(ppo_parts["tokenizer"], seed=1).eval()
    teacher = ModelTeacher(teacher_model, DistillConfig(coef=0.5), len(ppo_parts["tokenizer"]))
    maker = _maker(ppo_parts, whiten_advantages=False, rm_weight=0.5, teacher=teacher)
    experience = LocalRollouts(maker, prompts).next(0, StatsTracker())
    mask = experience.action_mask
    seq, attn, start = experience.sequences, experience.attention_mask, experience.prompt_length
    with torch.no_grad():
        rm_scores = sequence_rewards(ppo_parts["reward_model"], seq, attn)
        values = action_values(ppo_parts["critic"], seq, attn, start) * mask
    components = experience.reward_components
    assert components["reward_model"] == pytest.approx(rm_scores.tolist(), abs=1e-5)
    assert experience.rewards.tolist() == pytest.approx((0.5 * rm_scores + T(components["math_answer"])).tolist(),
                                                        abs=1e-5)   # --rm_weight 0.5; the component stays unweighted
    assert torch.allclose(experience.values, values, atol=1e-5)
    with torch.no_grad():
        teacher_logps = action_logps(teacher_model, seq, attn, start)
    reverse_kl = (experience.action_log_probs - teacher_logps) * mask
    assert reverse_kl.abs().max() > 0.1
    token_rewards = last_token_rewards(experience.rewards, mask) - 0.1 * experience.kl - 0.5 * reverse_kl
    advantages, returns = compute_gae(token_rewards, values, mask, 0.9, 0.8)
    assert torch.allclose(experience.advantages, advantages, atol=1e-5)
    assert torch.allclose(experience.returns, returns, atol=1e-5)
    assert torch.allclose(experience.kl, (experience.action_log_probs - experience.ref_log_probs) * mask, atol=1e-6)


def test_ppo_trainer_fires_hooks_logs_metrics_and_checkpoints_the_critic(ppo_parts, tmp_path):
    parts, recorder = ppo_parts, Recorder()

    def trainer():
        return PPOTrainer(parts["actor"], parts["actor_optim"], parts["actor_booster"], _maker(parts), parts["loader"],
                          critic=CriticParts(parts["critic"], parts["critic_optim"], parts["critic_booster"]),
                          callbacks=[recorder],
                          config=OnPolicyConfig(checkpoints=CheckpointSettings(save_interval=2, save_dir=str(tmp_path / "ckpt")),
                                                sample_log_interval=2))

    first = trainer()
    first.fit(num_episodes=2, num_collect_steps=1, num_update_steps=2, metrics_logger=MetricsLogger(str(tmp_path / "logs")))
    names = [name for name, _ in recorder.events if name not in ("on_log", "on_checkpoint_saved")]
    episode = (["on_episode_start", "on_make_experience_start", "on_make_experience_end"]
               + ["on_update_pass_start", "on_learn_epoch_start", "on_update_batch_start", "on_learn_batch_start",
                  "on_update_batch_end", "on_learn_batch_end", "on_update_pass_end", "on_learn_epoch_end"] * 2
               + ["on_episode_end"])
    assert names == ["on_fit_start"] + episode * 2 + ["on_fit_end"]
    logged = [args[1] for name, args in recorder.events if name == "on_log"][-1]
    expected = {"reward", "reward_std", "reward_p05", "reward_p50", "reward_p95", "rewards/reward_model/mean",
                "rewards/math_answer/std", "advantages/mean", "advantages/std", "completions/mean_length_sampled",
                "completions/max_length_terminated", "completions/clipped_frac", "kl", "clip_ratio", "policy_entropy",
                "loss/value", "explained_variance", "grad_norm", "grad_norm/critic", "learning_rate", "num_tokens",
                "time/generation", "time/reference_forward", "time/critic_forward", "time/reward", "time/learning"}
    assert {f"train/{k}" for k in expected} <= logged.keys()
    assert logged["train/reward_p05"] <= logged["train/reward_p50"] <= logged["train/reward_p95"]
    assert logged["train/num_tokens"] == first.tokens_seen > 0
    table = json.loads((tmp_path / "logs" / "rich_completions" / "completions_step_000002.json").read_text())
    assert len(table["data"]) == 4
    assert {"prompt", "completion", "reward", "math_answer", "math_answer/timeouts", "math_answer/errors", "reward_model",
            "advantage"} == set(table["columns"])

    checkpoint = tmp_path / "ckpt" / "epoch-0_step-2"
    assert (checkpoint / "critic" / "modeling").is_dir() and (checkpoint / "critic" / "optimizer.bin").is_file()
    saved = {k: v.clone() for k, v in parts["critic"].unwrap().state_dict().items()}
    with torch.no_grad():
        for p in parts["critic"].parameters():
            p.add_(1.0)
    second = trainer()
    second.load_checkpoint(str(checkpoint))
    assert second.start_episode == 2 and second.tokens_seen == first.tokens_seen
    for name, value in parts["critic"].unwrap().state_dict().items():
        assert torch.equal(value, saved[name]), name


def test_during_the_critic_warmup_only_the_critic_learns(ppo_parts):
    parts = ppo_parts
    actor_before = {k: v.clone() for k, v in parts["actor"].unwrap().state_dict().items()}
    critic_before = {k: v.clone() for k, v in parts["critic"].unwrap().state_dict().items()}
    trainer = PPOTrainer(parts["actor"], parts["actor_optim"], parts["actor_booster"], _maker(parts), parts["loader"],
                         critic=CriticParts(parts["critic"], parts["critic_optim"], parts["critic_booster"],
                                            settings=CriticSettings(critic_warmup_episodes=2)))
    trainer.fit(num_episodes=2, num_collect_steps=1, num_update_steps=1, metrics_logger=MetricsLogger(None))
    assert all(torch.equal(v, actor_before[k]) for k, v in parts["actor"].unwrap().state_dict().items())
    assert not all(torch.equal(v, critic_before[k]) for k, v in parts["critic"].unwrap().state_dict().items())
    assert trainer.global_step == 0
    trainer.fit(num_episodes=3, num_collect_steps=1, num_update_steps=1, metrics_logger=MetricsLogger(None))
    assert not all(torch.equal(v, actor_before[k]) for k, v in parts["actor"].unwrap().state_dict().items())


def test_an_optimizer_takes_the_lr_it_is_given_else_the_flag_s():
    """The runner builds PPO's critic optimizer at --critic_lr this way, without a second copy of the flags."""
    from argparse import Namespace

    from coati.cli.runner import build_optimizer

    model, flags = torch.nn.Linear(2, 1), Namespace(lr=1e-3, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
                                                 adam_epsilon=1e-8)
    assert build_optimizer(model, flags).param_groups[0]["lr"] == 1e-3
    assert build_optimizer(model, flags, lr=5e-4).param_groups[0]["lr"] == 5e-4
