"""`--save_best METRIC`: keep the model of the evaluation that scored best on one eval metric."""
import json
from pathlib import Path
from typing import Callable, Dict, Optional

from coati.utils.errors import CoatiUsageError

from .base import Callback


class BestModelKeeper(Callback):
    """After each evaluation whose `metric` beats every earlier one (higher is better), `export(folder)` writes the
    model to `folder` and `folder`/../best.json records the step and the value. Runs on every rank (the evaluation
    results agree), since exporting a sharded model is a collective."""

    def __init__(self, metric: str, folder: Path, export: Callable[[Path], None], is_master: bool) -> None:
        self.metric = metric if metric.startswith("eval/") else f"eval/{metric}"
        self.folder, self.export, self.is_master = Path(folder), export, is_master
        self.best: Optional[float] = self._kept_value()

    def _kept_value(self) -> Optional[float]:
        """The best value of a run this one resumes (its best.json, for this metric), so a worse model does not
        replace it."""
        record = self.folder.parent / "best.json"
        if not record.is_file():
            return None
        kept = json.loads(record.read_text())
        return float(kept["value"]) if kept.get("metric") == self.metric else None

    def on_evaluate(self, epoch: int, results: Dict[str, float]) -> None:
        if self.metric not in results:
            logged = ", ".join(sorted(k for k in results if k.startswith("eval/")))
            raise CoatiUsageError(f"--save_best {self.metric}: this run's evaluation does not log it; it logs {logged}")
        value = float(results[self.metric])
        if self.best is not None and value <= self.best:
            return
        self.best = value
        self.export(self.folder)
        if self.is_master:
            record = {"metric": self.metric, "value": value, "step": epoch, "model": str(self.folder)}
            (self.folder.parent / "best.json").write_text(json.dumps(record, indent=2))
