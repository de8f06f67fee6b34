"""The algorithm registries: RLOO, REINFORCE++, GSPO, MaxEnt weighting, the adaptive KL controller and DAPO's
overlong shaping against hand-computed values, the KL and entropy terms under --loss_agg, a bad name refused with
the choices, DAPO's dynamic sampling, and an advantage estimator added from outside the package that a GRPO step
trains with."""
import json
import math

import pytest
import torch

from coati.experience.advantages import AdvantageConfig
from coati.experience.controllers import KLController
from coati.models.loss import PolicyLoss, PolicyLossConfig
from coati.utils.registry import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, Entry
from coati.trainer.callbacks import Callback
from coati.utils.errors import CoatiUsageError
from coati.utils.metrics_logger import MetricsLogger
from conftest import unknown_metrics
from support import grpo_trainer

T = torch.tensor


def test_rloo_baseline_is_the_mean_of_the_other_rewards():
    advantages = ADVANTAGE_ESTIMATORS.get("rloo")(T([1.0, 0.0, 0.0, 2.0]), AdvantageConfig(4))
    # r_i - (sum - r_i) / 3: 1 - 2/3, 0 - 1, 0 - 1, 2 - 1/3
    assert advantages.tolist() == pytest.approx([1 / 3, -1.0, -1.0, 5 / 3])
    assert ADVANTAGE_ESTIMATORS.get("rloo")(T([3.0, 1.0, 5.0, 5.0]), AdvantageConfig(2)).tolist() == pytest.approx([2.0, -2.0, 0.0, 0.0])


def test_reinforce_pp_normalises_over_the_whole_batch_not_the_group():
    rewards = T([1.0, 0.0, 3.0, 4.0])                       # mean 2, population std sqrt(2.5)
    advantages = ADVANTAGE_ESTIMATORS.get("reinforce_pp")(rewards, AdvantageConfig(2))
    assert advantages.tolist() == pytest.approx([(r - 2) / math.sqrt(2.5) for r in (1, 0, 3, 4)], rel=1e-5)
    assert ADVANTAGE_ESTIMATORS.get("reinforce_pp")(rewards, AdvantageConfig(2, scale_rewards=False)).tolist() == [-1.0, -2.0, 1.0, 2.0]


def test_gspo_clips_one_sequence_level_ratio():
    logps, old = T([[-1.0, -2.0, 0.0]]), T([[-1.2, -1.6, -5.0]])
    mask = T([[1.0, 1.0, 0.0]])
    ratio = POLICY_LOSSES.get("gspo")(logps, old, T([[1.0]]), mask, PolicyLossConfig()).ratio
    s = math.exp(((0.2) + (-0.4)) / 2)                     # exp of the mean token log-ratio, padding left out
    assert ratio.tolist() == [pytest.approx([s, s, s])]
    gspo = PolicyLoss(0.05, loss="gspo", aggregation="seq-mean-token-mean")
    loss, stats = gspo(logps, old, T([1.0]), mask)           # s = e^-0.1 ~ 0.905, below 1 - 0.05
    assert loss.item() == pytest.approx(-s) and stats["clip_ratio/low"].item() == 0.0   # -min(s A, 0.95 A), A = 1
    loss, stats = gspo(logps, old, T([-1.0]), mask)
    assert loss.item() == pytest.approx(0.95) and stats["clip_ratio/low"].item() == 1.0  # the clip binds for A < 0


def test_cispo_truncates_and_stops_the_importance_weight_but_keeps_every_token_s_gradient():
    logps = T([[-1.0, -2.0]]).requires_grad_()
    old, mask = T([[-1.5, -1.0]]), T([[1.0, 1.0]])
    r1, r2 = math.exp(0.5), math.exp(-1.0)                  # 1.6487 is truncated at 1 + 0.2; 0.3679 is kept
    loss, stats = PolicyLoss(0.2, loss="cispo")(logps, old, T([1.0]), mask)
    # l_t = -sg(min(r_t, 1.2)) A log pi_t, token-mean
    assert loss.item() == pytest.approx((1.2 * 1.0 + r2 * 2.0) / 2, rel=1e-6)
    loss.backward()
    assert logps.grad.tolist() == [pytest.approx([-1.2 / 2, -r2 / 2], rel=1e-6)]
    assert stats["clip_ratio/high"].item() == 0.5 and stats["clip_ratio/low"].item() == 0.0
    ppo_logps = T([[-1.0, -2.0]]).requires_grad_()
    PolicyLoss(0.2)(ppo_logps, old, T([1.0]), mask)[0].backward()
    assert ppo_logps.grad[0, 0].item() == 0.0 and r1 > 1.2   # PPO's clip leaves the same token no gradient


