"""Shared fixtures: locally built tiny model and data, a world-of-one process group, a served reward model, a torchrun
helper. Being here, in `tests/`, this file puts `tests/` on `sys.path` for the test files of every folder below it
(`from conftest import ...`, `from support import ...`)."""
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "examples" / "training_scripts"
AGENTS = REPO / "examples" / "agents"


@pytest.fixture(autouse=True)
def same_random_state():
    """Every test draws from the same RNG state (torch, random, numpy) whatever ran before it, and leaves the state
    as it found it: a test's unseeded draws do not depend on the order of the tests."""
    import random

    import numpy
    import torch

    saved = torch.random.get_rng_state(), random.getstate(), numpy.random.get_state()
    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    yield
    torch.random.set_rng_state(saved[0])
    random.setstate(saved[1])
    numpy.random.set_state(saved[2])


@pytest.fixture(scope="session", autouse=True)
def prepared_cache_of_the_session(tmp_path_factory):
    """Prepared data is cached in a folder of this session (`$COATI_CACHE`, which the runs a test starts inherit):
    the tests write nothing to the user's ~/.cache and read nothing an earlier version left there."""
    saved = os.environ.get("COATI_CACHE")
    os.environ["COATI_CACHE"] = str(tmp_path_factory.mktemp("prepared-cache"))
    yield
    if saved is None:
        os.environ.pop("COATI_CACHE")
    else:
        os.environ["COATI_CACHE"] = saved


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """A tiny model directory and prepared SFT, preference and prompt train/eval datasets, built once per session."""
    return build_tiny_assets(tmp_path_factory.mktemp("assets"))


def build_tiny_assets(root: Path) -> dict:
    """`tiny_assets` in the folder `root`: the same files on every machine (seeded)."""
    from transformers import AutoTokenizer

    from coati.dataset.demo_data import (generate_problems, preference_records, prompt_records, sft_records,
                                         tokenizer_corpus, write_jsonl)
    from coati.dataset.prepare import prepare_dataset, prepare_preference, prepare_sft
    from coati.models.tiny import write_tiny_model

    root.mkdir(parents=True, exist_ok=True)
    model_dir = write_tiny_model(root / "model", tokenizer_corpus(400))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    paths = {"model": model_dir}
    for split, n in (("train", 96), ("eval", 32)):
        raw = write_jsonl(sft_records(generate_problems(n, split)), root / f"sft_{split}.jsonl")
        prepare_sft([raw], tokenizer, 128, root / f"sft_{split}")
        paths[f"sft_{split}"] = root / f"sft_{split}"
        raw = write_jsonl(preference_records(generate_problems(n, split)), root / f"pref_{split}.jsonl")
        prepare_preference([raw], tokenizer, 128, root / f"pref_{split}")
        paths[f"pref_{split}"] = root / f"pref_{split}"
        raw = write_jsonl(prompt_records(generate_problems(n, split)), root / f"prompt_{split}.jsonl")
        prepare_dataset([raw], "prompt", tokenizer, 64, root / f"prompt_{split}")
        paths[f"prompt_{split}"] = root / f"prompt_{split}"
    return paths


@pytest.fixture(scope="session")
def vision_assets(tmp_path_factory):
    """Tiny Qwen2.5-VL and LLaVA models with their processors, and TRL-style image rows (SFT, preference, prompt) of
    drawn arithmetic problems in a folder beside their images, built once per session."""
    return build_vision_assets(tmp_path_factory.mktemp("vision"))


def build_vision_assets(root: Path, rows: int = 32) -> dict:
    from coati.dataset.demo_data import (generate_problems, image_records, tokenizer_corpus, vision_preference_records,
                                         vision_prompt_records, vision_sft_records, write_jsonl)
    from coati.models.tiny import write_tiny_vl_model

    corpus = tokenizer_corpus(400)
    paths = {style: write_tiny_vl_model(root / style, corpus, style) for style in ("qwen2_5_vl", "llava")}
    drawn = image_records(generate_problems(rows, "train"), root / "data")
    paths["sft"] = write_jsonl(vision_sft_records(drawn), root / "data" / "sft.jsonl")
    paths["preference"] = write_jsonl(vision_preference_records(drawn), root / "data" / "preference.jsonl")
    paths["prompt"] = write_jsonl(vision_prompt_records(drawn), root / "data" / "prompt.jsonl")
    return paths


