"""The demo's report: PNG plots from each stage's `metrics.jsonl`, and REPORT.md plus a standalone
REPORT.html (plots embedded) built from one list of blocks, so the two always say the same."""
import base64
import html
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Block = Tuple[str, object]   # ("h1"|"h2"|"p"|"table"|"image", payload)


def read_metrics(path: Path) -> List[Dict[str, float]]:
    """The records of a metrics.jsonl file (none when the stage did not run)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(records: List[Dict[str, float]], name: str, x: Optional[str] = None) -> Tuple[List[float], List[float]]:
    """(steps, values) of one metric; with `x`, the value of that counter at each point's step instead of the step
    (a record without it, such as an evaluation, takes the counter of its step's training record; step 0 is 0)."""
    points = [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float))]
    if x is not None:
        at_step = {0: 0.0, **{r["step"]: r[x] for r in records if isinstance(r.get(x), (int, float))}}
        points = [(at_step[s], v) for s, v in points if s in at_step]
    return [s for s, _ in points], [v for _, v in points]


X_LABELS = {None: "step", "train/num_completions": "completions sampled"}


def clipped(values: Sequence[float], limits: Optional[Tuple[float, float]]) -> Tuple[List[float], int]:
    """`values` held within `limits` (low, high), and how many were outside (drawn at the edge)."""
    if limits is None:
        return list(values), 0
    low, high = limits
    return [min(max(v, low), high) for v in values], sum(not low <= v <= high for v in values)


def plot(path: Path, title: str, panels: Sequence[Tuple[str, Sequence[Tuple[str, List[Dict[str, float]], str]]]],
         x: Optional[str] = None, ylims: Optional[Dict[str, Tuple[float, float]]] = None) -> Optional[Path]:
    """One PNG with a panel per (y label, [(legend, records, metric), ...]), against the step or the counter `x`
    (`X_LABELS`); `ylims` holds a panel's y range by its label (values outside it are drawn at its edge, and the
    label says how many), so that a few early outliers do not flatten the rest. None when nothing is plotted."""
    drawn = [(ylabel, lines) for ylabel, lines in panels if any(series(recs, m, x)[0] for _, recs, m in lines)]
    if not drawn:
        return None
    fig, axes = plt.subplots(1, len(drawn), figsize=(4.2 * len(drawn), 3.2), squeeze=False)
    for ax, (ylabel, lines) in zip(axes[0], drawn):
        limits, outside = (ylims or {}).get(ylabel), 0
        for legend, records, metric in lines:
            steps, values = series(records, metric, x)
            values, off = clipped(values, limits)
            outside += off
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 12 else None, markersize=3, label=legend)
        if limits is not None:
            ax.set_ylim(*limits)
        ax.set_xlabel(X_LABELS[x])
        ax.set_ylabel(ylabel + (f"\n({outside} points outside [{limits[0]:g}, {limits[1]:g}] at its edge)"
                                if outside else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def reward_vs_accuracy(stage: str, records: List[Dict[str, float]], reward_metric: str, start_accuracy: float,
                       end_accuracy: float, window: int = 5) -> Optional[str]:
    """A plain sentence on whether `stage` raised or lowered held-out accuracy, and by how much, beside how its
    training reward (mean of its first and last `window` logged values) moved. A warning when accuracy fell, whatever
    the reward did, and a sharper one when the reward rose meanwhile (the policy exploits the reward instead of
    solving the task). None without logged rewards."""
    _, values = series(records, reward_metric)
    if len(values) < 2:
        return None
    n = max(1, min(window, len(values) // 2))
    first, last = _mean(values[:n]), _mean(values[-n:])
    change = end_accuracy - start_accuracy
    verdict = "raised" if change > 0 else ("lowered" if change < 0 else "did not change")
    relative = f", {change / start_accuracy:+.0%}" if start_accuracy else ""
    moved = (f"{stage} {verdict} held-out accuracy: held-out accuracy {start_accuracy:.3f} -> {end_accuracy:.3f} "
             f"({change:+.3f}{relative}); training reward ({reward_metric}) {first:.3f} -> {last:.3f}.")
    if change >= 0:
        return moved
    if last > first:
        return (f"WARNING: {moved} The reward rose while held-out accuracy fell: the policy learned to please "
                f"the reward, not to solve the task (reward over-optimisation). Do not read the reward curve as "
                f"progress; give the reward model wrong-answer examples, raise --kl_coef, or add a verifiable reward.")
    return f"WARNING: {moved} This stage made the model worse on held-out questions; do not use its model."


def alarm_lines(stage: str, alarms: Dict[str, str]) -> List[str]:
    """The health alarms a stage raised while it trained (its `alarms.json`), one line each."""
    return [f"{stage} alarm: {line}" for line in alarms.values()]


def bar_chart(path: Path, title: str, values: Dict[str, float]) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    bars = ax.bar(list(values), list(values.values()), color="#4c72b0")
    for bar, value in zip(bars, values.values()):
        ax.annotate(f"{value:.3f}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def to_markdown(blocks: Sequence[Block], root: Path) -> str:
    """Markdown of `blocks`; images are linked relative to `root`, where the file is written."""
    out = []
    for kind, payload in blocks:
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + str(payload))
        elif kind == "p":
            out.append(str(payload))
        elif kind == "table":
            header, *rows = payload
            out.append("\n".join("| " + " | ".join(_md_cell(c) for c in row) + " |"
                                 for row in [header, ["---"] * len(header), *rows]))
        elif kind == "image":
            out.append(f"![{Path(payload).stem}]({Path(payload).resolve().relative_to(root.resolve()).as_posix()})")
    return "\n\n".join(out) + "\n"


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_html(blocks: Sequence[Block], title: str) -> str:
    body = []
    for kind, payload in blocks:
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{html.escape(str(payload))}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{html.escape(str(payload))}</p>")
        elif kind == "table":
            header, *rows = payload
            cells = "".join(f"<th>{html.escape(str(c))}</th>" for c in header)
            lines = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
            body.append(f"<table><tr>{cells}</tr>{lines}</table>")
        elif kind == "image":
            data = base64.b64encode(Path(payload).read_bytes()).decode()
            body.append(f'<img alt="{Path(payload).stem}" src="data:image/png;base64,{data}">')
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px}img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_report(out: Path, blocks: Sequence[Block], title: str) -> Tuple[Path, Path]:
    """REPORT.md (images linked, under `out`) and REPORT.html (images embedded) in `out`."""
    markdown, page = out / "REPORT.md", out / "REPORT.html"
    markdown.write_text(to_markdown(blocks, out))
    page.write_text(to_html(blocks, title))
    return markdown, page
