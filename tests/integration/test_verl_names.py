"""verl's names (`coati.cli.verl_names`): its Hydra overrides and config sections read as coati's settings, its global
batch sizes as coati's per-rank ones, its launch keys as the `coati` command's, and every key coati cannot honour
refused by name."""
import math

import pytest
import yaml

from coati.cli.main import launch_options
from coati.rewards.registry import WeightedReward
from coati.rewards.verl import VerlScore
from conftest import launched_args

VERL_GSM8K = [   # verl's examples/grpo_trainer/run_qwen3-8b.sh, at a tiny size
    "algorithm.adv_estimator=grpo", "data.train_files=train.parquet", "data.val_files=test.parquet",
    "data.train_batch_size=16", "data.max_prompt_length=512", "data.max_response_length=1024",
    "data.filter_overlong_prompts=True", "data.truncation=error", "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
    "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.logger=[\"console\",\"wandb\"]",
    "trainer.project_name=verl_grpo_example_gsm8k", "trainer.experiment_name=qwen3_8b_function_rm",
    "trainer.n_gpus_per_node=2", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs=15", "custom_reward_function.path=my_reward.py"]


GRPO_BASE = ["--pretrain", "m", "--prompt_dataset", "d", "--reward_fn", "math_answer"]


def _parse(argv, monkeypatch, world=2, command="grpo"):
    return launched_args(command, argv, monkeypatch, world)


def _refused(argv, monkeypatch, capsys, world=1, command="grpo") -> str:
    with pytest.raises(SystemExit) as stop:
        _parse(argv, monkeypatch, world, command)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_verls_gsm8k_grpo_command_is_read_as_coatis_settings(monkeypatch, capsys):
    """Each of the verl example's keys becomes its coati setting; the batch sizes over 2 processes: 16 prompts a step
    = 8 a rank, an optimizer step per 8 prompts x 5 completions / 2 = 20 completions a rank, in micro-batches of 4
    (5 accumulation steps); the engine's keys are named as not used."""
    args = _parse(VERL_GSM8K, monkeypatch)
    got = {name: getattr(args, name) for name in (
        "adv_estimator", "dataset", "eval_dataset", "max_length", "max_new_tokens", "pretrain", "lr", "kl_coef",
        "kl_estimator", "entropy_coef", "grad_checkpoint", "logits_forward_batch_size", "rollout_backend",
        "vllm_gpu_memory_utilization", "num_generations", "report_to", "wandb_project", "run_name", "save_interval",
        "eval_interval", "num_epochs", "reward_fn", "save_dir", "checkpoint_path", "batch_size", "train_batch_size",
        "accumulation_steps")}
    assert got == {
        "adv_estimator": "grpo", "dataset": ["train.parquet"], "eval_dataset": ["test.parquet"], "max_length": 512,
        "max_new_tokens": 1024, "pretrain": "Qwen/Qwen3-8B", "lr": 1e-6, "kl_coef": 0.001, "kl_estimator": "k3",
        "entropy_coef": 0.0, "grad_checkpoint": True, "logits_forward_batch_size": 32, "rollout_backend": "vllm",
        "vllm_gpu_memory_utilization": 0.6, "num_generations": 5, "report_to": ["wandb"],
        "wandb_project": "verl_grpo_example_gsm8k", "run_name": "qwen3_8b_function_rm", "save_interval": 20,
        "eval_interval": 5, "num_epochs": 15.0, "reward_fn": ["my_reward.py:compute_score"],
        "save_dir": "checkpoints/verl_grpo_example_gsm8k/qwen3_8b_function_rm", "checkpoint_path": "latest",
        "batch_size": 8, "train_batch_size": 4, "accumulation_steps": 5}
    note = capsys.readouterr().err
    for key in ("data.filter_overlong_prompts", "actor_rollout_ref.actor.fsdp_config.param_offload",
                "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.model.use_remove_padding"):
        assert key in note
    assert not hasattr(args, "verl_train_batch_size")
    assert args._run_record.sources["pretrain"] == "override actor_rollout_ref.model.path"
    from coati.cli.options import named_as_given   # a later check's line names the verl key that gave the path

    assert named_as_given("--prompt_dataset x does not exist", args) == "data.train_files (--prompt_dataset) x does " \
                                                                         "not exist"


def test_verls_launch_keys_start_the_processes(tmp_path):
    """`trainer.n_gpus_per_node` and `trainer.nnodes`, as overrides or in a file's trainer section, are the `coati`
    command's launch; its own flags win; other commands read no verl section."""
    launch, rest = launch_options(["trainer.n_gpus_per_node=4", "trainer.nnodes=1", "--lr", "1"], "grpo")
    assert launch == {"--nproc_per_node": "4", "--nnodes": "1"} and rest[-2:] == ["--lr", "1"]
    (tmp_path / "verl.yaml").write_text(yaml.safe_dump({"trainer": {"n_gpus_per_node": 8}}))
    launch, _ = launch_options(["--config", str(tmp_path / "verl.yaml"), "--nproc_per_node", "2"], "ppo")
    assert launch == {"--nproc_per_node": "2"}
    assert launch_options(["--config", str(tmp_path / "verl.yaml")], "ppo")[0] == {"--nproc_per_node": "8"}
    assert launch_options(["--config", str(tmp_path / "verl.yaml")], "sft")[0] == {}


def test_a_verl_config_file_in_its_sections_beside_coatis_own(monkeypatch, tmp_path):
    """A file in verl's nested sections; `data:` and `algorithm:` hold verl's keys and coati's own side by side;
    a world of one takes the whole batch; SAPO takes verl's temperatures; PPO takes verl's critic and GAE settings."""
    config = {"data": {"train_files": "train.parquet", "train_batch_size": 4, "dataset_config": "main"},
              "actor_rollout_ref": {"model": {"path": "m", "lora_rank": 8},
                                    "actor": {"optim": {"lr": 2e-6, "lr_scheduler_type": "constant"},
                                              "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                              "loss_agg_mode": "token-mean", "ppo_epochs": 2,
                                              "policy_loss": {"loss_mode": "sapo"}, "tau_neg": 1.2},
                                    "rollout": {"n": 4, "temperature": 0.7, "top_k": -1}},
              "algorithm": {"adv_estimator": "rloo", "norm_adv_by_std_in_grpo": False, "entropy_coef": 0.01},
              "custom_reward_function": {"path": "r.py", "name": "my_score"},
              "trainer": {"total_training_steps": 3, "save_freq": -1, "test_freq": -1, "logger": ["console"]}}
    (tmp_path / "verl.yaml").write_text(yaml.safe_dump(config))
    args = _parse(["--config", str(tmp_path / "verl.yaml")], monkeypatch, world=1)
    assert (args.dataset, args.dataset_config, args.batch_size, args.train_batch_size, args.accumulation_steps) == (
        ["train.parquet"], "main", 4, 16, 1)
    assert (args.lora_rank, args.lr, args.lr_scheduler, args.clip_eps_low, args.clip_eps_high, args.loss_agg) == (
        8, 2e-6, "constant", 0.2, 0.28, "token-mean")
    assert (args.num_update_steps, args.temperature, args.top_k, args.adv_estimator, args.no_std_normalize) == (
        2, 0.7, 0, "rloo", True)
    assert (args.entropy_coef, args.reward_fn, args.num_episodes, args.save_interval, args.eval_interval) == (
        0.01, ["r.py:my_score"], 3, 0, 0)
    assert args.save_dir is None and args.report_to == ["tensorboard"]
    assert (args.policy_loss, args.policy_loss_option) == ("sapo", [("temperature_neg", 1.2)])
    ppo = {"algorithm": {"adv_estimator": "gae", "gamma": 0.99, "lam": 0.95},
           "critic": {"optim": {"lr": 1e-5}, "model": {"path": "c"}, "cliprange_value": 0.5}}
    (tmp_path / "ppo.yaml").write_text(yaml.safe_dump(ppo))
    args = _parse(["--config", str(tmp_path / "ppo.yaml"), *GRPO_BASE], monkeypatch,
                  world=1, command="ppo")
    assert (args.gamma, args.lam, args.critic_lr, args.critic_pretrain, args.value_clip) == (0.99, 0.95, 1e-5, "c", 0.5)


@pytest.mark.parametrize("extra, message", [
    (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name=sglang has no counterpart here; "
                                                 "coati takes vllm, hf"),
    (["algorithm.adv_estimator=gae"], "algorithm.adv_estimator=gae learns a critic: run `coati ppo` with these "
                                      "settings"),
    (["actor_rollout_ref.actor.ppo_mini_batch=4"], "actor_rollout_ref.actor.ppo_mini_batch: no verl key coati reads "
                                                   "(did you mean actor_rollout_ref.actor.ppo_mini_batch_size or"),
    (["actor_rollout_ref.actor.clip_ratio_cc=3"], "(did you mean actor_rollout_ref.actor.clip_ratio_c or"),
    (["algorithm.kl_ctrl.kl_cof=0.05"], "algorithm.kl_ctrl.kl_cof: verl has no such key (did you mean "
                                        "algorithm.kl_ctrl.kl_coef?)"),
    (["actor_rollout_ref.actor.policy_loss.loss_mod=cispo"], "actor_rollout_ref.actor.policy_loss.loss_mod: verl has "
                                                             "no such key (did you mean "
                                                             "actor_rollout_ref.actor.policy_loss.loss_mode"),
    (["algorithm.use_kl_in_rewards=True"], "unknown key 'algorithm.use_kl_in_rewards' (did you mean "
                                           "algorithm.use_kl_in_reward?)"),
    (["actor_rollout_ref.rollout.n=1"], "argument actor_rollout_ref.rollout.n (--num_generations): must be >= 2"),
    (["algorithm.use_kl_in_reward=True", "actor_rollout_ref.actor.use_kl_loss=True"],
     "actor_rollout_ref.actor.use_kl_loss=true and algorithm.use_kl_in_reward=true: coati puts the KL to the reference "
     "in one place; keep one"),
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive"],
     "algorithm.kl_ctrl.type=adaptive: verl's adaptive KL aims at a per-token mean KL, coati's at a completion's "
     "summed KL"),
    (["algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=full"], "algorithm.kl_penalty=full has no counterpart "
                                                                       "here; coati takes kl, k1, mse"),
    (["actor_rollout_ref.actor.optim.lr_warmup_steps=10", "--warmup_steps", "3"], "--warmup_steps and "
     "actor_rollout_ref.actor.optim.lr_warmup_steps both set the warm-up; give one"),
    (["data.train_batch_size=6"], "data.train_batch_size=6 prompts is not a whole number for each of the 4 "
                                  "processes; make it a multiple of 4"),
    (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3 does not divide the 16 completions of a mini-batch on "
     "each process (ppo_mini_batch_size 8 x rollout.n 8 / 4 processes)"),
    (["data.train_batch_size=8", "--batch_size", "2"], "--batch_size and verl's batch sizes"),
    (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=3"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=3 does not divide data.train_batch_size=8"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=6"], "actor_rollout_ref.actor.ppo_micro_batch_size=6 completions "
                                                         "over every process is not a whole number for each of the 4"),
    (["data.train_batch_szie=4"], "unknown key 'data.train_batch_szie'"),
])
def test_what_coati_cannot_honour_is_refused_in_one_line(extra, message, monkeypatch, capsys):
    base = ["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py"]
    refused = _refused([*base, *extra], monkeypatch, capsys, world=4)
    assert message in refused and "verl_" not in refused