def test_sapo_gates_softly_with_the_temperature_of_the_advantage_s_sign():
    def sigmoid(x):
        return 1 / (1 + math.exp(-x))

    old, mask = T([[-1.2, -1.0]]), T([[1.0, 1.0]])
    r = [math.exp(0.2), math.exp(-1.0)]
    for advantage, tau in ((1.0, 1.0), (-2.0, 1.05)):       # temperature_pos = 1.0, temperature_neg = 1.05
        logps = T([[-1.0, -2.0]]).requires_grad_()
        loss, stats = PolicyLoss(loss="sapo")(logps, old, T([advantage]), mask)
        gate = [4 / tau * sigmoid(tau * (x - 1)) for x in r]          # f(r) = (4 / tau) sigmoid(tau (r - 1))
        assert loss.item() == pytest.approx(-advantage * sum(gate) / 2, rel=1e-6)
        loss.backward()                                    # d l / d log pi = -A f'(r) r, f'(r) = 4 s (1 - s)
        grads = [-advantage * 4 * sigmoid(tau * (x - 1)) * (1 - sigmoid(tau * (x - 1))) * x / 2 for x in r]
        assert logps.grad.tolist() == [pytest.approx(grads, rel=1e-5)]
        assert stats["clip_ratio/region"].item() == 0.0
    on_policy = T([[-1.0, -2.0]]).requires_grad_()
    PolicyLoss(loss="sapo", options={"temperature_pos": 3.0})(on_policy, on_policy.detach(), T([1.0]), mask)[0].backward()
    assert on_policy.grad.tolist() == [pytest.approx([-0.5, -0.5])]   # at r = 1 it is the policy gradient, any tau


def test_ppos_dual_clip_bounds_a_negative_advantages_loss_and_leaves_that_token_no_gradient(world_of_one,
                                                                                           tiny_assets, tmp_path):
    """-A max(r, clip(r)) for A < 0, at most -c A with dual_clip c (verl's clip_ratio_c): ratios 5, 1, 2 at A = -1
    lose 3, 1, 2 with c = 3 (5, 1, 2 without); the bounded token has no gradient; A > 0 is not bounded; a GRPO step
    logs the bounded share under a catalogued name."""
    old, mask = torch.log(T([[0.2, 1.0, 0.5]])), T([[1.0, 1.0, 1.0]])
    for options, expected, grads, dual in (({}, 8 / 3, [5 / 3, 1 / 3, 2 / 3], None),
                                           ({"dual_clip": 3.0}, 2.0, [0.0, 1 / 3, 2 / 3], 1 / 3)):
        logps = torch.zeros(1, 3, requires_grad=True)
        loss, stats = PolicyLoss(0.2, options=options)(logps, old, T([-1.0]), mask)
        assert loss.item() == pytest.approx(expected)
        loss.backward()
        assert logps.grad.tolist() == [pytest.approx(grads)]
        assert (stats["clip_ratio/dual"].item() if dual else stats.get("clip_ratio/dual")) == pytest.approx(dual)
    loss, stats = PolicyLoss(0.2, options={"dual_clip": 3.0})(torch.zeros(1, 3), old, T([1.0]), mask)
    assert loss.item() == pytest.approx(-(1.2 + 1.0 + 1.2) / 3) and stats["clip_ratio/dual"].item() == 0.0
    with pytest.raises(CoatiUsageError, match="policy loss 'gspo' takes no option 'dual_clip'"):
        PolicyLoss(loss="gspo", options={"dual_clip": 3.0})
    trainer = grpo_trainer(tiny_assets, policy_loss=PolicyLoss(options={"dual_clip": 3.0}))
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1,
                metrics_logger=MetricsLogger(str(tmp_path / "logs")))
    logged = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert "train/clip_ratio/dual_mean" in logged[-1] and not unknown_metrics(logged)


