"""The catalogue of logged metrics: every name the trainers log (TensorBoard, W&B, `metrics.jsonl`), as patterns where
a part of the name varies (`train/rewards/<function>/<stat>`), with what it means and which runs log it. The
reference page `docs/reference/metrics.md` is generated from it, and the tests check the names real runs log
against it."""
import re
from typing import NamedTuple, Optional


class Metric(NamedTuple):
    """A logged name (or pattern: `<...>` stands for one path part), what it means, and the runs that log it."""

    pattern: str
    meaning: str
    logged_by: str


ALL, SUPERVISED, ON_POLICY = "every trainer", "SFT, RM, DPO family, KTO, PRM", "GRPO, PPO"
CATALOGUE = (
    Metric("step", "the x-axis: optimizer steps (supervised) or episodes (on-policy)", ALL),
    Metric("train/epoch", "epochs done, as Hugging Face's Trainer counts them (1.5: half of the second); on-policy, "
                          "passes over the prompts", ALL),
    Metric("train/global_step", "optimizer steps so far", ALL),
    Metric("train/loss", "the training loss, the mean over the steps since the last log", ALL),
    Metric("train/grad_norm", "the global gradient norm before clipping", ALL),
    Metric("train/lr", "the learning rate", SUPERVISED),
    Metric("train/skipped_nonfinite_steps", "optimizer steps skipped for a NaN/inf loss or gradient "
                                            "(--skip_nonfinite)", ALL),
    Metric("train/accuracy", "share of pairs whose chosen response scores above the rejected one", "RM, DPO family"),
    Metric("train/chosen_rewards", "mean implicit (DPO) or model (RM) reward of the chosen responses", "RM, DPO family"),
    Metric("train/rejected_rewards", "mean reward of the rejected responses", "RM, DPO family"),
    Metric("train/margin", "mean chosen minus rejected reward", "RM, DPO family"),
    Metric("train/rewards/<kind>", "TRL's names of the DPO family's and KTO's numbers: chosen, rejected, margins, "
                                   "accuracies", "DPO family, KTO"),
    Metric("train/logps/<side>", "mean log-probability of the chosen or rejected responses", "DPO family, KTO"),
    Metric("train/learning_rate", "the policy's learning rate", ON_POLICY),
    Metric("train/num_tokens", "tokens trained on so far (prompts and completions)", ON_POLICY),
    Metric("train/num_completions", "completions sampled so far on every rank (dynamic sampling's extra rollouts "
                                     "included): the x axis on which RL algorithms compare fairly", ON_POLICY),
    Metric("train/reward", "mean reward of the episode's completions (all components, weighted)", ON_POLICY),
    Metric("train/reward_std", "its standard deviation", ON_POLICY),
    Metric("train/reward_p<q>", "its percentiles: 00, 05, 25, 50, 75, 95, 100", ON_POLICY),
    Metric("train/rewards/<component>/<stat>", "each reward function's, the reward model's (reward_model), the "
                                               "environment's (environment) or a judge's reward: mean, std and "
                                               "percentiles p00 ... p100", ON_POLICY),
    Metric("train/rewards/<component>/<diagnostic>/<stat>", "a reward function's diagnostics, logged, not added: "
                                                            "math_answer's timeouts and errors, code_tests' pass_rate, "
                                                            "no_code and the limits that stopped a run", ON_POLICY),
    Metric("train/frac_reward_zero_std", "share of groups whose rewards all tie (no learning signal)", "GRPO"),
    Metric("train/advantages/<stat>", "mean and std of the advantages", ON_POLICY),
    Metric("train/avg_completion_tokens", "mean completion length in tokens", ON_POLICY),
    Metric("train/completions/<stat>_length_<kind>", "mean, min and max completion length, of all sampled "
                                                     "completions or of those that ended by themselves", ON_POLICY),
    Metric("train/completions/clipped_frac", "share of completions cut at --max_new_tokens", ON_POLICY),
    Metric("train/completions/diversity/<measure>", "within-group diversity: distinct_1, distinct_2, jaccard", "GRPO"),
    Metric("train/loss/<term>", "each term of the actor's loss: policy, kl, ptx, distill; PPO's critic: value",
           ON_POLICY),
    Metric("train/loss_per_completion_token", "the policy loss per completion token", ON_POLICY),
    Metric("train/approx_kl", "approximate KL between the old and the current policy over the update", ON_POLICY),
    Metric("train/clip_ratio", "share of tokens whose ratio was clipped", ON_POLICY),
    Metric("train/clip_ratio/<side>_<stat>", "clipped shares below and above the range, in the region, and under "
                                             "ppo's dual clip (dual_mean, with --policy_loss_option dual_clip)",
           ON_POLICY),
    Metric("train/policy_entropy", "mean entropy of the policy over completion tokens", ON_POLICY),
    Metric("train/policy_skipped", "update batches skipped because the old log-probs were too far off", ON_POLICY),
    Metric("train/kl", "mean per-token KL to the reference (KTO: its KL estimate)", "GRPO, PPO, KTO"),
    Metric("train/kl_per_completion_token", "the KL summed over a completion, over its tokens", ON_POLICY),
    Metric("train/beta", "the KL coefficient in use (GRPO's published name)", "GRPO"),
    Metric("train/kl_coeff", "the KL coefficient in use (the same value; the published GRPO module logs both)", "GRPO"),
    Metric("train/kl_ctl/<state>", "the adaptive KL controller: value, target, error", "--kl_target"),
    Metric("train/maxent/<state>", "MaxEnt weighting: tau, weight_entropy, weighted_reward, plain_reward",
           "--adv_estimator maxent"),
    Metric("train/values", "mean critic value of the completion tokens", "PPO"),
    Metric("train/explained_variance", "how much of the returns' variance the critic's values explain", "PPO"),
    Metric("train/grad_norm/critic", "the critic's gradient norm", "PPO"),
    Metric("train/behaviour_ratio", "mean ratio pi_old / pi_behaviour where samples came from another engine or "
                                    "older weights", "vLLM, asynchronous rollouts"),
    Metric("train/behaviour_ratio/<stat>", "its min and max", "vLLM, asynchronous rollouts"),
    Metric("train/behaviour_weight", "mean weight each token's loss got from that ratio (--behaviour_correction)",
           "vLLM, asynchronous rollouts"),
    Metric("train/behaviour_capped", "share of tokens whose weight is not the ratio itself (capped or masked)",
           "vLLM, asynchronous rollouts"),
    Metric("train/dynamic_sampling/extra_rollouts", "prompt batches drawn again to replace tied groups",
           "--dynamic_sampling"),
    Metric("train/rollout/<count>", "multi-turn and agent episodes: turns, tool_calls, sampled_tokens, "
                                    "environment_tokens; asynchronous rollouts: dropped_stale", "--tools, --agent, "
                                                                                               "--async_rollout"),
    Metric("train/rollout/ended/<how>", "share of episodes that ended with an answer, or at max_turns, "
                                        "max_total_tokens, truncated", "--tools, --agent"),
    Metric("train/rollout/tool_errors/<kind>", "tool calls that failed: malformed, unknown_tool, bad_arguments, "
                                               "timeout, tool_error", "--tools"),
    Metric("train/time/<phase>", "seconds spent per phase: generation, reward, learning, weight_sync, "
                                 "actor_forward, reference_forward, critic_forward, critic_learning, engine_probe",
           ON_POLICY),
    Metric("train/rollout/staleness@<denominator>/<stat>", "how many versions behind the trainer each trained "
                                                           "sample's weights were (@trained) and each token's "
                                                           "(@token): avg, min, max", "--async_rollout"),
    Metric("alarm/<name>", "1 when a health alarm fired this step (zero_std_groups, length_collapse, "
                           "entropy_collapse, kl_runaway, grad_spike, engine_ratio_drift, ...)", ON_POLICY),
    Metric("eval/loss", "held-out loss", SUPERVISED),
    Metric("eval/perplexity", "held-out perplexity", "SFT"),
    Metric("eval/<metric>", "held-out counterparts of the training numbers (accuracy, margin, ...)", SUPERVISED),
    Metric("eval/reward", "held-out mean reward of greedy completions", ON_POLICY),
    Metric("eval/rewards/<component>", "held-out mean reward of each component (math_answer: exact-answer accuracy)",
           ON_POLICY),
    Metric("eval/rewards/<component>/<diagnostic>", "held-out diagnostics of a reward function", ON_POLICY),
    Metric("eval/<reward>/<estimate>", "with --eval_n_samples N: pass@k (k = 1, 2, 4, ... N), maj@N, mean@N",
           "--eval_n_samples"),
)
"""Every logged name, most specific first where patterns overlap."""
PUBLISHED_GRPO = ["train/loss", "train/loss/policy", "train/loss/kl", "train/learning_rate", "train/epoch",
                  "train/global_step", "train/num_tokens", "train/avg_completion_tokens", "train/grad_norm",
                  "train/policy_entropy", "train/reward", "train/reward_std",
                  *[f"train/reward_p{q}" for q in ("00", "05", "25", "50", "75", "95", "100")],
                  "train/frac_reward_zero_std",
                  *[f"train/completions/{s}_length_{k}" for s in ("mean", "min", "max") for k in ("sampled", "terminated")],
                  "train/completions/clipped_frac",
                  *[f"train/completions/diversity/{k}" for k in ("distinct_1", "distinct_2", "jaccard")],
                  "train/kl", "train/kl_per_completion_token", "train/loss_per_completion_token", "train/clip_ratio",
                  *[f"train/clip_ratio/{k}" for k in ("low_mean", "low_min", "high_mean", "high_max", "region_mean")],
                  
                  "train/beta", "train/kl_coeff"]
"""The GRPO metric names the published GRPO logging module logs (a contract: they keep these names)."""


def _regex(pattern: str) -> "re.Pattern[str]":
    parts = re.split(r"<[^>]+>", pattern)
    return re.compile("[^/]+".join(re.escape(part) for part in parts) + r"\Z")


_COMPILED = [(_regex(metric.pattern), metric) for metric in CATALOGUE]


def describe(name: str) -> Optional[Metric]:
    """The catalogue's entry for the logged name `name`, or None for a name it does not know."""
    return next((metric for regex, metric in _COMPILED if regex.match(name)), None)
