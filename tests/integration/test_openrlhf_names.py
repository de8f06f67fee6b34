"""OpenRLHF's flags (`coati.cli.openrlhf_names`): its example scripts' flags read as coati's settings, its batch sizes
over every GPU as coati's per-rank ones, its placement flags as the launch, its `reward_func` files as reward
functions, and every flag coati cannot honour refused by name."""
import json
import os

import pytest
import torch

from coati.cli.openrlhf_names import openrlhf_launch
from coati.rewards.openrlhf import OpenRLHFReward
from coati.rewards.registry import RewardInputs, WeightedReward
from coati.rewards.remote import Sequences
from conftest import launched_args

TRAIN_SFT = [   # OpenRLHF's examples/scripts/train_sft.sh, its flags as they are
    "--data.max_len", "2048", "--data.dataset", "Open-Orca/OpenOrca", "--data.input_key", "question",
    "--data.output_key", "response", "--train.batch_size", "256", "--train.micro_batch_size", "2",
    "--data.max_samples", "500000", "--model.model_name_or_path", "meta-llama/Meta-Llama-3-8B",
    "--ckpt.output_dir", "./checkpoint/llama3-8b-sft", "--ckpt.save_steps", "-1", "--logger.logging_steps", "1",
    "--eval.steps", "-1", "--ds.zero_stage", "2", "--train.max_epochs", "1", "--ds.param_dtype", "bf16",
    "--ds.attn_implementation", "flash_attention_2", "--adam.lr", "5e-6", "--ckpt.load_enable",
    "--ds.packing_samples", "--model.gradient_checkpointing_enable"]
TRAIN_DPO = [   # examples/scripts/train_dpo_llama.sh
    "--ckpt.output_dir", "./checkpoint/llama3-8b-dpo", "--ckpt.save_steps", "-1", "--logger.logging_steps", "1",
    "--eval.steps", "-1", "--train.batch_size", "256", "--train.micro_batch_size", "1",
    "--model.model_name_or_path", "OpenRLHF/Llama-3-8b-sft-mixture", "--ds.param_dtype", "bf16",
    "--train.max_epochs", "1", "--data.max_len", "8192", "--ds.zero_stage", "3", "--adam.lr", "5e-7",
    "--model.beta", "0.1", "--data.dataset", "OpenRLHF/preference_dataset_mixture2_and_safe_pku",
    "--data.apply_chat_template", "--data.chosen_key", "chosen", "--data.rejected_key", "rejected",
    "--ds.attn_implementation", "flash_attention_2", "--ckpt.load_enable", "--ds.packing_samples",
    "--model.gradient_checkpointing_enable"]
TRAIN_REINFORCE_BASELINE = [   # examples/scripts/train_reinforce_baseline_hybrid_engine.sh, its agent left out
    "--actor.model_name_or_path", "Qwen/Qwen3-4B-Thinking-2507", "--ckpt.load_enable", "--ckpt.output_dir", "exp",
    "--ckpt.path", "exp/ckpt", "--ckpt.save_hf", "--ckpt.max_num", "3", "--ckpt.save_steps", "10",
    "--reward.remote_url", "reward_func.py", "--data.prompt_dataset", "zhuzilin/dapo-math-17k",
    "--data.input_key", "prompt", "--data.label_key", "label", "--data.max_len", "74240",
    "--rollout.max_new_tokens", "64000", "--data.apply_chat_template", "--ds.packing_samples",
    "--rollout.batch_size", "128", "--rollout.n_samples_per_prompt", "8", "--train.batch_size", "1024",
    "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.0", "1.0", "--train.dynamic_batch_enable",
    "--train.max_tokens_per_gpu", "16192", "--rollout.max_tokens_per_gpu", "32768", "--train.micro_batch_size", "1",
    "--rollout.micro_batch_size", "8", "--data.max_samples", "128000", "--train.max_epochs", "1",
    "--train.num_episodes", "1", "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "4", "--actor.num_nodes", "1",
    "--actor.num_gpus_per_node", "4", "--vllm.num_engines", "2", "--vllm.tensor_parallel_size", "2",
    "--vllm.gpu_memory_utilization", "0.7", "--train.colocate_all", "--ds.enable_sleep", "--vllm.sync_backend",
    "nccl", "--vllm.enforce_eager", "--ds.zero_stage", "3", "--actor.gradient_checkpointing_enable",
    "--ds.ring_attn_size", "1", "--ds.param_dtype", "bf16", "--algo.advantage.estimator", "reinforce_baseline",
    "--actor.adam.lr", "5e-7", "--actor.entropy_coef", "0.0", "--algo.kl.init_coef", "1e-5", "--algo.kl.use_loss",
    "--algo.kl.estimator", "k2", "--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type",
    "icepop", "--logger.tensorboard_dir", "exp/runs", "--logger.logging_steps", "1", "--eval.steps", "-1"]