def test_reinforce_pp_baseline_takes_the_group_mean_off_then_divides_by_the_batch_std():
    rewards = T([1.0, 3.0, 0.0, 8.0])                       # groups of 2: centred -1, 1, -4, 4; batch std sqrt(8.5)
    advantages = ADVANTAGE_ESTIMATORS.get("reinforce_pp_baseline")(rewards, AdvantageConfig(2))
    assert advantages.tolist() == pytest.approx([c / math.sqrt(8.5) for c in (-1, 1, -4, 4)], rel=1e-5)


def test_gmpo_clips_each_token_ratio_in_log_space_and_takes_their_geometric_mean():
    """s = exp(mean_t sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t, -0.4, 0.4))), l = -A s on every token: for A > 0
    a log-ratio above 0.4 counts as 0.4 and one below -0.4 as itself; for A < 0 the other way round."""
    logps, old, mask = T([[0.0, 0.0, 0.0]]), T([[-1.0, 0.2, 0.0]]), T([[1.0, 1.0, 1.0]])   # log r = 1, -0.2, 0
    loss = PolicyLoss(0.4, loss="gmpo", aggregation="seq-mean-token-mean")
    value, stats = loss(logps, old, T([2.0]), mask)
    assert value.item() == pytest.approx(-2.0 * math.exp((0.4 - 0.2 + 0.0) / 3), rel=1e-6)
    assert stats["clip_ratio/high"].item() == pytest.approx(1 / 3)
    value, stats = loss(logps, T([[1.0, 0.2, 0.0]]), T([-1.0]), mask)                   # log r = -1, -0.2, 0
    assert value.item() == pytest.approx(math.exp((-0.4 - 0.2) / 3), rel=1e-6)
    assert stats["clip_ratio/low"].item() == pytest.approx(1 / 3)


def test_cispos_floor_raises_low_weights_and_is_off_by_default():
    logps, old, mask = T([[-1.0, -2.0]]), T([[-0.5, -2.0]]), T([[1.0, 1.0]])             # r = e^-0.5 ~ 0.61, 1
    plain, _ = PolicyLoss(0.2, loss="cispo")(logps, old, T([1.0]), mask)
    floored, stats = PolicyLoss(0.2, loss="cispo", options={"floor": 0.8})(logps, old, T([1.0]), mask)
    assert plain.item() == pytest.approx((math.exp(-0.5) * 1.0 + 2.0) / 2, rel=1e-6)
    assert floored.item() == pytest.approx((0.8 * 1.0 + 2.0) / 2, rel=1e-6) and stats["clip_ratio/low"].item() == 0.5


def test_kl_in_reward_subtracts_beta_times_each_completions_summed_kl_before_the_advantages(world_of_one,
                                                                                           tiny_assets):
    """--kl_in_reward: advantages of r_i - beta sum_t KL_it (verl's use_kl_in_reward for GRPO and RLOO), the logged
    rewards the scores alone, and no KL term in the loss; a group tied on its scores gets advantages from its KL."""
    from coati.experience.experience import Experience
    from coati.trainer.components import KLTerm

    trainer = grpo_trainer(tiny_assets, maker_config={"num_generations": 2, "kl_in_reward": True})
    maker = trainer.maker
    terms = [t for t in trainer.loss_terms if isinstance(t, KLTerm)]
    assert trainer.kl_controller is maker.kl_controller and [t.in_loss for t in terms] == [False]
    maker.kl_controller.value = 0.5
    mask = torch.ones(4, 2, dtype=torch.bool)
    kl = T([[0.2, 0.2], [0.1, 0.0], [0.3, 0.1], [0.0, 0.0]])
    experience = Experience(torch.zeros(4, 4, dtype=torch.long), torch.ones(4, 4, dtype=torch.long), mask, 2, None,
                            T([1.0, 0.0, 1.0, 1.0]), torch.zeros(4), kl=kl)
    made = maker._with_advantages(experience)
    scored = T([1.0 - 0.5 * 0.4, 0.0 - 0.5 * 0.1, 1.0 - 0.5 * 0.4, 1.0])
    expected = ADVANTAGE_ESTIMATORS.get("grpo")(scored, AdvantageConfig(2))
    assert torch.allclose(made.advantages, expected) and made.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert made.advantages[2] < 0 < made.advantages[3]   # tied scores, the one further from the reference loses
    with pytest.raises(ValueError, match="give the KLController to GRPOExperienceMaker"):   # one owner of beta
        grpo_trainer(tiny_assets, maker_config={"num_generations": 2, "kl_in_reward": True},
                     kl_controller=KLController(0.1))


