"""The demos end to end at a small size, every stage under torchrun: each stage's outputs, the held-out table, the
plots and the report (Markdown and standalone HTML)."""
import json
import subprocess
import sys

import pytest
from PIL import Image

from conftest import REPO, child_env


@pytest.mark.slow
def test_demo_runs_every_stage_and_writes_the_report(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, str(REPO / "applications" / "demo" / "run_demo.py"), "--out", str(out),
                             "--steps", "4", "--model_size", "tiny"], capture_output=True, text=True, cwd=REPO,
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
    assert [p.name for p in images] == ["heldout_accuracy.png", "ppo_critic.png", "rl_kl_length.png", "rl_reward.png",
                                        "rm_accuracy.png", "sft_loss.png"]
    ppo = [json.loads(line) for line in (out / "ppo" / "logs" / "metrics.jsonl").read_text().splitlines()]
    sampled = [r["train/num_completions"] for r in ppo if "train/num_completions" in r]
    assert sampled == sorted(sampled) and sampled[-1] > 0   # the RL plots' x axis: completions sampled so far
    for image in images:
        assert f"](plots/{image.name})" in markdown
        with Image.open(image) as png:
            assert png.size[0] >= 400 and len(set(png.convert("L").getdata())) > 10, image.name   # drawn, not blank
    page = (out / "REPORT.html").read_text()
    assert page.count("data:image/png;base64,") == len(images) and "Sample completions before and after RL" in page


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


@pytest.mark.slow
@pytest.mark.extended
def test_vision_demo_trains_on_drawn_problems_and_reports_sample_images(tmp_path):
    out = tmp_path / "demo_vision"
    result = subprocess.run([sys.executable, str(REPO / "applications" / "demo" / "run_vision_demo.py"), "--out",
                             str(out), "--sft_rows", "64", "--sft_steps", "4", "--episodes", "2"],
                            capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    for stage in ("sft", "grpo"):
        assert f"[demo] {stage}: done in " in result.stdout, stage
        assert (out / stage / "model" / "preprocessor_config.json").is_file(), stage   # exported with its processor
    assert len(list((out / "raw" / "images").glob("*.png"))) == 64 + 2048 + 256
    accuracy = json.loads((out / "heldout_accuracy.json").read_text())
    assert set(accuracy) == {"initial", "sft", "grpo"}
    markdown = (out / "REPORT.md").read_text()
    for name, value in accuracy.items():
        assert f"| {name} | {value:.3f} | 256 |" in markdown
    images = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert images == ["grpo.png", "heldout_accuracy.png", "samples.png", "sft_loss.png"]
    with Image.open(out / "plots" / "samples.png") as sheet:
        assert sheet.size[0] >= 800 and len(set(sheet.convert("L").getdata())) > 50   # the drawn problems are on it
    assert (out / "REPORT.html").read_text().count("data:image/png;base64,") == 4
