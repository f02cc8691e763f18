"""Read finished runs' results and write the comparison files and plots."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.csv rows with numeric values parsed (empty cells -> None)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.exists():
        return []
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            rows.append({k: _num(v) for k, v in row.items()})
    return rows


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def _num(text: str):
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def compare(runs: dict[str, list[Path]]) -> list[dict]:
    """One row per method: final and best accuracy as mean and std over its seeds."""
    table = []
    for method, dirs in runs.items():
        summaries = [s for s in (read_summary(d) for d in dirs) if s is not None]
        final = mean_std([s["final_accuracy"] for s in summaries])
        best = mean_std([s["best_accuracy"] for s in summaries])
        secs = mean_std([s["total_seconds"] for s in summaries])
        table.append({
            "method": method, "seeds": len(summaries),
            "rounds": max((s["rounds"] for s in summaries), default=0),
            "final_accuracy_mean": final[0], "final_accuracy_std": final[1],
            "best_accuracy_mean": best[0], "best_accuracy_std": best[1],
            "seconds_mean": secs[0],
        })
    return table


def write_comparison(table: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "comparison.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["method"])
        writer.writeheader()
        writer.writerows(table)
    lines = [
        "| method | seeds | rounds | final accuracy | best accuracy | seconds/run |",
        "|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['method']} | {r['seeds']} | {r['rounds']} | "
            f"{r['final_accuracy_mean']:.4f} ± {r['final_accuracy_std']:.4f} | "
            f"{r['best_accuracy_mean']:.4f} ± {r['best_accuracy_std']:.4f} | {r['seconds_mean']:.1f} |"
        )
    (out / "comparison.md").write_text("\n".join(lines) + "\n")


def curves(runs: dict[str, list[Path]], column: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per method: rounds and the mean of ``column`` over seeds (methods lacking it skipped)."""
    out = {}
    for method, dirs in runs.items():
        per_round: dict[int, list[float]] = defaultdict(list)
        for d in dirs:
            for row in read_metrics(d):
                if isinstance(row.get(column), (int, float)):
                    per_round[int(row["round"])].append(float(row[column]))
        if per_round:
            rounds = np.array(sorted(per_round))
            out[method] = (rounds, np.array([np.mean(per_round[r]) for r in rounds]))
    return out


def plot(runs: dict[str, list[Path]], column: str, ylabel: str, path: Path, title: str = "") -> bool:
    """Line plot of ``column`` vs round, one line per method; False if no run has it."""
    data = curves(runs, column)
    if not data:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method, (rounds, values) in data.items():
        ax.plot(rounds, values, marker="o", markersize=3, label=method)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