def end_turns_early(model: Any) -> Any:
    """`model` (the tiny Llama) with its last norm cut to one channel, which the end-of-turn logit reads: its turns end
    after a few random tokens, so multi-turn episodes last several turns."""
    import torch

    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight[model.config.eos_token_id, 0] = 6.0
    return model


@pytest.fixture(scope="session")
def turn_ender(tiny_assets, tmp_path_factory):
    """The tiny model with `end_turns_early`, saved with its tokenizer."""
    return build_turn_ender(tiny_assets, tmp_path_factory.mktemp("turn_ender"))


def build_turn_ender(tiny_assets: dict, path: Path) -> Path:
    """`turn_ender` in the folder `path`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    end_turns_early(AutoModelForCausalLM.from_pretrained(tiny_assets["model"])).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_assets["model"]).save_pretrained(path)
    return path


@pytest.fixture
def endpoint():
    """A factory of grading endpoints (`judge_endpoint.Grader`), each stopped after the test."""
    from judge_endpoint import Grader, serve

    servers = []

    def start(**options):
        grader = Grader(**options)
        server, url = serve(grader)
        servers.append(server)
        return grader, url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tokenizer(tiny_assets):
    """The tiny model's tokenizer, one per test module."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_assets["model"])


REWARD_SERVER = REPO / "examples" / "reward_server.py"
REWARD_SERVER_TOKEN = "test-token-7f3a"
"""The served reward model's bearer token: the trainers in the tests get it as a user would, from the environment."""


@pytest.fixture(scope="module")
def reward_model_dir(tiny_assets, tmp_path_factory):
    """A reward model directory as train_rm.py leaves one (model with its value head, and the tokenizer)."""
    import torch
    from transformers import AutoTokenizer

    from coati.models.reward_model import load_reward_model

    folder = tmp_path_factory.mktemp("rm")
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    torch.manual_seed(0)
    load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def served(reward_model_dir, tmp_path_factory):
    """(URL, request log) of examples/reward_server.py serving the reward model on a free local port, requiring
    `REWARD_SERVER_TOKEN` (test_vllm_backend.py's own `served` is a vLLM server)."""
    log = tmp_path_factory.mktemp("server") / "requests.jsonl"
    server = subprocess.Popen([sys.executable, str(REWARD_SERVER), "--model", str(reward_model_dir), "--port", "0",
                               "--log", str(log), "--token", REWARD_SERVER_TOKEN], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=REPO)
    line = server.stdout.readline()
    assert "(bearer token required)" in line, line
    match = re.search(r"on (http://\S+)", line)
    assert match, line + server.stdout.read()[-2000:] if server.poll() is not None else line
    yield match.group(1), log
    server.kill()
    server.wait()


@pytest.fixture(scope="module")
def small_model(tiny_assets, tmp_path_factory):
    """The tiny assets' tokenizer with the `small` model: vLLM's CPU attention takes head sizes from 32 up. Its context
    holds a multi-turn episode's prompt with the calculator's schema (about 550 tokens of this small vocabulary)."""
    from transformers import AutoTokenizer

    from coati.models.tiny import build_tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    out = tmp_path_factory.mktemp("small_model")
    build_tiny_llama(tokenizer, size="small", max_position_embeddings=1024).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def vllm_environment():
    """For the tests that start vLLM servers (all `extended`: `make test-extended` builds vLLM's environment): skips
    them where that environment is missing, and fails them instead on CI."""
    from coati.inference.vllm import default_vllm_python

    if not os.access(default_vllm_python(), os.X_OK):
        if os.environ.get("CI"):
            raise RuntimeError(f"CI runs these vLLM tests: {default_vllm_python()} is missing (make vllm-env builds it)")
        pytest.skip("no vLLM environment: `make vllm-env` builds it")


@pytest.fixture(scope="session")
def world_of_one():
    """colossalai's process group with one CPU rank, for trainer tests that run in this process."""
    from coati.distributed.launch import init_distributed

    init_distributed(seed=0)
    yield