def test_a_grpo_run_with_the_kl_in_its_reward_logs_the_kl_and_no_kl_loss(world_of_one, tiny_assets, tmp_path):
    from coati.cli import commands
    from support import run_main

    argv = ["--pretrain", str(tiny_assets["model"]), "--prompt_dataset", str(tiny_assets["prompt_train"]),
            "--plugin", "ddp", "--batch_size", "2", "--num_generations", "2", "--max_new_tokens", "4",
            "--num_episodes", "2", "--reward_fn", "math_answer", "--adv_estimator", "rloo", "--kl_in_reward"]
    result = run_main(commands.grpo, [*argv, "--kl_coef", "0.1", "--log_dir", str(tmp_path / "logs")])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in logged if "train/loss" in r]
    assert len(train) == 2 and all("train/kl" in r and "train/loss/kl" not in r and r["train/beta"] == 0.1
                                   for r in train)
    refused = run_main(commands.grpo, argv)
    assert refused.returncode == 2 and "--kl_coef 0.0: --kl_in_reward subtracts it times each completion's KL to " \
                                       "the reference from its reward; give it above 0" in refused.stderr


def test_kl_and_entropy_terms_follow_the_loss_aggregation():
    loss = PolicyLoss(aggregation="seq-mean-token-mean")
    values, mask = T([[1.0, 3.0], [2.0, 0.0]]), T([[1.0, 1.0], [1.0, 0.0]])
    assert loss.aggregate(values, mask).item() == pytest.approx((2.0 + 2.0) / 2)
    assert PolicyLoss().aggregate(values, mask).item() == pytest.approx(6.0 / 3)
    assert set(AGGREGATIONS.names()) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(CoatiUsageError, match="unknown advantage estimator 'nope'; expected one of grpo, rloo"):
        ADVANTAGE_ESTIMATORS.get("nope")
    with pytest.raises(CoatiUsageError, match="cannot be imported"):
        ADVANTAGE_ESTIMATORS.get("no_such_module:fn")


def margin_sign_advantages(rewards: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """A toy estimator written outside coati, with a hyperparameter of its own: +1 more than `margin` above the group's
    mean, -1 more than `margin` below it, 0 between."""
    groups = rewards.view(-1, config.group_size)
    centred = groups - groups.mean(-1, keepdim=True)
    margin = config.options["margin"]
    return ((centred > margin).float() - (centred < -margin).float()).reshape(-1)


def test_an_estimator_with_its_own_hyperparameter_from_outside_the_package_trains(world_of_one, tiny_assets,
                                                                                   monkeypatch):

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS._entries, "margin_sign", Entry(margin_sign_advantages, options=("margin",)))
    trainer = grpo_trainer(tiny_assets, maker_config={"advantage_estimator": "margin_sign",
                                                      "advantage_options": {"margin": 0.3}})
    seen = []
    original = trainer._learn_step
    monkeypatch.setattr(trainer, "_learn_step", lambda experience: seen.append(experience) or original(experience))
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1)
    groups = seen[0].rewards.view(-1, 4)
    centred = (groups - groups.mean(-1, keepdim=True)).reshape(-1)
    expected = [1.0 if c > 0.3 else -1.0 if c < -0.3 else 0.0 for c in centred.tolist()]
    assert seen[0].advantages.tolist() == expected and trainer.global_step == 1
    assert trainer.maker.advantage_estimator is margin_sign_advantages   # the one named, not GRPO's default
    assert ADVANTAGE_ESTIMATORS.get("test_algorithms:margin_sign_advantages") is margin_sign_advantages