def _parse(argv, monkeypatch, command, world=1):
    return launched_args(command, argv, monkeypatch, world)


def _refused(argv, monkeypatch, capsys, command) -> str:
    with pytest.raises(SystemExit) as stop:
        _parse(argv, monkeypatch, command)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_openrlhfs_sft_script_is_read_as_coatis_settings(monkeypatch, capsys):
    """train_sft.sh on 8 processes: 256 rows an optimizer step in micro-batches of 2 a process is 16
    accumulation steps; ZeRO-2 is zero2; its columns are read as TRL's prompt and completion; checkpoints go where
    OpenRLHF's --ckpt.path default puts them, and the run resumes from the newest."""
    args = _parse(TRAIN_SFT, monkeypatch, "sft", world=8)
    assert (args.pretrain, args.dataset, args.max_length) == ("meta-llama/Meta-Llama-3-8B", ["Open-Orca/OpenOrca"],
                                                              2048)
    assert dict(args.dataset_columns) == {"question": "prompt", "response": "completion"}
    assert (args.batch_size, args.accumulation_steps, args.max_epochs, args.lr) == (2, 16, 1, 5e-6)
    assert (args.plugin, args.mixed_precision, args.packing, args.grad_checkpoint) == ("zero2", "bf16", True, True)
    assert (args.save_interval, args.eval_interval, args.log_interval) == (0, 0, 1)
    assert (args.output_dir, args.save_dir, args.checkpoint_path) == ("./checkpoint/llama3-8b-sft",
                                                                      "./ckpt/checkpoints_sft", "latest")
    err = capsys.readouterr().err
    assert "note: not used: --data.max_samples (coati trains on every row); --ds.attn_implementation" in err
    assert "--lr_warmup_ratio (OpenRLHF 0.03, here --warmup_ratio 0.0)" in err   # the defaults that differ
    assert not any(name.startswith("openrlhf_") for name in vars(args))


def test_openrlhfs_dpo_rm_and_their_losses(monkeypatch):
    args = _parse([*TRAIN_DPO, "--model.ipo_enable", "--model.label_smoothing", "0.1", "--model.nll_loss_coef", "0.2",
                   "--ref.model_name_or_path", "ref"], monkeypatch, "dpo", world=8)
    assert (args.beta, args.loss_type, args.label_smoothing, args.rpo_alpha, args.ref_pretrain) == (0.1, "ipo", 0.1,
                                                                                                   0.2, "ref")
    assert (args.plugin, args.batch_size, args.accumulation_steps, dict(args.dataset_columns)) == ("gemini", 1, 32, {})
    rm = _parse(["--model.model_name_or_path", "m", "--data.dataset", "d", "--model.loss_type", "logexpwithlogit",
                 "--data.prompt_key", "question", "--ds.adam_offload"], monkeypatch, "rm")
    assert (rm.loss_fn, rm.plugin, dict(rm.dataset_columns)) == ("log_exp", "zero2_cpu", {"question": "prompt"})


def test_openrlhfs_reinforce_baseline_script_is_coatis_grpo_on_its_processes(monkeypatch, capsys):
    """On the 4 processes its --actor.num_gpus_per_node starts: 128 prompts a rollout are 32 a process; its 1024
    samples (x 8 each) make one optimizer step of 256 micro-batches of 1; the KL in the loss (k2), icepop, dynamic
    sampling, vLLM; prompts up to 74240 - 64000 tokens."""
    assert openrlhf_launch("grpo", TRAIN_REINFORCE_BASELINE) == {"--nproc_per_node": "4", "--nnodes": "1"}
    args = _parse(TRAIN_REINFORCE_BASELINE, monkeypatch, "grpo", world=4)
    assert (args.batch_size, args.num_generations, args.train_batch_size, args.accumulation_steps) == (32, 8, 1, 256)
    assert (args.adv_estimator, args.kl_coef, args.kl_estimator, args.kl_in_reward) == ("reinforce_pp_baseline", 1e-5,
                                                                                        "k2", False)
    assert (args.behaviour_correction, dict(args.behaviour_correction_option)) == ("icepop", {"low": 0.5,
                                                                                               "high": 5.0})
    assert (args.dynamic_sampling, args.rollout_backend, args.vllm_enforce_eager) == (True, "vllm", True)
    assert (args.max_length, args.max_new_tokens, args.num_update_steps, args.num_epochs) == (10240, 64000, 1, 1)
    assert args.reward_fn == ["reward_func.py:reward_func"] and dict(args.dataset_columns) == {}   # prompt, label
    assert (args.save_dir, args.save_interval, args.keep_last, args.log_dir) == ("exp/ckpt", 10, 3, "exp/runs")
    assert "--train.colocate_all (coati places every model in each process)" in capsys.readouterr().err
    in_reward = _parse(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d", "--reward.remote_url",
                        "http://rm:5000/get_reward", "--algo.kl.init_coef", "0.01", "--algo.advantage.estimator",
                        "group_norm", "--rollout.n_samples_per_prompt", "4"], monkeypatch, "grpo")
    assert (in_reward.kl_in_reward, in_reward.reward_fn) == (True, ["http://rm:5000/get_reward"])  # OpenRLHF's place