def test_a_verl_reward_function_scores_each_completion_with_verls_arguments():
    """`compute_score(data_source, solution_str, ground_truth, extra_info)` is called once per completion with the
    row's `reward_model.ground_truth`, `data_source` and `extra_info`; a dict's `score` is the reward, its other
    numbers logged beside it (a boolean as 0/1), its other values shown in the sample tables."""
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        right = solution_str.strip().endswith(ground_truth)
        return {"score": 1.0 if right else -0.5, "acc": right, "pred": solution_str[-1:]}

    reward = WeightedReward([("compute_score", VerlScore(compute_score), 2.0)])
    reward.check_columns(["prompt", "reward_model", "data_source"], "the data")
    inputs = {"reward_model": [{"ground_truth": "4", "style": "rule"}] * 2, "data_source": ["openai/gsm8k"] * 2,
              "extra_info": [{"index": 0}, None]}
    completions = [[{"role": "assistant", "content": "#### 4"}], [{"role": "assistant", "content": "#### 5"}]]
    from coati.rewards.registry import RewardInputs
    total, components = reward(["p", "p"], ["#### 4", "#### 5"], inputs=RewardInputs(["p", "p"], completions,
                                                                                       [[1], [2]]), **inputs)
    assert total == [2.0, -1.0] and components["compute_score"] == [1.0, -0.5]
    assert components["compute_score/acc"] == [1.0, 0.0] and components["log_extra/compute_score/pred"] == ["4", "5"]
    assert seen == [("openai/gsm8k", "#### 4", "4", {"index": 0}), ("openai/gsm8k", "#### 5", "4", {})]
    with pytest.raises(Exception, match="needs a ground truth: verl's 'reward_model' column"):
        reward.check_columns(["prompt", "answer"], "the data")
    assert math.isclose(VerlScore(lambda data_source, solution_str, ground_truth, extra_info=None: 0.5)(
        ["x"], ground_truth=["y"]).values[0], 0.5)

    def gsm8k_compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
        return score if solution_str.endswith(ground_truth) else format_score   # verl's gsm8k.py takes two of the four

    assert VerlScore(gsm8k_compute_score)(["#### 4", "#### 5"], reward_model=inputs["reward_model"]).values == [1.0,
                                                                                                               0.0]


