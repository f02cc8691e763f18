"""The issues' acceptance runs on real MNIST (slow: `python -m pytest -m slow`).

Every method: a 3-round `flwr run` on MNIST, 10 SuperNodes, Dirichlet 0.3, fraction-fit 0.5,
local-epochs 1, finishing with finite loss and test accuracy above 0.3.
"""

from __future__ import annotations

import math

import pytest

from fl_app.registry import method_names
from runner.launch import LocalSimulation
from runner.results.report import read_metrics

pytestmark = pytest.mark.slow

# LeNet keeps the runs (one per registered method) affordable on 2 CPU cores; FedBN needs its BN model.
NEEDS = {
    "fedbn": {"model": "cnn-bn"},
    "dp-fedavg": {"dp-noise-multiplier": 0.001},  # "a small noise multiplier" (issue)
}


@pytest.fixture(scope="module")
def sim():
    with LocalSimulation() as simulation:
        yield simulation


@pytest.mark.parametrize("method", method_names())
def test_three_rounds_on_mnist(sim, shared_data, method, tmp_path):
    cfg = {"strategy": method, "dataset": "mnist", "model": "lenet", "learning-rate": 0.05, "data-dir": str(shared_data), "partitioner": "dirichlet",
           "alpha": 0.3, "num-server-rounds": 3, "fraction-fit": 0.5, "local-epochs": 1,
           "results-dir": str(tmp_path), "run-name": method, **NEEDS.get(method, {})}
    lines: list[str] = []
    assert sim.run(cfg, num_supernodes=10, on_line=lines.append) == 0
    rows = read_metrics(tmp_path / method)
    assert len(rows) == 3, "\n".join(lines[-30:])
    assert all(math.isfinite(r["test_loss"]) for r in rows)
    assert rows[-1]["test_accuracy"] > 0.3
