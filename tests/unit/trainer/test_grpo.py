"""GRPOTrainer in one process: hooks fire in order with real experiences; rewards reach the metrics."""
import argparse
from dataclasses import replace

import pytest
import torch

from coati.experience.experience import Experience
from coati.config import CheckpointSettings, EvalSettings, OnPolicyConfig, StepSettings
from coati.models.loss import PolicyLoss
from coati.utils.metrics_logger import MetricsLogger
from support import Recorder, grpo_trainer


def test_hooks_fire_in_order_with_real_experiences(world_of_one, tiny_assets, tmp_path):
    recorder = Recorder()
    trainer = grpo_trainer(tiny_assets, callbacks=[recorder])
    trainer.fit(num_episodes=2, num_collect_steps=2, num_update_steps=1,
                metrics_logger=MetricsLogger(str(tmp_path / "logs")))
    names = [name for name, _ in recorder.events]
    episode = (["on_episode_start"] + ["on_make_experience_start", "on_make_experience_end"] * 2
               + ["on_update_pass_start", "on_learn_epoch_start"]
               + ["on_update_batch_start", "on_learn_batch_start", "on_update_batch_end", "on_learn_batch_end"] * 2
               + ["on_update_pass_end", "on_learn_epoch_end", "on_log", "on_episode_end"])
    assert names == ["on_fit_start"] + episode * 2 + ["on_fit_end"]
    experiences = [args[0] for name, args in recorder.events if name == "on_make_experience_end"]
    for experience in experiences:
        assert isinstance(experience, Experience) and experience.sequences.size(0) == 2 * 4
        assert experience.action_log_probs.shape == experience.action_mask.shape
        assert torch.allclose(experience.advantages.view(-1, 4).sum(-1), torch.zeros(2), atol=1e-4)
    logged = [args[1] for name, args in recorder.events if name == "on_log"]
    assert [set(m) >= {"train/reward", "train/rewards/math_answer/mean", "train/rewards/answer_format/mean", "train/loss/policy"}
            for m in logged] == [True, True]


def test_on_episode_end_and_on_fit_end_fire_when_an_episode_raises(world_of_one, tiny_assets, monkeypatch):
    recorder = Recorder()
    trainer = grpo_trainer(tiny_assets, callbacks=[recorder])
    next_batch = trainer.source.next

    def fail_at_second_episode(episode, stats):
        if episode == 1:
            raise RuntimeError("generation failed")
        return next_batch(episode, stats)

    monkeypatch.setattr(trainer.source, "next", fail_at_second_episode)
    with pytest.raises(RuntimeError, match="generation failed"):
        trainer.fit(num_episodes=3, num_collect_steps=1, num_update_steps=1)
    names = [name for name, _ in recorder.events]
    assert names[-4:] == ["on_episode_start", "on_make_experience_start", "on_episode_end", "on_fit_end"]
    assert names.count("on_episode_end") == 2 and trainer.global_step == 1


def test_saver_and_evaluator_decide_by_steps_epochs_and_the_last_episode(world_of_one, tiny_assets, tmp_path):
    held_out = grpo_trainer(tiny_assets).prompts.dataloader
    config = OnPolicyConfig(checkpoints=CheckpointSettings(save_dir=str(tmp_path / "ckpt"), save_interval=4),
                            evaluation=EvalSettings(eval_freq_epochs=1))
    trainer = grpo_trainer(tiny_assets, config=config, eval_dataloader=held_out)
    trainer.fit(num_episodes=7, num_collect_steps=1, num_update_steps=1, metrics_logger=MetricsLogger(str(tmp_path / "logs")))
    assert sorted(trainer.eval_history) == [0, 4, 7]         # before training, when the 8 prompts are done, last
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch-0_step-4", "epoch-1_step-7"]


