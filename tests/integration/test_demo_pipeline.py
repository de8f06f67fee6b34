"""The demo pipeline end to end at a small size: every stage's outputs, the held-out table, the plots
and the report (Markdown and standalone HTML)."""
import argparse
import json
import os
import platform
import re
import subprocess
import sys

import pytest
from PIL import Image

from conftest import REPO, child_env


@pytest.mark.slow
def test_demo_runs_every_stage_and_writes_the_report(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, str(REPO / "applications" / "demo" / "run_demo.py"), "--out", str(out),
                             "--steps", "12", "--model_size", "tiny"], capture_output=True, text=True, cwd=REPO,
                            env=child_env(), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("[demo]")]
    for name in ("sft", "rm", "ppo", "grpo", "report"):
        assert any(line.startswith(f"[demo] {name}: done in ") for line in lines), name
    assert lines[-1] == f"[demo] finished: report in {out / 'REPORT.md'} (and {out / 'REPORT.html'})"
    for stage in ("sft", "rm", "ppo", "grpo"):
        assert (out / stage / "model" / "config.json").is_file(), stage
        assert (out / stage / "logs" / "metrics.jsonl").stat().st_size > 0, stage
        assert any((out / stage / "checkpoints").iterdir()), stage
    assert (out / "ppo" / "logs" / "rich_completions").is_dir() and (out / "grpo" / "eval_results.json").is_file()
    accuracy = json.loads((out / "heldout_accuracy.json").read_text())
    assert set(accuracy) == {"initial", "sft", "ppo", "grpo"} and all(0 <= v <= 1 for v in accuracy.values())
    markdown = (out / "REPORT.md").read_text()
    for name, value in accuracy.items():
        assert f"| {name} | {value:.3f} | 256 |" in markdown
    assert "## Did RL help?" in markdown and f"held-out accuracy {accuracy['sft']:.3f} -> {accuracy['ppo']:.3f}" in markdown
    images = sorted((out / "plots").glob("*.png"))
    assert [p.name for p in images] == ["heldout_accuracy.png", "rl_kl_length.png", "rl_reward.png", "rm_accuracy.png",
                                        "sft_loss.png"]
    for image in images:
        assert f"](plots/{image.name})" in markdown
        with Image.open(image) as png:
            assert png.size[0] >= 400 and len(set(png.convert("L").getdata())) > 10, image.name   # drawn, not blank
    page = (out / "REPORT.html").read_text()
    assert page.count("data:image/png;base64,") == len(images) and "Sample completions before and after RL" in page


def _demo(name: str):
    folder = str(REPO / "applications" / "demo")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return __import__(name)


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
                                                       ("run_rewards_demo", "--judge2_kl_coef", "-1", ">= 0")])
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


@pytest.mark.extended
def test_rewards_demo_runs_the_judge_the_prm_and_distillation_and_writes_the_report(tmp_path):
    out = tmp_path / "demo_rewards"
    result = subprocess.run([sys.executable, str(REPO / "applications" / "demo" / "run_rewards_demo.py"), "--out",
                             str(out), "--steps", "12", "--judge_steps", "40", "--episodes", "4", "--model_size", "tiny"],
                            capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    for stage in ("sft", "grpo", "judge", "grpo_judge", "judge2", "grpo_judge2", "prm", "grpo_prm", "distill"):
        assert f"[demo] {stage}: done in " in result.stdout, stage
        assert (out / stage / "model" / "config.json").is_file(), stage
    results = json.loads((out / "results.json").read_text())
    models = ("sft", "grpo", "grpo + judge", "grpo + judge, round 2", "grpo + prm", "distilled from grpo")
    judged = [f"{judge} grading accuracy{on}" for judge in ("judge", "judge2")
              for on in ("", " on the SFT model's responses")]
    assert all(0 <= results[name] <= 1 for name in (*models, *judged, "prm step accuracy"))
    assert "judge_train with the sft model's responses: 576 rows kept" in result.stdout   # 384 written, 192 sampled
    assert "judge2_train with the grpo_judge model's responses: 768 rows kept" in result.stdout   # and 192 more
    assert all(set(results["accuracy during training"][name]) == {"0", "1", "2", "3", "4"}
               for name in ("grpo_judge", "grpo_judge2", "distill"))
    leash = {stage: {json.loads(line).get("train/kl_coeff") for line in
                     (out / stage / "logs" / "metrics.jsonl").read_text().splitlines()} - {None}
             for stage in ("grpo_judge", "grpo_judge2")}
    assert leash == {"grpo_judge": {0.0}, "grpo_judge2": {0.1}}   # round 2 only is on a KL leash
    markdown = (out / "REPORT.md").read_text()
    assert all(f"| {name} | {results[name]:.3f} |" in markdown for name in models)
    assert (out / "grpo_judge" / "logs" / "judge_rank1.log").read_text().count("serving judge") == 1


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