# ---- MaxEnt weighting, adaptive KL, overlong shaping, dynamic sampling --------------------------------------

def test_maxent_advantages_are_n_times_the_softmax_weight_minus_one():
    advantages = ADVANTAGE_ESTIMATORS.get("maxent")(T([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]), AdvantageConfig(4, options={"tau": 1.0}))
    # w = (e, 1, 1, 1) / (e + 3) = (0.475367, 0.174878, ...): A = 4w - 1; a tied group has uniform weights, A = 0
    assert advantages.tolist() == pytest.approx([0.901467, -0.300489, -0.300489, -0.300489, 0, 0, 0, 0], abs=1e-5)
    sharp = ADVANTAGE_ESTIMATORS.get("maxent")(T([1.0, 0.0]), AdvantageConfig(2, options={"tau": 0.01}))      # tau -> 0: best-of-n
    assert sharp.tolist() == pytest.approx([1.0, -1.0], abs=1e-6)


def test_temperature_controller_moves_tau_towards_the_target_entropy():
    from types import SimpleNamespace
    from coati.experience.controllers import TemperatureController

    experience = SimpleNamespace(rewards=T([1.0, 0.0, 3.0, 3.0]))
    controller = TemperatureController(1.0, target_entropy=1.0, lr=0.5)
    metrics = controller.observe([experience], 2)
    # group (1, 0): w = (0.731059, 0.268941), H / ln 2 = 0.839943; group (3, 3): uniform, 1
    assert metrics["maxent/weight_entropy"] == pytest.approx((0.839943 + 1.0) / 2, abs=1e-5)
    assert metrics["maxent/weighted_reward"] == pytest.approx((0.731059 + 3.0) / 2, abs=1e-5)
    assert metrics["maxent/plain_reward"] == pytest.approx((0.5 + 3.0) / 2)
    assert metrics["maxent/tau"] == 1.0                                 # the tau the episode used
    assert controller.value == pytest.approx(math.exp(0.5 * (1.0 - 0.919971)), abs=1e-5)   # 1.040826: flatter
    fixed = TemperatureController(2.0)
    fixed.observe([experience], 2)
    assert fixed.value == 2.0


def test_adaptive_kl_controller_follows_the_instructgpt_update():
    from coati.experience.controllers import KLController

    controller = KLController(0.1, target=6.0, horizon=1000)
    controller.update(kl=9.0, completions=100)             # e = clip(0.5, +-0.2) = 0.2: 0.1 * (1 + 0.2 * 0.1)
    assert controller.value == pytest.approx(0.102) and controller.error == pytest.approx(0.2)
    controller.update(kl=5.4, completions=100)             # e = -0.1: 0.102 * 0.99
    assert controller.value == pytest.approx(0.10098)
    assert controller.metrics() == pytest.approx({"kl_ctl/value": 0.10098, "kl_ctl/target": 6.0, "kl_ctl/error": -0.1})
    fixed = KLController(0.05)
    fixed.update(kl=100.0, completions=100)
    assert fixed.value == 0.05 and fixed.metrics() == {"kl_ctl/value": 0.05}
    with pytest.raises(ValueError, match="starting value above 0"):
        KLController(0.0, target=6.0)


def test_overlong_penalty_is_dapos_soft_punishment():
    from coati.experience.shaping import REWARD_SHAPERS, shape_rewards
    from coati.config import ShapingConfig

    lengths = T([10, 15, 16, 18, 20])
    # L_max 20, L_cache 5: 0 up to 15 tokens, then (15 - L) / 5 down to -1 at 20
    assert REWARD_SHAPERS.get("overlong")(lengths, ShapingConfig(20, 5)).tolist() == pytest.approx([0, 0, -0.2, -0.6, -1.0])
    assert REWARD_SHAPERS.get("overlong")(lengths, ShapingConfig(20, 5, 0.5)).tolist() == pytest.approx([0, 0, -0.1, -0.3, -0.5])
    assert REWARD_SHAPERS.get("overlong")(T([12, 16]), ShapingConfig(16)).tolist() == pytest.approx([0, -1.0])  # buffer 16 / 4
    components = {"math_answer": [1.0] * 5}
    shaped = shape_rewards(T([1.0] * 5), components, lengths, ["overlong"], ShapingConfig(20, 5))
    assert shaped.tolist() == pytest.approx([1, 1, 0.8, 0.4, 0]) and components["overlong"] == pytest.approx([0, 0, -0.2, -0.6, -1])


