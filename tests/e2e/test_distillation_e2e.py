"""On-policy distillation under torchrun: GRPO and PPO distilling from a teacher (with rewards, and alone from a served
one), and a teacher that is the policy stopping the run in one line."""
import json
import re
import shutil

import pytest

from conftest import SCRIPTS, torchrun
from support import teacher_model as _teacher_model


def _rl(tiny_assets, out, script, *extra, **env):
    return torchrun(SCRIPTS / script, 2, "--pretrain", str(tiny_assets["model"]), "--prompt_dataset",
                    str(tiny_assets["prompt_train"]), "--plugin", "ddp", "--batch_size", "2", "--num_generations", "3",
                    "--max_new_tokens", "8", "--num_episodes", "2", "--log_dir", str(out / "logs"), *extra, **env)


@pytest.mark.parametrize("script, rewards, loss", [
    ("train_grpo.py", ["--reward_fn", "math_answer"], "gkd"), ("train_grpo.py", [], "gkd"),
    ("train_ppo.py", ["--reward_fn", "math_answer"], "forward_kl_topk")],
    ids=["grpo_with_rewards", "grpo_alone_served", "ppo_with_rewards"])
def test_rl_distils_from_a_teacher_under_torchrun(tiny_assets, tmp_path_factory, script, rewards, loss):
    """With rewards, from a teacher folder; alone, from a teacher served on coati's OpenAI-compatible server."""
    from coati.inference.local_judge import JudgeServerConfig, LocalJudge

    out = tmp_path_factory.mktemp("distil")
    teacher = _teacher_model(tiny_assets, out / "teacher")
    served = None if rewards else LocalJudge(JudgeServerConfig(str(teacher))).start()
    try:
        where = ["--teacher_url", served.url] if served else ["--teacher_model", str(teacher)]
        result = _rl(tiny_assets, out, script, *where, "--distill_loss", loss, "--distill_top_k", "4", *rewards,
                     **({"COATI_TEACHER_TOKEN": served.token} if served else {}))
    finally:
        if served:
            served.close()
    assert result.returncode == 0, result.stderr[-3000:]
    trained = [m for m in map(json.loads, (out / "logs" / "metrics.jsonl").read_text().splitlines()) if "train/loss" in m]
    assert len(trained) == 2
    assert all(m["train/loss/distill"] > 0 and m["train/rollout/distill_reverse_kl"] != 0 for m in trained)
    assert all(("train/rewards/math_answer/mean" in m) == bool(rewards) for m in trained)


def test_a_teacher_that_is_the_policy_stops_the_run_in_one_line(tiny_assets, tmp_path):
    copy = shutil.copytree(tiny_assets["model"], tmp_path / "same_weights")
    result = _rl(tiny_assets, tmp_path, "train_grpo.py", "--teacher_model", str(copy))
    assert result.returncode != 0
    errors = {line for line in result.stderr.splitlines() if line.startswith("error: ")}
    assert len(errors) == 1 and re.fullmatch(r"error: the distillation term is zero on every one of the \d+ sampled "
                                             r"tokens in this batch: .*", errors.pop())
    assert re.search(r"exitcode\s*: 2", result.stderr), result.stderr[-3000:]