@pytest.mark.parametrize("command, extra, message", [
    ("sft", ["--data.max_lenn", "12"], "--data.max_lenn: no OpenRLHF flag coati reads for coati sft (did you mean "
                                      "--data.max_len?)"),
    ("sft", ["--data.input_template", "Q: {}"], "--data.input_template: coati tokenizes plain-text rows as they are"),
    ("sft", ["--train.batch_size", "7", "--train.micro_batch_size", "2"],
     "--train.batch_size 7 is not a whole number of micro-batches: --train.micro_batch_size 2 x 1 processes"),
    ("sft", ["--data.max_len", "-5"], "argument --data.max_len (--max_length): must be >= 0, got -5"),
    ("grpo", ["--algo.advantage.estimator", "gae"],
     "--algo.advantage.estimator gae trains a critic: run it as coati ppo"),
    ("ppo", ["--algo.advantage.estimator", "group_norm"], "--algo.advantage.estimator group_norm needs no critic: run "
                                                          "it as coati grpo"),
    ("ppo", ["--algo.kl.use_loss"], "--algo.kl.use_loss: coati's PPO puts the KL to the reference in the reward"),
    ("ppo", ["--reward.normalize_enable"], "--reward.normalize_enable: OpenRLHF scales the reward model's scores"),
    ("grpo", ["--rollout.batch_size", "6", "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "5"],
     "--train.batch_size 5 does not split the 24 samples of a rollout"),
    ("sft", ["--ds.zero_stage", "2", "--ds.zero_stage", "3"], "--ds.zero_stage is given twice; keep one"),
    ("sft", ["--data.output_key"], "--data.output_key takes one value, got 0"),
    ("grpo", ["--algo.dynamic_filtering_range", "0.2", "0.8"], "--algo.dynamic_filtering_range 0.2 0.8: coati's "
                                                               "dynamic sampling replaces groups whose rewards all tie "
                                                               "(taken at 0 1 only)"),
    ("ppo", ["--init_kl_coef", "0.1"], "unknown flag --init_kl_coef (OpenRLHF's older flag; its current one is "
                                       "--algo.kl.init_coef)"),
])
def test_what_coati_cannot_honour_is_refused_in_one_line(command, extra, message, monkeypatch, capsys):
    base = {"sft": ["--model.model_name_or_path", "m", "--data.dataset", "d"],
            "ppo": ["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d",
                    "--reward.model_name_or_path", "r"],
            "grpo": ["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d", "--reward.remote_url", "f.py"]}
    assert message in _refused([*base[command], *extra], monkeypatch, capsys, command)


def test_ppos_own_flags_the_schedules_floor_and_what_changes_nothing_without_vllm(monkeypatch, capsys):
    """OpenRLHF's PPO script's clipping, sampling and schedule flags; cosine_with_min_lr ends at OpenRLHF's 0.1 of
    the peak where the run gives no floor; vLLM's flags without an engine, and the defaults that differ, are noted;
    the flags that launched the run are not."""
    args = _parse(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d", "--reward.model_name_or_path", "r",
                   "--actor.dual_clip", "3", "--actor.max_norm", "0.5", "--rollout.top_k", "5", "--actor.lr_scheduler",
                   "cosine_with_min_lr", "--vllm.enforce_eager", "--actor.num_gpus_per_node", "1"], monkeypatch, "ppo")
    assert (dict(args.policy_loss_option), args.grad_clip, args.top_k) == ({"dual_clip": 3}, 0.5, 5)
    assert (args.lr_scheduler, dict(args.lr_scheduler_option)) == ("cosine_with_min_lr", {"min_lr_rate": 0.1})
    assert (args.rollout_backend, args.vllm_enforce_eager) == ("hf", False)
    err = capsys.readouterr().err
    assert "note: not used: --vllm.enforce_eager (no vLLM engine (--vllm.num_engines 0)" in err
    assert "--actor.num_gpus_per_node" not in err
    assert "--critic.adam.lr (OpenRLHF 9e-06, here --critic_lr unset: --lr); --critic.value_clip (OpenRLHF 0.5, here " \
           "--value_clip 0.2); --algo.advantage.lambd (OpenRLHF 1.0, here --lam 0.95)" in err