class LogRecorder(Callback, list):
    """The metrics of every `on_log`, in order."""

    def on_log(self, step, metrics):
        self.append(metrics)


def constant_reward(prompts, completions, **_):
    """A reward that ties every group (dynamic sampling has nothing to keep)."""
    return [0.5] * len(completions)


def _group(rewards, first_token):
    from coati.rollout import RolloutSample, scored

    n = len(rewards)
    samples = [RolloutSample([5], [first_token + i, 7], [True, True], None, [0, 0]) for i in range(n)]
    return scored(samples, ["p"] * n, [f"c{first_token + i}" for i in range(n)], (list(rewards), {"r": list(rewards)}), 0)


def test_dynamic_sampling_replaces_tied_groups_with_new_prompts(world_of_one, tiny_assets):

    trainer = grpo_trainer(tiny_assets, maker_config={"num_generations": 2, "max_sampling_rounds": 2})
    source = trainer.source
    batch = [_group([1.0, 1.0], 10), _group([0.0, 1.0], 12)]                       # tied, informative
    more = iter([[_group([0.0, 0.0], 20), _group([1.0, 1.0], 22)], [_group([1.0, 0.0], 30), _group([3.0, 3.0], 32)]])
    source._rollouts = lambda: next(more)
    kept, extra = source._informative(batch)
    assert extra == 8                                          # two more batches of 4 completions were needed
    assert [t.completions for t in kept] == [["c12", "c13"], ["c30", "c31"]]
    only_ties = iter([[_group([0.0, 0.0], 20), _group([1.0, 1.0], 22)]] * 2)
    source._rollouts = lambda: next(only_ties)
    kept, extra = source._informative([_group([1.0, 1.0], 10), _group([0.0, 1.0], 12)])
    assert extra == 8 and [t.completions[0] for t in kept] == ["c12", "c10"]   # out of rounds: a tied group fills


def test_mask_truncated_completions_masks_the_loss_of_completions_cut_at_the_limit_not_their_advantages(
        world_of_one, tiny_assets):
    """DAPO's (TRL's `mask_truncated_completions`): a completion without its stop token trains on nothing; the
    group's advantages are those of the unmasked run."""
    from coati.rollout import RolloutSample, scored

    def made(mask_truncated):
        trainer = grpo_trainer(tiny_assets, maker_config={"num_generations": 2,
                                                          "mask_truncated_completions": mask_truncated})
        eos = trainer.maker.tokenizer.eos_token_id
        samples = [RolloutSample([5], [11, eos], [True, True], None, [0, 0]),      # ended with its stop token
                   RolloutSample([5], [12, 13], [True, True], None, [0, 0])]       # cut at the length limit
        group = scored(samples, ["p", "p"], ["a", "b"], ([1.0, 0.0], {"r": [1.0, 0.0]}), 0)
        return trainer.maker.from_trajectories([group], torch.device("cpu"))

    masked, plain = made(True), made(False)
    assert masked.terminated.tolist() == [True, False]
    assert masked.loss_mask[0].tolist() == masked.action_mask[0].tolist() and not masked.loss_mask[1].any()
    assert plain.loss_mask.tolist() == plain.action_mask.tolist()
    assert torch.equal(masked.advantages, plain.advantages) and masked.advantages[1] < 0


