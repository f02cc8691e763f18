"""The fabricated run folders and experiment tables the tests of scripts/make_results.py build on
(no training, no dataset): the script loaded as a module (``mr``), ``write_run`` (a run's
metrics.csv and summary.json), the ``TOY`` and ``GHOST`` experiment tables, and ``section`` and
``row`` to read a table of the generated page.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
mr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mr)


def write_run(runs: Path, method: str, seed: int, accs: list[float], finished: bool = True,
              stopped: str | None = None, min_class: float | None = None, folder: str = "") -> None:
    d = runs / (folder or f"{method}-seed{seed}")
    d.mkdir(parents=True)
    with (d / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "test_accuracy", "test_loss", "train_loss", "num_clients", "round_seconds",
                    "min_class_accuracy"])
        for r, a in enumerate(accs, 1):
            w.writerow([r, a, 1.0 - a, 0.5, 10, 1.0, "" if min_class is None else min_class + r / 100])
    if finished:
        (d / "summary.json").write_text(json.dumps({
            "config": {"strategy": method, "seed": seed}, "rounds": len(accs),
            "final_accuracy": accs[-1], "best_accuracy": max(accs), "final_loss": 0.1,
            "total_seconds": 5.0, "stopped": stopped, "data_source": "/machine/data",
        }))


TOY = """
name = "toy"
paper = "Toy (Doe et al. 2020), Table 2, column X: test accuracy"
description = "a toy comparison"
reduction = "3 rounds instead of 300"
findings = "fedprox seed 1 diverged"
strategies = ["fedavg", "fedprox", "fedsol", "fedntd"]
seeds = [0, 1]
clients = 10
target-accuracy = 0.5

[run-config]
num-server-rounds = 3

[paper-results]
fedavg = 0.56
fedprox = 0.60
fedntd = 0.63
fedsol = 0.64

# how the rows' settings were chosen: one known protocol for all, so their claims are counted
[chosen-by]
all = "fixed from the toy paper"
"""


GHOST = """
name = "ghost"
paper = "Ghost (Poe et al. 2022), Table 3"
strategies = ["fedavg", "fedgam"]
seeds = [0, 1]
clients = 10
target-accuracy = 0.9

[paper-results]
fedavg = 0.95
fedgam = 0.98

# how the rows' settings were chosen: one known protocol for all, so their claims are counted
[chosen-by]
all = "fixed from the toy paper"
"""


def section(text: str, name: str) -> str:
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


def row(sec: str, method: str) -> list[str]:
    for line in sec.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0].strip("*") == method:
            return cells
    raise AssertionError(f"no row for {method}")
