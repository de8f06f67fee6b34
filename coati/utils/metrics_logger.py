"""One metrics sink for a run: TensorBoard, Weights & Biases and a JSONL file, written by rank 0 only."""
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from coati.utils.comm import is_rank_0
from coati.utils.errors import CoatiUsageError, first_line

JSONL_NAME = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
TABLES_DIR = "rich_completions"
DEFAULT_WANDB_TABLE_ROWS = 4
PREVIOUS_RUNS_DIR = "previous_runs"
_SECRET_NAME = re.compile(r"(^|_)(api_?key|key|token|secret|password|passwd|credentials?)$")
"""Names of secrets: `api_key`, `wandb_key`, `hf_token`, `password`, `client_secret`; not `tokenizer_dir`."""


def public_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """The run config without values whose name is a secret's (they never reach a log), nor private ones (`_x`)."""
    return {k: v for k, v in config.items() if not k.startswith("_") and not _SECRET_NAME.search(k.lower())}


def set_aside_previous_run(log_dir: Path) -> Optional[Path]:
    """Move an earlier run's metrics and TensorBoard events out of `log_dir` (into
    `previous_runs/<time>/`) so a fresh run does not mix with them; returns where they went."""
    return set_aside([log_dir / name for name in (JSONL_NAME, TENSORBOARD_DIR) if (log_dir / name).exists()], log_dir)


def set_aside(found: Sequence[Path], root: Path) -> Optional[Path]:
    """Move `found` (an earlier run's files in `root`) into `root/previous_runs/<time>/`; returns that folder, or
    None when there was nothing to move."""
    if not found:
        return None
    target = Path(root) / PREVIOUS_RUNS_DIR / time.strftime("%Y%m%d-%H%M%S")
    while target.exists():
        target = target.with_name(target.name + "_")
    target.mkdir(parents=True)
    for path in found:
        os.replace(path, target / path.name)
    return target


class MetricsLogger:
    """Logs `{name: float}` per step to the sinks that are configured; a no-op on ranks other than 0.

    Values are written at full precision. With `log_dir` unset only W&B (if asked) is written.
    W&B honours `WANDB_MODE=offline` and writes its files under `log_dir` when given. A run resumed
    at optimizer step `resume_step` first drops what an interrupted run logged after that step from
    the JSONL file and TensorBoard, so each step appears once, from the run that continued. A fresh run
    (no `resume_step`) into a `log_dir` that holds another run's logs first moves those aside.
    """

    def __init__(
        self,
        log_dir: Optional[str] = None,
        use_wandb: bool = False,
        wandb_project: str = "coati",
        run_name: Optional[str] = None,
        config: Optional[Dict[str, Any]] = None,
        resume_step: Optional[int] = None,
        wandb_table_rows: int = DEFAULT_WANDB_TABLE_ROWS,
        console: bool = True,
        total_steps: Optional[int] = None,
    ) -> None:
        self.active = is_rank_0()
        self.console, self.total_steps = console, total_steps
        self._window_start: Optional[Tuple[float, int]] = None
        self.log_dir = Path(log_dir) if log_dir else None
        self.wandb_table_rows = wandb_table_rows
        self._tb = None
        self._jsonl = None
        self._wandb_run = None
        if not self.active:
            return
        if self.log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.log_dir.mkdir(parents=True, exist_ok=True)
            if resume_step is not None:
                _truncate_jsonl(self.log_dir / JSONL_NAME, resume_step)
            else:
                moved = set_aside_previous_run(self.log_dir)
                if moved:
                    print(f"{self.log_dir} held an earlier run's logs; moved them to {moved}", flush=True)
            purge_step = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(log_dir=str(self.log_dir / TENSORBOARD_DIR), purge_step=purge_step)
            self._jsonl = open(self.log_dir / JSONL_NAME, "a")
        if use_wandb:
            import wandb

            wandb_dir = str(self.log_dir) if self.log_dir is not None else None
            try:
                self._wandb_run = wandb.init(project=wandb_project, name=run_name, dir=wandb_dir,
                                             config=public_config(config or {}))
            except (wandb.errors.UsageError, wandb.errors.CommError) as error:   # no API key, or W&B unreachable
                raise CoatiUsageError(f"Weights & Biases: {first_line(error)}; log in (`wandb login`, or "
                                      "WANDB_API_KEY), or set WANDB_MODE=offline to keep the run's W&B files "
                                      "local") from None

    def log(self, metrics: Dict[str, float], step: int) -> None:
        if not self.active or not metrics:
            return
        if self.console:
            self._print_line(metrics, step)
        if self._tb is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(name, value, global_step=step)
            self._tb.flush()
        if self._jsonl is not None:
            record = {"step": step, "time": time.time(), **{k: _finite_or_str(v) for k, v in metrics.items()}}
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
            os.fsync(self._jsonl.fileno())
        if self._wandb_run is not None:
            self._wandb_run.log(dict(metrics), step=step)

    def start(self, step: int, total_steps: Optional[int]) -> None:
        """The run trains from `step` to `total_steps` (for the console line's seconds per step and ETA)."""
        self.total_steps, self._window_start = total_steps, (time.monotonic(), step)

    def _print_line(self, metrics: Dict[str, float], step: int) -> None:
        """`console_line` on the terminal, above any progress bar."""
        now = time.monotonic()
        seconds_per_step = None
        if self._window_start is not None and step > self._window_start[1] and any(k.startswith("train/") for k in metrics):
            seconds_per_step = (now - self._window_start[0]) / (step - self._window_start[1])
            self._window_start = (now, step)
        line = console_line(metrics, step, self.total_steps, seconds_per_step)
        if line:
            from tqdm import tqdm

            tqdm.write(line)

    def log_table(self, name: str, rows: List[Dict[str, Any]], step: int) -> Optional[Path]:
        """A table of `rows` (dicts with the same keys): always, when `log_dir` is set, a JSON sidecar
        `<log_dir>/rich_completions/<name>_step_%06d.json` holding `{"columns": [...], "data": [[...], ...]}`;
        and, with W&B on, a W&B table of the first `wandb_table_rows` rows. Returns the sidecar's path."""
        if not self.active or not rows:
            return None
        columns = list(rows[0])
        data = [[row[c] for c in columns] for row in rows]
        path = None
        if self.log_dir is not None:
            path = self.log_dir / TABLES_DIR / f"{name}_step_{step:06d}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"columns": columns, "data": data}, indent=1))
        if self._wandb_run is not None and self.wandb_table_rows > 0:
            import wandb

            self._wandb_run.log({name: wandb.Table(columns=columns, data=data[:self.wandb_table_rows])}, step=step)
        return path

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()
        self._tb = self._jsonl = self._wandb_run = None