def test_micro_batches_with_accumulation_take_the_whole_batch_step(world_of_one, tiny_assets):
    """8 completions learned whole, or as 2 micro-batches of 4 accumulated into one step: the same update
    (with per-sequence loss aggregation the mean over the batch is the mean of the micro-batch means)."""
    policy_loss = lambda: PolicyLoss(aggregation="seq-mean-token-mean")
    whole = grpo_trainer(tiny_assets, torch.optim.SGD, policy_loss=policy_loss())
    parts = grpo_trainer(tiny_assets, torch.optim.SGD, policy_loss=policy_loss(),
                          config=OnPolicyConfig(train_batch_size=4, steps=StepSettings(accumulation_steps=2)))
    torch.manual_seed(0)
    collected = whole.source.next(0, whole.stats)
    experience = replace(collected, advantages=torch.linspace(-1.0, 1.0, collected.sequences.size(0)))   # untied: a gradient
    learned = Recorder()
    parts.callbacks.append(learned)
    for trainer in (whole, parts):
        trainer._update_pass(0, [experience])
        assert trainer.global_step == 1
    assert [args[0].sequences.size(0) for name, args in learned.events if name == "on_update_batch_end"] == [4, 4]
    for (name, a), b in zip(whole.actor.named_parameters(), parts.actor.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    moved = any(not torch.equal(a, b) for a, b in zip(whole.actor.parameters(),
                                                      grpo_trainer(tiny_assets).actor.parameters()))
    assert moved


def test_one_update_per_experience_takes_the_old_log_probs_from_the_learning_forward(world_of_one, tiny_assets):
    """Without the collection-time actor forward, an episode runs one forward fewer per collect step and learns
    exactly the same update (the old log-probs equal the learning forward's own)."""
    forwards, params = {}, {}
    for at_collection in (True, False):
        recorder = Recorder()
        trainer = grpo_trainer(tiny_assets, torch.optim.SGD, old_log_probs_at_collection=at_collection,
                                callbacks=[recorder])
        calls = []
        trainer.actor.unwrap().register_forward_hook(lambda *_: calls.append(1))
        torch.manual_seed(0)
        trainer.fit(num_episodes=1, num_collect_steps=2, num_update_steps=1)
        forwards[at_collection], params[at_collection] = len(calls), list(trainer.actor.parameters())
        made = [args[0] for name, args in recorder.events if name == "on_make_experience_end"]
        assert len(made) == 2 and all((e.action_log_probs is None) == (not at_collection) for e in made)
    assert forwards[True] - forwards[False] == 2
    for a, b in zip(params[True], params[False]):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_runner_drops_the_collection_forward_only_when_each_experience_gets_one_step():
    from coati.cli.rl_runner import _one_update_per_experience

    def flags(**changed):
        return argparse.Namespace(**{"batch_size": 2, "num_generations": 4, "num_collect_steps": 1, "train_batch_size": 0,
                                     "accumulation_steps": 1, "num_update_steps": 1, **changed})
    assert _one_update_per_experience(flags())
    assert not _one_update_per_experience(flags(num_update_steps=2))
    assert not _one_update_per_experience(flags(num_collect_steps=2))         # the 2nd batch is learned after a step
    assert _one_update_per_experience(flags(num_collect_steps=2, accumulation_steps=2))
    assert not _one_update_per_experience(flags(train_batch_size=4))
    assert _one_update_per_experience(flags(train_batch_size=4, accumulation_steps=2))


def test_num_train_epochs_becomes_the_episodes_whose_collect_steps_pass_over_the_prompts_that_often():
    from coati.cli.rl_runner import episodes_for_epochs

    assert episodes_for_epochs(1, 24, 1) == 24
    assert episodes_for_epochs(0.125, 24, 1) == 3
    assert episodes_for_epochs(2, 24, 3) == 16                               # 48 batches, 3 an episode
    assert episodes_for_epochs(1, 25, 2) == 13                               # the last pass rounded up to an episode
    assert episodes_for_epochs(0.01, 24, 1) == 1                             # at least one episode
    assert episodes_for_epochs(0.1, 30, 1) == 3                              # 0.1 x 30 is 3.0000000000000004
    # resumed: 12 episodes on 2 ranks (24 batches a pass) went half-way through the prompts; on 1 rank (48 a pass)
    # the other half takes 24 more, and a run past its passes has nothing left
    assert episodes_for_epochs(1, 48, 1, done=12, epochs_done=0.5) == 36
    assert episodes_for_epochs(1, 12, 1, done=12, epochs_done=0.5) == 18
    assert episodes_for_epochs(1, 24, 1, done=24, epochs_done=1.0) == 24