def test_dynamic_sampling_in_training_logs_its_extra_rollouts(world_of_one, tiny_assets, tmp_path):
    from coati.rewards import WeightedReward
    from coati.utils.metrics_logger import MetricsLogger

    trainer = grpo_trainer(tiny_assets, maker_config={"dynamic_sampling": True, "max_sampling_rounds": 2})
    trainer.maker.scorer.reward_fn = WeightedReward.from_specs(["test_algorithms:constant_reward"])
    logged = LogRecorder()
    trainer.callbacks.append(logged)
    trainer.fit(num_episodes=1, num_collect_steps=1, num_update_steps=1, metrics_logger=MetricsLogger(str(tmp_path)))
    # 2 prompts x 4 completions, every group tied: 2 more batches were drawn, then the tied groups fill the batch
    assert logged[0]["train/dynamic_sampling/extra_rollouts"] == 16
    assert logged[0]["train/epoch"] == pytest.approx(6 / 8)     # 6 of the 8 prompts were drawn
    assert trainer.prompts.seen == 6


def test_adaptive_coefficients_are_logged_and_resume_from_checkpoints(world_of_one, tiny_assets, tmp_path):
    from coati.config import CheckpointSettings, OnPolicyConfig
    from coati.experience.controllers import KLController, TemperatureController
    from coati.models.reference import load_reference_model
    from coati.utils.metrics_logger import MetricsLogger

    def trainer():
        made = grpo_trainer(tiny_assets, config=OnPolicyConfig(checkpoints=CheckpointSettings(save_dir=str(tmp_path / "ckpt"))),
                             kl_controller=KLController(0.1, target=0.001, horizon=8),
                             maker_config={"advantage_estimator": "maxent"})
        made.maker.ref_model = load_reference_model(tiny_assets["model"], torch.device("cpu"))
        made.maker.temperature = TemperatureController(1.0, target_entropy=0.5, lr=0.5)
        made._adapt("maxent", made.maker.temperature)
        return made

    first = trainer()
    logged = LogRecorder()
    first.callbacks.append(logged)
    first.fit(num_episodes=2, num_collect_steps=1, num_update_steps=1, metrics_logger=MetricsLogger(str(tmp_path / "l")))
    assert logged[0]["train/kl_ctl/value"] == pytest.approx(0.1) and logged[0]["train/maxent/tau"] == 1.0
    assert {"train/kl_ctl/error", "train/maxent/weight_entropy", "train/maxent/weighted_reward"} <= set(logged[0])
    assert logged[1]["train/beta"] == pytest.approx(first.kl_controller.value)
    assert first.kl_controller.value != pytest.approx(0.1) and first.maker.temperature.value != 1.0
    resumed = trainer()
    resumed.load_checkpoint(str(sorted((tmp_path / "ckpt").iterdir())[-1]))
    assert resumed.kl_controller.value == first.kl_controller.value
    assert resumed.maker.temperature.value == first.maker.temperature.value


def test_every_built_in_is_declared_once_with_its_registry_and_imports_to_a_callable():
    """A registry declares each built-in's function, help and options; the first `get` imports the function."""
    from coati.utils import registry

    tables = [value for value in vars(registry).values() if isinstance(value, registry.Registry)]
    assert len(tables) == 12
    for table in tables:
        for name in table.names():
            assert callable(table.get(name)), (table.kind, name)


def test_a_part_registered_before_the_parser_is_built_is_listed_in_help_and_its_options_are_checked(monkeypatch,
                                                                                                    capsys):
    """`--help`'s choices and descriptions come from the registry, so a part of one's own shows there with what it
    does; its declared options are checked like the built-ins'."""
    from coati.cli.commands import grpo
    from coati.utils.errors import CoatiUsageError

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS._entries, "margin_sign", Entry(
        margin_sign_advantages, "+1 or -1 beyond a margin around the group mean", ("margin",)))
    with pytest.raises(SystemExit):
        grpo(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "grpo | rloo | reinforce_pp | reinforce_pp_baseline | maxent | process | margin_sign | package.module:function" \
        in help_text
    assert "margin_sign: +1 or -1 beyond a margin around the group mean" in help_text
    ADVANTAGE_ESTIMATORS.check_options("margin_sign", {"margin": 0.3}, "--adv_option")
    with pytest.raises(CoatiUsageError, match=r"^--adv_option: advantage estimator 'margin_sign' takes no option "
                                              r"'margn'; its options: margin$"):
        ADVANTAGE_ESTIMATORS.check_options("margin_sign", {"margn": 0.3}, "--adv_option")