def test_the_migration_page_names_every_verl_key_coati_takes_and_its_batch_example_holds(monkeypatch, capsys):
    """docs/migration/verl.md lists each key of `TAKEN`, `BATCHES` and `VERL_LAUNCH_KEYS`; its example on 8 processes
    is 128 prompts a process and 4 optimizer steps of 5 micro-batches of 32 (so verl's warm-up of 10 training steps
    is 40 optimizer steps, and decides over the ratio); a run in verl's names that leaves verl's learning rate out is
    told coati's."""
    from coati.cli.arguments import optimizer_steps_per_episode
    from coati.cli.verl_names import BATCHES, TAKEN, VERL_LAUNCH_KEYS
    from conftest import REPO

    page = (REPO / "docs" / "migration" / "verl.md").read_text()
    assert [key for key in (*TAKEN, *BATCHES, *VERL_LAUNCH_KEYS) if f"`{key}`" not in page] == []
    sizes = ["data.train_batch_size=1024", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", "actor_rollout_ref.rollout.n=5"]
    args = _parse(["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py",
                   *sizes], monkeypatch, world=8)
    assert (args.batch_size, args.train_batch_size, args.accumulation_steps, optimizer_steps_per_episode(args)) == (
        128, 32, 5, 4)
    args = _parse(["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py", *sizes,
                   "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
                   "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"], monkeypatch, world=8)
    assert (args.warmup_steps, args.warmup_ratio) == (40, 0.0)   # verl's 10 training steps, 4 optimizer steps each
    note = capsys.readouterr().err
    assert "actor_rollout_ref.actor.optim.lr (verl 1e-06, here --lr 5e-05)" in note
    _parse(["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py",
            "actor_rollout_ref.actor.optim.lr=1e-6", "--lr_scheduler", "constant"], monkeypatch, world=1)
    note = capsys.readouterr().err
    assert "optim.lr " not in note and "lr_scheduler_type" not in note and "weight_decay (verl 0.01" in note


def test_a_config_verl_wrote_out_reads_with_its_repeated_and_other_trainers_keys(monkeypatch, capsys, tmp_path):
    """A config as verl resolves it holds a setting twice (`data.max_response_length` and `rollout.response_length`)
    and PPO's critic and GAE in a GRPO run: the two agree and count once, PPO's are noted; its `clip_ratio` gives
    the bounds `clip_ratio_low`/`_high` leave out; `~` in its paths is the home folder; two keys that disagree are
    refused naming both."""
    monkeypatch.setenv("HOME", str(tmp_path))
    config = {"data": {"train_files": "~/data/train.parquet", "max_response_length": 256},
              "actor_rollout_ref": {"model": {"path": "~/models/m"},
                                    "actor": {"clip_ratio": 0.1, "clip_ratio_high": 0.28,
                                              "optim": {"lr_scheduler_type": "constant", "warmup_style": None}},
                                    "rollout": {"response_length": 256, "prompt_length": None}},
              "critic": {"optim": {"lr": 1e-5}, "model": {"path": "~/models/m"}},
              "algorithm": {"gamma": 1.0, "lam": 1.0, "kl_penalty": "kl", "kl_ctrl": {"kl_coef": 0.001}},
              "custom_reward_function": {"path": "~/r.py", "name": "compute_score"}}
    (tmp_path / "verl.yaml").write_text(yaml.safe_dump(config))
    args = _parse(["--config", str(tmp_path / "verl.yaml")], monkeypatch, world=1)
    assert (args.dataset, args.pretrain, args.reward_fn) == ([f"{tmp_path}/data/train.parquet"], f"{tmp_path}/models/m",
                                                             [f"{tmp_path}/r.py:compute_score"])
    assert (args.max_new_tokens, args.clip_eps_low, args.clip_eps_high, args.lr_scheduler) == (256, 0.1, 0.28,
                                                                                               "constant")
    note = capsys.readouterr().err
    assert "critic.optim.lr (PPO's critic and GAE (coati ppo))" in note and "algorithm.kl_penalty (the KL in" in note
    config["actor_rollout_ref"]["rollout"]["response_length"] = 512
    (tmp_path / "verl.yaml").write_text(yaml.safe_dump(config))
    message = _refused(["--config", str(tmp_path / "verl.yaml")], monkeypatch, capsys)
    assert "actor_rollout_ref.rollout.response_length=512 and data.max_response_length=256 set the same setting; " \
           "keep one" in message


VERL_CONFIG = """# as verl's ppo_trainer.yaml writes it: interpolations, Hydra's ??? and both run lengths
data:
  train_files: train.parquet
  max_prompt_length: 128
  max_response_length: 64
  train_batch_size: 8
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 4
    ppo_micro_batch_size: 8
    rollout_n: ${oc.select:actor_rollout_ref.rollout.n,1}
    use_remove_padding: ${oc.select:actor_rollout_ref.model.use_remove_padding,false}
    checkpoint:
      save_contents: [model, optimizer, extra]
      load_contents: ${.save_contents}
  model:
    path: m
  rollout:
    name: ???
    n: 4
    prompt_length: ${oc.select:data.max_prompt_length,512}
    response_length: ${data.max_response_length}
    val_kwargs: {temperature: 0, n: 1, do_sample: false}
critic:
  model:
    tokenizer_path: ${oc.select:actor_rollout_ref.model.path,"~/models/deepseek-llm-7b-chat"}
reward_model:
  overlong_buffer: {enable: true, len: 16, penalty_factor: 0.5, log: false}
custom_reward_function: {path: r.py, name: compute_score}
trainer:
  total_epochs: 30
  total_training_steps: 5
ray_init:
  num_cpus: null
"""


def test_verls_own_config_with_interpolations_reads_as_verl_resolves_it(monkeypatch, capsys, tmp_path):
    """`${a.b}`, `${.b}` and `${oc.select:a.b,default}` resolve as Hydra resolves them (so a setting verl's config
    gives twice, once by reference, counts once), `???` is not given; the steps decide the length over the epochs;
    greedy validation at temperature 0 is coati's evaluation; DAPO's overlong buffer is coati's overlong shaping;
    verl's global micro-batch is divided over the processes."""
    (tmp_path / "verl.yaml").write_text(VERL_CONFIG)
    args = _parse(["--config", str(tmp_path / "verl.yaml")], monkeypatch, world=2)
    assert (args.max_length, args.max_new_tokens, args.num_episodes, args.num_epochs, args.rollout_backend) == (
        128, 64, 5, 0.0, "hf")
    assert (args.batch_size, args.train_batch_size, args.accumulation_steps, args.eval_n_samples) == (4, 4, 2, 0)
    assert (args.reward_shaping, args.overlong_buffer_len, args.overlong_penalty_factor) == (["overlong"], 16, 0.5)
    note = capsys.readouterr().err
    assert "trainer.total_epochs (trainer.total_training_steps decides the run's length, as in verl)" in note
    assert "ray_init.num_cpus (verl's Ray cluster)" in note
    sampled = ["actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.n=4",
               "actor_rollout_ref.rollout.val_kwargs.temperature=0.6", "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
               "actor_rollout_ref.rollout.val_kwargs.top_k=-1"]
    args = _parse(["--config", str(tmp_path / "verl.yaml"), *sampled], monkeypatch, world=2)
    assert (args.eval_n_samples, args.eval_temperature, args.eval_top_p, args.eval_top_k) == (4, 0.6, 0.7, 0)


VERL_DAPO = ["algorithm.adv_estimator=grpo", "data.train_files=train.parquet", "reward_model.reward_manager=dapo",
             "algorithm.use_kl_in_reward=False", "algorithm.kl_ctrl.kl_coef=0.0",
             "actor_rollout_ref.actor.use_kl_loss=False",
             "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28",
             "data.max_prompt_length=1024", "data.max_response_length=2048", "reward_model.overlong_buffer.enable=True",
             "reward_model.overlong_buffer.len=128", "reward_model.overlong_buffer.penalty_factor=1.0",
             "actor_rollout_ref.actor.loss_agg_mode=token-mean", "data.train_batch_size=32", "data.gen_batch_size=128",
             "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=seq_reward",
             "algorithm.filter_groups.max_num_gen_batches=10", "actor_rollout_ref.model.path=m",
             "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "custom_reward_function.path=r.py"]
"""verl's tests/special_e2e/run_dapo.sh (recipe.dapo.main_dapo), at its 8 GPUs."""


def test_verls_dapo_recipe_is_coatis_dapo(monkeypatch, capsys, tmp_path):
    """DAPO's decoupled clip, token-mean loss, overlong buffer and dynamic sampling (filter_groups) as verl's DAPO
    recipe gives them; a recipe config opening with Hydra's `defaults` list reads too."""
    args = _parse(VERL_DAPO, monkeypatch, world=8)
    assert (args.clip_eps_low, args.clip_eps_high, args.loss_agg, args.kl_coef) == (0.2, 0.28, "token-mean", 0.0)
    assert (args.reward_shaping, args.overlong_buffer_len, args.dynamic_sampling, args.max_sampling_rounds) == (
        ["overlong"], 128, True, 10)
    assert (args.batch_size, args.train_batch_size, args.accumulation_steps) == (4, 2, 4)
    assert "data.gen_batch_size (DAPO's generation batch" in capsys.readouterr().err
    (tmp_path / "dapo.yaml").write_text(yaml.safe_dump({"hydra": {"searchpath": ["file://verl/trainer/config"]},
                                                        "defaults": ["ppo_trainer", "_self_"],
                                                        "data": {"gen_batch_size": "${data.train_batch_size}"}}))
    args = _parse(["--config", str(tmp_path / "dapo.yaml"), *GRPO_BASE], monkeypatch, world=1)
    assert "defaults (Hydra's defaults list" in capsys.readouterr().err


def test_hydras_config_path_and_name_are_the_config_file(tmp_path):
    """verl's recipes name their file with Hydra's flags: `--config-path=config --config-name=dapo_trainer` is
    `--config config/dapo_trainer.yaml`; a name alone is in the working directory; a path alone, or with --config
    too, is refused in one line."""
    from coati.cli.config_file import split_config_flag
    from coati.utils.errors import CoatiUsageError

    assert split_config_flag(["--config-path=config", "--config-name=dapo_trainer", "--lr", "1"]) == (
        "config/dapo_trainer.yaml", ["--lr", "1"])
    assert split_config_flag(["-cn", "run.yml", "data.seed=1"]) == ("run.yml", ["data.seed=1"])
    with pytest.raises(CoatiUsageError, match="--config-path needs --config-name"):
        split_config_flag(["--config-path", "config"])
    with pytest.raises(CoatiUsageError, match="given 2 times"):
        split_config_flag(["--config", "a.yaml", "--config-name", "b"])


def test_the_command_line_replaces_a_files_verl_keys_before_they_are_read(monkeypatch, capsys, tmp_path):
    """As in Hydra, `actor_rollout_ref.rollout.name=hf` replaces the file's `sglang` before it is read (so it is not
    refused), and an override read with a file's key (kl_loss_coef with the file's use_kl_loss) is read with it;
    verl's own `--config-name ppo_megatron_trainer`, not here, is coati's defaults, said in a note; LoRA's other keys
    are noted while LoRA is off, Megatron's nested LoRA keys are coati's; verl's older global log-prob batch is
    divided over the processes."""
    config = {"data": {"train_files": "d"}, "actor_rollout_ref": {"model": {"path": "m"},
                                                                  "rollout": {"name": "sglang", "n": 4},
                                                                  "actor": {"use_kl_loss": True}},
              "algorithm": {"adv_estimator": "gae"}, "custom_reward_function": {"path": "r.py"}}
    (tmp_path / "verl.yaml").write_text(yaml.safe_dump(config))
    args = _parse(["--config", str(tmp_path / "verl.yaml"), "actor_rollout_ref.rollout.name=hf",
                   "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.kl_loss_coef=0.01"], monkeypatch, world=1)
    assert (args.rollout_backend, args.adv_estimator, args.kl_coef) == ("hf", "grpo", 0.01)
    base = ["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py"]
    capsys.readouterr()
    args = _parse(["--config-path=config", "--config-name=ppo_megatron_trainer", *base,
                   "actor_rollout_ref.model.lora_alpha=0", "actor_rollout_ref.model.exclude_modules=DONT_EXCLUDE",
                   "actor_rollout_ref.rollout.log_prob_micro_batch_size=8"], monkeypatch, world=4)
    note = capsys.readouterr().err
    assert "--config-name ppo_megatron_trainer: verl's own config, which coati's defaults stand in for" in note
    assert "actor_rollout_ref.model.lora_alpha (LoRA is off (actor_rollout_ref.model.lora_rank 0))" in note
    assert (args.lora_rank, args.lora_alpha, args.logits_forward_batch_size) == (0, 16, 2)
    args = _parse([*base, "actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.model.lora.alpha=32",
                   "actor_rollout_ref.model.lora.target_modules=[linear_qkv]"], monkeypatch, world=1)
    assert (args.lora_rank, args.lora_alpha, args.lora_target_modules) == (8, 32, ["all-linear"])
    assert "actor_rollout_ref.model.lora.target_modules (Megatron's LoRA settings" in capsys.readouterr().err


def test_held_out_samples_take_their_own_temperature_top_p_and_top_k_else_the_trainings():
    """`--eval_n_samples` samples at `--eval_temperature`, `--eval_top_p` and `--eval_top_k` where given (verl's
    `val_kwargs`), else at the training's sampling."""
    from coati.config import EvalSettings, SamplingConfig
    from coati.rollout.evaluation import held_out_sampling

    training = SamplingConfig(temperature=1.0, top_p=0.9, top_k=20)
    own = held_out_sampling(training, EvalSettings(eval_temperature=0.6, eval_top_p=0.7, eval_top_k=0))
    assert (own.do_sample, own.temperature, own.top_p, own.top_k) == (True, 0.6, 0.7, 0)
    default = held_out_sampling(training, EvalSettings())
    assert (default.do_sample, default.temperature, default.top_p, default.top_k) == (True, 1.0, 0.9, 20)


def test_verls_dual_clip_is_ppos_for_its_vanilla_loss_and_named_where_left_out(monkeypatch, capsys):
    """`clip_ratio_c` is the dual clip of verl's vanilla loss (coati's ppo) and of no other; a run that leaves it out
    is told verl clips at 3.0; a bound not above 1 is refused naming verl's key."""
    base = ["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py"]
    args = _parse([*base, "actor_rollout_ref.actor.clip_ratio_c=10.0"], monkeypatch, world=1)
    assert (args.policy_loss, args.policy_loss_option) == ("ppo", [("dual_clip", 10.0)])
    assert "clip_ratio_c" not in capsys.readouterr().err
    args = _parse([*base, "actor_rollout_ref.actor.clip_ratio_c=10.0", "actor_rollout_ref.actor.tau_pos=2",
                   "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"], monkeypatch, world=1)
    assert (args.policy_loss, args.policy_loss_option) == ("gspo", [])
    note = capsys.readouterr().err
    assert "actor_rollout_ref.actor.clip_ratio_c (the dual clip of verl's vanilla loss, which its gspo loss does not " \
           "apply)" in note and "actor_rollout_ref.actor.tau_pos (SAPO's temperature, and the loss is verl's gspo)" in note
    _parse(base, monkeypatch, world=1)
    assert "actor_rollout_ref.actor.clip_ratio_c (verl's vanilla loss clips at 3.0, here no dual clip: " \
           "--policy_loss_option dual_clip=3)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        _parse([*base, "actor_rollout_ref.actor.clip_ratio_c=1.0"], monkeypatch, world=1)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: actor_rollout_ref.actor.clip_ratio_c (--policy_loss_option) dual_clip=1.0: the dual clip bounds the "
        "loss of a token with a negative advantage at dual_clip x |A|, and must be above 1")


def test_verls_kl_in_the_reward_is_grpos_kl_in_reward_and_ppos_own(monkeypatch, capsys):
    """verl's RLOO example (`use_kl_in_reward=True`, `kl_ctrl.kl_coef`, `kl_penalty=kl`) is GRPO's --kl_in_reward at
    that weight with the k1 estimator, the KL loss's keys noted; under `coati ppo` the reward is where the KL goes
    anyway, and verl's KL loss is refused there."""
    base = ["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py"]
    rloo = ["algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=kl",
            "algorithm.kl_ctrl.kl_coef=0.001", "actor_rollout_ref.actor.use_kl_loss=False",
            "actor_rollout_ref.actor.kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_type=low_var_kl"]
    args = _parse([*base, *rloo], monkeypatch, world=1)
    assert (args.adv_estimator, args.kl_in_reward, args.kl_coef, args.kl_estimator) == ("rloo", True, 0.001, "k1")
    assert "actor_rollout_ref.actor.kl_loss_type (the KL loss's, and actor.use_kl_loss is off)" in \
        capsys.readouterr().err
    args = _parse([*base, "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True",
                   "algorithm.kl_ctrl.kl_coef=0.05", "algorithm.kl_penalty=low_var_kl"], monkeypatch, world=1,
                  command="ppo")
    assert (args.kl_coef, args.kl_estimator, hasattr(args, "kl_in_reward")) == (0.05, "k3", False)
    args = _parse([*base, "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01"],
                  monkeypatch, world=1)
    assert (args.kl_in_reward, args.kl_coef) == (False, 0.01)
    assert "algorithm.kl_ctrl.kl_coef" not in capsys.readouterr().err
    refused = _refused([*base, "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=True"],
                       monkeypatch, capsys, command="ppo")
    assert "use_kl_loss=true: coati's PPO puts the KL to the reference in the reward; give " \
           "algorithm.use_kl_in_reward=true and its algorithm.kl_ctrl.kl_coef" in refused


def test_verls_gmpo_cispo_reinforce_pp_baseline_and_megatron_schedule_are_coatis(monkeypatch, capsys):
    """verl's examples as written: GMPO (`loss_mode=geo_mean`, averaged over sequences whatever `loss_agg_mode`
    says); CISPO with `clip_ratio_low=10` (no floor) and at verl's default 0.2 (a floor of 0.8); REINFORCE++-baseline;
    Megatron's `lr_decay_style`; `model.torch_dtype` noted."""
    base = ["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py"]
    args = _parse([*base, "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
                   "actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.clip_ratio_low=0.4",
                   "actor_rollout_ref.actor.clip_ratio_high=0.4"], monkeypatch, world=1)
    assert (args.policy_loss, args.loss_agg, args.clip_eps_low, args.clip_eps_high) == (
        "gmpo", "seq-mean-token-mean", 0.4, 0.4)
    assert "actor_rollout_ref.actor.loss_agg_mode (verl's GMPO (geo_mean) averages over sequences" in \
        capsys.readouterr().err
    args = _parse([*base, "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
                   "actor_rollout_ref.actor.clip_ratio_low=10", "actor_rollout_ref.actor.clip_ratio_high=0.2",
                   "actor_rollout_ref.model.torch_dtype=bfloat16"], monkeypatch, world=1)
    assert (args.policy_loss, args.policy_loss_option, args.clip_eps_high) == ("cispo", [], 0.2)
    note = capsys.readouterr().err
    assert "actor_rollout_ref.actor.clip_ratio_low (CISPO's floor on the weight is 1 - it, here none" in note
    assert "actor_rollout_ref.model.torch_dtype (--mixed_precision)" in note
    args = _parse([*base, "actor_rollout_ref.actor.policy_loss.loss_mode=cispo"], monkeypatch, world=1)
    assert args.policy_loss_option == [("floor", 0.8)]
    args = _parse([*base, "algorithm.adv_estimator=reinforce_plus_plus_baseline",
                   "actor_rollout_ref.actor.optim.lr_decay_style=inverse_square_root"], monkeypatch, world=1)
    assert (args.adv_estimator, args.lr_scheduler) == ("reinforce_pp_baseline", "inverse_sqrt")


def test_verls_critic_keys_in_a_grpo_command_are_noted(monkeypatch, capsys):
    """verl's multi-turn GRPO scripts set critic keys too (verl reads them only with gae): noted, not refused."""
    _parse(["actor_rollout_ref.model.path=m", "data.train_files=d", "custom_reward_function.path=r.py",
            "critic.ppo_max_token_len_per_gpu=8192", "critic.optim.lr=1e-5"], monkeypatch, world=1)
    note = capsys.readouterr().err
    assert "critic.ppo_max_token_len_per_gpu (" in note and "critic.optim.lr (PPO's critic and GAE (coati ppo))" in note


def test_an_override_after_a_list_flag_is_an_override_even_with_a_key_neither_has(monkeypatch, capsys):
    """`--reward_fn math_answer algorithm.use_kl_in_rewards=True`: the misspelt override is refused by name (it was
    read as a reward function's weight)."""
    refused = _refused(["actor_rollout_ref.model.path=m", "data.train_files=d", "--reward_fn", "math_answer",
                        "algorithm.use_kl_in_rewards=True"], monkeypatch, capsys)
    assert "unknown key 'algorithm.use_kl_in_rewards' (did you mean algorithm.use_kl_in_reward?)" in refused


def test_verls_prompt_and_reward_fn_keys_name_the_columns_read_as_prompt_and_data_source(monkeypatch, capsys):
    args = _parse([*GRPO_BASE, "data.prompt_key=question", "data.reward_fn_key=source"], monkeypatch)
    assert dict(args.dataset_columns) == {"question": "prompt", "source": "data_source"}
    assert dict(_parse([*GRPO_BASE, "data.prompt_key=prompt"], monkeypatch).dataset_columns) == {}   # verl's default