CONSOLE_TRAIN = (("loss", ("train/loss",)), ("accuracy", ("train/accuracy", "train/rewards/accuracies")),
                 ("reward", ("train/reward",)), ("kl", ("train/kl",)), ("lr", ("train/learning_rate", "train/lr")))
"""What the console line shows of the training metrics, by label: the first of the names logged."""
CONSOLE_EVAL = 4
"""Held-out metrics shown on the console line at most (the first, by name)."""


def console_line(metrics: Dict[str, float], step: int, total_steps: Optional[int] = None,
                 seconds_per_step: Optional[float] = None) -> str:
    """One line of a log step's numbers for the terminal, as TRL users read them: `step 12/300 | epoch 0.4 | loss 0.532 |
    reward 0.41 ± 0.12 | kl 0.0031 | lr 1e-04 | eval rewards/math_answer 0.62 | 2.1 s/step | ETA 0:10:12`."""
    numbers = []
    for label, names in CONSOLE_TRAIN:
        name = next((n for n in names if n in metrics), None)
        if name is None:
            continue
        value = f"{metrics[name]:.3g}" if label != "lr" else f"{metrics[name]:.2e}"
        if label == "reward" and "train/reward_std" in metrics:
            value += f" ± {metrics['train/reward_std']:.2g}"
        numbers.append(f"{label} {value}")
    held_out = sorted(k for k in metrics if k.startswith("eval/") and "/p" not in k.rsplit("/", 1)[-1][:2])
    numbers += [f"{k} {metrics[k]:.4g}" for k in held_out[:CONSOLE_EVAL]]
    if not numbers:
        return ""
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    if "train/epoch" in metrics:
        parts.append(f"epoch {metrics['train/epoch']:.3g}")
    parts += numbers
    if seconds_per_step is not None:
        parts.append(f"{seconds_per_step:.3g} s/step")
        if total_steps and total_steps > step:
            eta = int(seconds_per_step * (total_steps - step))
            parts.append(f"ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}")
    return " | ".join(parts)


class StatsLogger:
    """The asynchronous RLVR guide's logger over a `MetricsLogger`: `commit(epoch, step, global_step, stats)`
    logs one step's reduced statistics (a dict, or a list of dicts merged in order) at `step`, with the
    position as `<prefix>epoch` and `<prefix>global_step`."""

    def __init__(self, metrics_logger: MetricsLogger, prefix: str = "train/") -> None:
        self.metrics_logger, self.prefix = metrics_logger, prefix

    def commit(self, epoch: float, step: int, global_step: int,
               stats: Union[Dict[str, float], Sequence[Dict[str, float]]]) -> Dict[str, float]:
        """Log `stats` at `step` and return what was logged."""
        record = self.record(epoch, global_step, stats)
        self.metrics_logger.log(record, step)
        return record

    def record(self, epoch: float, global_step: int,
               stats: Union[Dict[str, float], Sequence[Dict[str, float]]]) -> Dict[str, float]:
        """`stats` merged in order, with the position: what `commit` logs."""
        merged: Dict[str, float] = {}
        for part in ([stats] if isinstance(stats, dict) else stats):
            merged.update(part)
        return {**merged, f"{self.prefix}epoch": float(epoch), f"{self.prefix}global_step": float(global_step)}

def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the records up to `last_step` (atomically); a torn last line from a crash goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("step", 0) <= last_step:
            kept.append(line + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def _finite_or_str(value: float) -> Any:
    """JSON has no NaN/inf: write those as strings so the line stays valid JSON."""
    value = float(value)
    return value if math.isfinite(value) else str(value)
