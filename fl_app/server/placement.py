"""Which Ray node ran each fit, for simulations on a Ray cluster (``--ray-address``).

Clients in a Ray actor report the string fit metric ``ray_node`` (the Ray node id). The
summary columns of metrics.csv are numbers, so a round records ``num_ray_nodes`` (distinct
Ray nodes among its accepted fits) there, and every fit's node goes to
``<run-dir>/ray-nodes.csv`` (round, Flower node id, Ray node id): together they show that a
run used every machine of the cluster.
"""

from __future__ import annotations

import csv
from pathlib import Path

FILE = "ray-nodes.csv"


def record_ray_nodes(run_dir: Path, server_round: int, clients: list[tuple[str, dict]]) -> dict[str, int]:
    """Append this round's (round, Flower node, Ray node) rows from the clients' (cid, fit
    metrics); returns ``num_ray_nodes`` (nothing when no fit reported a Ray node, e.g. on a
    deployment)."""
    rows = [(server_round, cid, metrics["ray_node"]) for cid, metrics in clients
            if isinstance(metrics.get("ray_node"), str)]
    if not rows:
        return {}
    path = Path(run_dir) / FILE
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["round", "flower_node", "ray_node"])
        writer.writerows(rows)
    return {"num_ray_nodes": len({node for _, _, node in rows})}


def keep_rounds(run_dir: Path, last_round: int) -> None:
    """Drop the rows of rounds after ``last_round`` (a resumed run's checkpoint): those rounds
    run again, and their fits are appended anew, so each fit of the finished run is one row."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    kept = rows[:1] + [r for r in rows[1:] if r and int(r[0]) <= last_round]
    if len(kept) < len(rows):
        tmp = path.with_name(f".{FILE}.tmp")
        with tmp.open("w", newline="") as f:
            csv.writer(f).writerows(kept)
        tmp.replace(path)


def read_ray_nodes(run_dir: Path) -> dict[int, set[str]]:
    """Round -> the Ray node ids that ran its fits."""
    out: dict[int, set[str]] = {}
    path = Path(run_dir) / FILE
    if path.exists():
        with path.open() as f:
            for row in csv.DictReader(f):
                out.setdefault(int(row["round"]), set()).add(row["ray_node"])
    return out
