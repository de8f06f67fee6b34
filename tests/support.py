"""What several test files use: a GRPO trainer on the tiny model, a supervised trainer on a linear regression, a
hook recorder, the sandbox's limits and process census, a teacher model, the `coati` command in a fresh process, and a
script's `main` in this one. Test files import from here, never from one another."""
import contextlib
import io
import os
import subprocess
import sys
from typing import Callable, List

import psutil
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.cli.runner import build_dataloader
from coati.config import GRPOConfig, SamplingConfig
from coati.dataset import PromptCollator
from coati.dataset.demo_data import generate_problems, prompt_records
from coati.dataset.prepare import encode_prompt
from coati.experience.experience import GRPOExperienceMaker
from coati.experience.scorer import Scorer
from coati.models.generation import HFEngine
from coati.rewards import WeightedReward
from coati.rewards.sandbox import BWRAP, NAMESPACES, UID_RANGE, Sandbox, SandboxLimits, bwrap_problem
from coati.trainer import BatchResult, Callback, SLTrainer
from coati.trainer.grpo import GRPOTrainer
from conftest import REPO, child_env


class Recorder(Callback):
    """Records every hook call as (name, arguments) in `events`."""

    def __init__(self):
        self.events = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            return lambda *args: self.events.append((name, args))
        return super().__getattribute__(name)


def grpo_trainer(assets, optimizer_cls=torch.optim.AdamW, old_log_probs_at_collection=True, maker_config=None,
                 **kwargs) -> GRPOTrainer:
    """A GRPOTrainer on 8 prompts, 2 per batch (an epoch of prompts every 4 batches), with `kwargs`; its maker's
    `GRPOConfig` takes the fields of `maker_config` too (parts resolve their settings when they are built)."""
    tokenizer = AutoTokenizer.from_pretrained(assets["model"])
    rows = [encode_prompt(tokenizer, r, 64) for r in prompt_records(generate_problems(8, "train"))]
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    loader = build_dataloader(plugin, rows, 2, PromptCollator(tokenizer.pad_token_id), True, 0)
    model = AutoModelForCausalLM.from_pretrained(assets["model"])
    optimizer = optimizer_cls(model.parameters(), lr=1e-3)
    actor, optimizer, *_ = booster.boost(model, optimizer)
    engine = HFEngine(actor.unwrap(), tokenizer.pad_token_id, [tokenizer.eos_token_id])
    config = GRPOConfig(**{"num_generations": 4, "sampling": SamplingConfig(max_new_tokens=8),
                           "old_log_probs_at_collection": old_log_probs_at_collection, **(maker_config or {})})
    scorer = Scorer(tokenizer, WeightedReward.from_specs(["math_answer", "answer_format"]))
    maker = GRPOExperienceMaker(actor, engine, scorer, config)
    return GRPOTrainer(actor, optimizer, booster, maker, loader, **kwargs)


class SquaredError(SLTrainer):
    """loss_i = (w . x_i - y_i)^2, summed; one item per row."""

    def _compute_batch(self, batch):
        err = self.model(batch["x"]).squeeze(-1) - batch["y"]
        loss = (err ** 2).sum()
        return BatchResult(loss, {"loss": (loss.item(), len(err))})


def linear_trainer(rows, batch_size, accumulation_steps, lr, callbacks=(), **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1, bias=False)
    w0 = model.weight.detach().clone()
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model, optimizer, *_ = booster.boost(model, optimizer)
    loader = build_dataloader(plugin, rows, batch_size, torch.utils.data.default_collate, shuffle=False, seed=0)
    trainer = SquaredError(booster, 1, model, optimizer, plugin, accumulation_steps=accumulation_steps,
                           log_interval=1, callbacks=callbacks, **kwargs)
    return trainer, loader, w0


def regression_rows(n):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 2, generator=g)
    y = torch.randn(n, generator=g)
    return [{"x": x[i], "y": y[i]} for i in range(n)], x, y


LIMITS = SandboxLimits(cpu_s=2, wall_s=3, memory_mb=256, processes=16, file_size_mb=4)


def backends_here():
    """The backends that contain programs on this machine: bubblewrap where it works, coati's own namespaces as root
    with CAP_SYS_ADMIN."""
    found = [BWRAP] if bwrap_problem() is None else []
    if os.geteuid() == 0 and NAMESPACES in Sandbox(LIMITS, 1, NAMESPACES).run("pass").isolation:
        found.append(NAMESPACES)
    return found


BACKENDS_HERE = backends_here()


def sandbox_processes():
    """Live processes of the sandbox's user ids, or started by a sandboxed program (its marker in the command)."""
    found = []
    for process in psutil.process_iter(["uids", "cmdline", "status"]):
        try:
            uid = process.info["uids"].real
            marked = "coati-sandbox-test" in " ".join(process.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if process.info["status"] != psutil.STATUS_ZOMBIE and (UID_RANGE[0] <= uid <= UID_RANGE[1] or marked):
            found.append(process.pid)
    return found


def teacher_model(tiny_assets, folder, seed=1):
    """A tiny model of its own seed with the tiny assets' tokenizer, saved in `folder`: a teacher to distil from."""
    from coati.models.tiny import build_tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    build_tiny_llama(tokenizer, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


COATI = [sys.executable, "-m", "coati.cli.main"]


def run_coati(*argv, cwd=REPO, timeout=600):
    """`coati ARGV` run in a fresh process from `cwd`, its output captured."""
    return subprocess.run([*COATI, *argv], capture_output=True, text=True, env=child_env(), cwd=cwd, timeout=timeout)


def run_main(main: Callable[[List[str]], None], argv: List[str]) -> subprocess.CompletedProcess:
    """A script's `main(argv)` (the code path of its command line) run in this process, returned as a finished
    process: its exit status and what it printed. It saves the ~11 s a new Python process takes to import torch and the rest."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else int(exited.code is not None)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())