HISTORY_REWRITING = (   # drops the reasoning of every assistant turn but the last, as DeepSeek-R1-style templates do
    "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
    "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""A chat template that rewrites history, which multi-turn rollouts refuse."""

TORCHRUN_ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
PROCESS_GROUP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What `world_of_one` leaves in this process's environment: a child started with it would join this
process's store instead of starting its own."""


def checkpoint_names(save_dir: Path) -> list:
    """The checkpoint folders (`epoch-E_step-S`) in `save_dir`, by name: not the final model a script exports there
    without --output_dir (`modeling`, ColossalChat's place)."""
    return sorted(p.name for p in Path(save_dir).iterdir() if p.name.startswith("epoch-"))


def child_env(**extra: str) -> dict:
    """The environment for a script started from a test: this one without the process-group variables, with
    TORCHRUN_ENV and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in PROCESS_GROUP_ENV}
    return {**env, **TORCHRUN_ENV, **extra}


def torchrun_cmd(script: Path, nproc: int, *args: str) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script), *args]


def torchrun(script: Path, nproc: int, *args: str, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """Launch `script` with real torchrun processes, with `env` added to their environment, and capture its output."""
    return subprocess.run(torchrun_cmd(script, nproc, *args), capture_output=True, text=True, timeout=timeout,
                          env=child_env(**env), cwd=REPO)


def dist_script_result(name: str, nproc: int = 2) -> dict:
    """Run tests/dist_scripts/`name` on `nproc` ranks and return the JSON it prints after `RESULT `."""
    result = torchrun(REPO / "tests" / "dist_scripts" / name, nproc, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def start_torchrun(script: Path, nproc: int, *args: str, log: Path, **env: str) -> subprocess.Popen:
    """Start `script` under torchrun in the background, with `env` added to its environment, output to `log`."""
    with open(log, "w") as out:
        return subprocess.Popen(torchrun_cmd(script, nproc, *args), stdout=out, stderr=subprocess.STDOUT,
                                env=child_env(**env), cwd=REPO)


def train_records(log_dir: Path) -> list:
    """Logged training metrics without wall-clock values (timings differ from run to run)."""
    records = [json.loads(line) for line in (Path(log_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("train/time/") and not k.endswith("_seconds")}
            for r in records if "train/loss" in r]


def assert_same_records(got: list, want: list, rel: float = 1e-5, abs: float = 1e-6) -> None:
    """Two runs' logged records agree: the same steps and names, and each value within `rel`/`abs`. For runs whose
    numbers come from different processes or batch layouts (a resumed run's fresh engine servers), which may round
    differently in the last bits."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), (g["step"], sorted(set(g) ^ set(w)))
        for name, value in w.items():
            assert g[name] == pytest.approx(value, rel=rel, abs=abs), (g["step"], name)


def completion_tokens(completions: Any, row: int = 0) -> list:
    """The generated tokens of one row of a `coati.rollout.pool.Completions`."""
    return completions.rows[row].token_ids


def kill_run(proc: subprocess.Popen) -> int:
    """SIGKILL torchrun and every worker, as a crash would (torchrun puts workers in sessions of their own,
    so killing its process group is not enough); returns torchrun's exit status."""
    import psutil

    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    for worker in workers:
        worker.kill()
    psutil.wait_procs(workers, timeout=60)
    return proc.wait()


def parsed_args(command: str, argv, monkeypatch) -> Any:
    """The args `coati <command>` (and `train_<command>.py`) would run with: its run function replaced by one that
    returns them, and the paths, which name no files in the tests that parse only, not checked."""
    from coati.cli import commands

    home, runner = ("coati.cli.rl_runner", f"run_{command}") if command in ("ppo", "grpo") else (
        "coati.cli.runner", "run_supervised")
    seen = {}
    monkeypatch.setattr(importlib.import_module(home), runner, lambda args, *a, **k: seen.setdefault("args", args))
    monkeypatch.setattr(commands, "check_paths", lambda args: {})
    getattr(commands, command)(list(argv))
    return seen["args"]


def launched_args(command: str, argv, monkeypatch, world: int) -> Any:
    """`parsed_args` as the `coati` command checks the flags for a launch of `world` processes, before it starts
    them."""
    from coati.distributed.launch import LAUNCH

    token = LAUNCH.set((world, world))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    try:
        return parsed_args(command, argv, monkeypatch)
    finally:
        LAUNCH.reset(token)


def unknown_metrics(records: list) -> list:
    """The logged names in `records` that the metric catalogue (`coati.trainer.metric_names`) does not describe."""
    from coati.trainer.metric_names import describe

    return sorted({name for record in records for name in record if name != "time" and describe(name) is None})
