"""The demos' flags and stage checks, their CPU-kernel cap and the rewards demo's judge data, in this process (the
demos end to end, every stage under torchrun: e2e/test_demo_pipeline_e2e.py)."""
import argparse
import os
import platform
import re
import subprocess
import sys

import pytest

from conftest import REPO, child_env


def _demo(name: str):
    folder = str(REPO / "applications" / "demo")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return __import__(name)


def test_a_plot_against_completions_sampled_places_each_evaluation_at_its_steps_count():
    records = [{"step": 0, "eval/acc": 0.5}, {"step": 1, "train/num_completions": 32.0, "train/reward": 1.0},
               {"step": 2, "train/num_completions": 64.0, "train/reward": 2.0, "eval/acc": 0.7}]
    report = _demo("report")
    assert report.series(records, "eval/acc", "train/num_completions") == ([0.0, 64.0], [0.5, 0.7])
    assert report.series(records, "train/reward", "train/num_completions") == ([32.0, 64.0], [1.0, 2.0])
    assert report.series(records, "train/reward") == ([1, 2], [1.0, 2.0])


def test_a_panels_y_range_holds_early_outliers_at_its_edge_and_counts_them(tmp_path):
    report = _demo("report")
    assert report.clipped([-40.0, -0.5, 0.2, 3.0], (-1.0, 1.0)) == ([-1.0, -0.5, 0.2, 1.0], 2)
    assert report.clipped([-40.0], None) == ([-40.0], 0)
    records = [{"step": s, "train/explained_variance": v} for s, v in enumerate([-40.0, -2.0, 0.1, 0.3], 1)]
    path = report.plot(tmp_path / "critic.png", "critic", [("EV", [("PPO", records, "train/explained_variance")])],
                       ylims={"EV": (-1.0, 1.0)})
    assert path.is_file() and path.stat().st_size > 1000


@pytest.mark.parametrize("demo, stages, missing", [("run_demo", ["ppo"], "sft"), ("run_demo", ["sft", "ppo"], "rm"),
                                                   ("run_rewards_demo", ["judge"], "sft"),
                                                   ("run_rewards_demo", ["sft", "distill"], "grpo"),
                                                   ("run_rewards_demo", ["sft", "judge", "judge2"], "grpo_judge")])
def test_a_stage_whose_input_model_is_missing_is_refused_in_one_line_before_any_work(demo, stages, missing, tmp_path,
                                                                                      capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        _demo(demo).main(["--out", str(out), "--stages", *stages])
    assert exited.value.code == 2 and not out.exists()
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"error: --stages {stages[-1]} needs the {missing} stage's model and {out / missing / 'model'}"
                          f" has none: add {missing} to --stages, or run it into this --out first")


@pytest.mark.parametrize("demo, flag, value, wanted", [("run_demo", "--steps", "0", ">= 1"),
                                                       ("run_rewards_demo", "--episodes", "0", ">= 1"),
                                                       ("run_rewards_demo", "--judge2_kl_coef", "-1", ">= 0"),
                                                       ("run_agent_demo", "--episodes", "0", ">= 1"),
                                                       ("run_agent_demo", "--tool_fraction", "1.5", "in [0, 1]"),
                                                       ("run_vision_demo", "--sft_steps", "0", ">= 1")])
def test_a_demo_flag_out_of_range_is_refused_by_name_before_any_work(demo, flag, value, wanted, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        _demo(demo).main(["--out", str(out), flag, value])
    assert exited.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: argument {flag}: must be {wanted}, "
                                                                      f"got {value}")


def test_a_stage_whose_input_model_an_earlier_run_left_is_accepted(tmp_path):
    demo = _demo("run_rewards_demo")
    (tmp_path / "sft" / "model").mkdir(parents=True)
    (tmp_path / "sft" / "model" / "config.json").write_text("{}")
    demo.check_stage_inputs(argparse.ArgumentParser(), tmp_path, ["judge", "grpo_judge"], demo.NEEDS)


def test_the_demos_cap_cpu_kernels_at_avx2_on_x86_unless_the_environment_chooses(monkeypatch, capsys):
    demo = _demo("run_demo")
    for name in demo.PORTABLE_CPU_KERNELS:   # set, then removed: monkeypatch restores the absence after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    demo.use_portable_cpu_kernels()
    assert "ATEN_CPU_CAPABILITY" not in os.environ and capsys.readouterr().out == ""
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    demo.use_portable_cpu_kernels()
    assert (os.environ["ATEN_CPU_CAPABILITY"], os.environ["MKL_CBWR"]) == ("avx2", "AVX2")
    assert "[demo] CPU kernels: ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2" in capsys.readouterr().out
    stage = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           capture_output=True, text=True, env=child_env())
    assert stage.stdout.split()[-1] in ("AVX2", "DEFAULT")   # a stage's torch, whatever this CPU offers beyond
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    demo.use_portable_cpu_kernels()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "default"


def test_the_judges_written_responses_are_graded_as_math_answer_grades_them(tiny_assets):
    """The rewards demo's judge learns `math_answer`'s verdicts, garbled answer lines included (`#### 1 1` for 11 is
    wrong), working cut before its answer line and scrambled working (`## 1 = 1.` before a right or a wrong answer
    line), and whether the working agrees with the answer line tells nothing: judges that never saw these, or could
    lean on the last, were exploited by GRPO."""
    from transformers import AutoTokenizer

    from coati.rewards.math import math_answer

    demo = _demo("run_rewards_demo")
    items = demo.problems(400, "train", 4)
    records = demo.graded_responses(AutoTokenizer.from_pretrained(tiny_assets["model"]), items, seed=4)
    responses = [r["messages"][0]["content"].split("\nResponse: ")[1].split("\nScore: 10 if")[0] for r in records]
    grades = math_answer([], responses, [str(p.answer) for p in items]).values
    assert [r["messages"][1]["content"] for r in records] == [f"Score: {10 if g else 0}" for g in grades]
    assert 0.4 < sum(grades) / len(grades) < 0.65
    spaced = [record["messages"][1]["content"] for record, response, p in zip(records, responses, items)
              if p.answer >= 10 and response.endswith(f"#### {' '.join(str(p.answer))}")]
    assert spaced and set(spaced) == {"Score: 0"}
    unanswered = [record["messages"][1]["content"] for record, response in zip(records, responses)
                  if "####" not in response and " = " in response]
    assert set(unanswered) == {"Score: 0", "Score: 10"}   # as math_answer reads the working's result
    worked = [(re.match(r"\d+ [-+] \d+ = (-?\d+)\.\n#### (.+)$", r), g) for r, g in zip(responses, grades)]
    agrees = {(m.group(1) == m.group(2), g) for m, g in worked if m}
    assert agrees == {(True, 1.0), (True, 0.0), (False, 1.0), (False, 0.0)}
    scrambled = [g for r, g in zip(responses, grades) if "\n#### " in r
                 and not re.fullmatch(r"\d+ [-+] \d+ = -?\d+\.", r.split("\n")[0])]
    assert len(scrambled) > 0.15 * len(items) and set(scrambled) == {0.0, 1.0}