def test_an_openrlhf_reward_func_gets_the_sequences_prompts_and_labels():
    """OpenRLHF's `reward_func(queries, prompts, labels)`: queries are the full sequences as text, labels the rows'
    label column; a dict's rewards are the reward, its extra_logs logged beside it; a tensor alone is the reward."""
    seen = []

    def reward_func(queries, prompts, labels, **kwargs):
        seen.append((queries, prompts, labels))
        reward = torch.tensor([float(q.endswith(label)) for q, label in zip(queries, labels)])
        return {"rewards": reward, "scores": reward, "extra_logs": {"length": torch.tensor([len(q) for q in queries])}}

    reward = WeightedReward([("reward_func", OpenRLHFReward(reward_func), 1.0)])
    assert reward.takes_sequences
    completions = [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]]
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    sequences = Sequences(["<u>2+2?<a>4", "<u>2+2?<a>5"], [[1, 2], [1, 3]])
    total, components = reward(["2+2?", "2+2?"], ["4", "5"], sequences=sequences,
                               inputs=RewardInputs(prompts, completions, [[2], [3]]), label=["4", "4"])
    assert total == [1.0, 0.0] and components["reward_func/length"] == [11.0, 11.0]
    assert seen == [(["<u>2+2?<a>4", "<u>2+2?<a>5"], ["2+2?", "2+2?"], ["4", "4"])]
    assert OpenRLHFReward(lambda queries, prompts, labels: torch.ones(len(queries)))(
        ["p"], ["c"]).values == [1.0]


def test_a_grpo_run_in_openrlhfs_flags_trains_with_its_reward_func_file(world_of_one, tiny_assets, tmp_path,
                                                                        monkeypatch):
    """Its prompts named `context_messages`, its answers `answer` (`--data.label_key`), a reward_func file as
    OpenRLHF's examples write it: the run trains, logs the function's extra_logs, and saves its model."""
    from coati.cli import commands
    from support import run_main

    rows = [{"context_messages": [{"role": "user", "content": f"What is {n}+1?"}], "answer": str(n + 1)}
            for n in range(8)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "reward_func.py").write_text(
        "import torch\n\n\ndef reward_func(queries, prompts, labels, **kwargs):\n"
        "    reward = torch.tensor([float(label in query) for query, label in zip(queries, labels)])\n"
        "    return {'rewards': reward, 'scores': reward, 'extra_logs': {'dummy_scores': reward}}\n")
    monkeypatch.chdir(tmp_path)
    result = run_main(commands.grpo, [
        "--actor.model_name_or_path", str(tiny_assets["model"]), "--reward.remote_url", "reward_func.py",
        "--data.prompt_dataset", "prompts.jsonl", "--data.input_key", "context_messages", "--data.label_key", "answer",
        "--data.max_len", "72", "--rollout.max_new_tokens", "8", "--rollout.batch_size", "2",
        "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "2", "--train.micro_batch_size", "1",
        "--algo.advantage.estimator", "group_norm", "--ds.zero_stage", "0", "--ckpt.output_dir", "out",
        "--logger.logging_steps", "1", "--train.num_episodes", "1"])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in logged if "train/loss" in r]
    assert len(train) == 4 and all("train/rewards/reward_func/dummy_scores/mean" in r for r in train)
    assert (tmp_path / "out" / "model" / "config.json").is_file()


def test_the_migration_page_names_every_openrlhf_flag_coati_takes():
    from conftest import REPO
    from coati.cli.openrlhf_names import COMMON, DPO, RM, SUPERVISED, _on_policy

    page = (REPO / "docs" / "migration" / "openrlhf.md").read_text()
    flags = {*COMMON, *SUPERVISED, *RM, *DPO, *_on_policy("ppo"), *_on_policy("grpo")}
    assert sorted(flag for flag in flags if f"`--{flag}`" not in page) == []


def test_a_wandb_key_flag_is_the_runs_key_and_no_record_keeps_it(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "the-login-one")
    args = _parse(["--model.model_name_or_path", "m", "--data.dataset", "d", "--logger.wandb.key", "s3cret",
                   "--logger.wandb.project", "p"], monkeypatch, "sft")
    assert args.use_wandb and args.wandb_project == "p" and args._run_record.argv[5] == "***"
    assert "s3cret" not in repr(args._run_record) and os.environ["WANDB_API_KEY"] == "s3cret"
    kept = _parse(["--model.model_name_or_path", "m", "--data.dataset", "d", "--logger.wandb.key=True"], monkeypatch,
                  "sft")   # OpenRLHF's True: the key `wandb login` keeps
    assert kept.use_wandb and os.environ["WANDB_API_KEY"] == "s3cret"
