"""End to end through `flwr run` on a private SuperLink: the app, the runner and every method."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest

from fl_app.registry import method_names
from runner.results.report import read_metrics, read_summary
from tests.kit import ROOT
from tests.kit_runs import SIMULATED, SLOW_TRANSPORT_METHODS, SUPERNODES, simulated_config


@pytest.mark.slow  # FedProx trains in process (test_every_method); flwr run, MNIST and Flower: the FedBN and faults runs
def test_flwr_run_fedprox_on_mnist(sim, mnist_sample, tmp_path):
    """The foundation acceptance run, scaled down: 2 rounds of FedProx on 10 Dirichlet clients
    of a 12,000-image sample of MNIST (0.61 test accuracy after round 2; on full MNIST 0.87 in
    about twice the time; on 6,000 images lenet is still at chance)."""
    rc = sim.run({"strategy": "fedprox", "dataset": "mnist", "model": "lenet", "num-server-rounds": 2,
                  "fraction-fit": 0.5, "learning-rate": 0.05, "data-dir": str(mnist_sample(12000, 1000)),
                  "results-dir": str(tmp_path), "run-name": "prox"}, num_supernodes=10)
    assert rc == 0
    rows = read_metrics(tmp_path / "prox")
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[-1]["test_accuracy"] > 0.3 and math.isfinite(rows[-1]["test_loss"])
    assert all(r["num_clients"] == 5 and r["num_failures"] == 0 for r in rows)
    summary = read_summary(tmp_path / "prox")
    assert summary["config"]["strategy"] == "fedprox" and summary["rounds"] == 2


DRIFT_COLUMNS = ("drift_norm_mean", "drift_norm_max", "step_norm", "update_diversity", "update_cosine_mean",
                 "head_diversity", "body_diversity")


@pytest.mark.slow  # 3 MNIST rounds; the columns are unit-tested through DriftServer's steps in tests/server/test_drift.py
@pytest.mark.parametrize("method", ["fedavg", "scaffold"])
def test_drift_per_class_accuracy_and_tensorboard_on_mnist(sim, shared_data, method, tmp_path):
    """3 rounds on MNIST, 4 clients: the drift columns, min_class_accuracy with its per-class
    file, and TensorBoard event files holding the per-round accuracy."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rc = sim.run({"strategy": method, "dataset": "mnist", "model": "cnn-small", "num-server-rounds": 3,
                  "fraction-fit": 0.5, "learning-rate": 0.05, "data-dir": str(shared_data),
                  "results-dir": str(tmp_path), "run-name": method}, num_supernodes=4)
    assert rc == 0
    run = tmp_path / method
    rows = read_metrics(run)
    assert [r["round"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert all(math.isfinite(r[c]) for c in DRIFT_COLUMNS), r
        assert 0 < r["step_norm"] <= r["drift_norm_max"] and r["drift_norm_mean"] <= r["drift_norm_max"]
        assert r["update_diversity"] >= 1 - 1e-9 and r["head_diversity"] >= 1 - 1e-9  # Jensen: p_k sum to 1
        assert 0 < r["update_cosine_mean"] <= 1 + 1e-9
        assert 0 <= r["min_class_accuracy"] <= r["test_accuracy"]
    with (run / "per_class_accuracy.csv").open() as f:
        per_class = list(csv.DictReader(f))
    assert [int(p["round"]) for p in per_class] == [1, 2, 3] and len(per_class[0]) == 11
    for p, r in zip(per_class, rows):
        accs = [float(p[f"class_{c}"]) for c in range(10)]
        assert min(accs) == pytest.approx(r["min_class_accuracy"])
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    logged = events.Scalars("test_accuracy")
    assert [e.step for e in logged] == [0, 1, 2, 3]  # round 0: the initial model (summary.json)
    initial = json.loads((run / "summary.json").read_text())["initial_accuracy"]
    assert [e.value for e in logged] == pytest.approx([initial] + [r["test_accuracy"] for r in rows], rel=1e-6)
    assert len(events.Scalars("update_diversity")) == 3


# Slow: fedyogi. A server optimiser steps in the ServerApp on the aggregate, so its messages are
# FedAvg's; it trains two rounds in process (tests/methods/test_every_method.py) and runs the ServerApp's
# server_fn and the ClientApp's client_fn on Flower's server loop through a crash and a resume
# (tests/server/test_resume.py), both in the default run.
# FedBN's and DP-FedAvg's runs through Flower are slow too (about 30 s each): their client sides
# are checked in process by default (tests/methods/test_fedbn.py: the kept BN entries;
# tests/methods/test_dp_fedavg.py: the client-mode clipping mod), and the fedavg and scaffold runs,
# shared with the resume and FAB tests, keep Flower's transport and context.state in the default run.
SLOW_SIMULATED = ("fedyogi", "fedbn", "dp-fedavg", *SLOW_TRANSPORT_METHODS)


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_SIMULATED
                                    else m for m in SIMULATED])
def test_every_method_runs_through_flower(simulated, method, request):
    cfg = simulated_config(method, request)
    run = simulated(method, cfg, SUPERNODES)
    assert run.rc == 0, "\n".join(run.lines[-30:])
    rows = read_metrics(run.run_dir)
    assert len(rows) == cfg["num-server-rounds"], "\n".join(run.lines[-30:])
    for r in rows:
        assert math.isfinite(r["test_loss"]) and math.isfinite(r["train_loss"])
        assert r["num_clients"] == 2 and r["num_failures"] == 0 and r["num_rejected"] == 0
    assert rows[-1]["test_accuracy"] > 0.15  # 10 classes: above chance
    assert rows[-1]["test_loss"] < read_summary(run.run_dir)["initial_loss"]  # learnt, not diverged


# In process (run_simulation.main, as test_partitioners.py calls it): the script's exit status is its
# main()'s, checked as a subprocess by test_runner_reports_missing_data_before_training (test_reliability.py)
def test_runner_rejects_bad_input_before_launching(capsys):
    import run_simulation

    for args in (["--strategy", "nosuch"], ["--set", "learning-rate=-0.5"], ["--set", "strategy=nosuch"]):
        assert run_simulation.main(args) != 0
        err = capsys.readouterr().err
        assert "invalid" in err and len(err.splitlines()) == 1, err
    assert all(name in err for name in method_names())


def test_runner_writes_comparison_files(tmp_path):
    """One run through the runner and `flwr run`: its files, its table and its progress lines.
    The table of several methods and seeds (mean and spread, the paired columns) is computed
    from the runs' summaries alone and checked on written summaries in tests/runner/test_results.py;
    the sweep's loop over runs in tests/runner/test_parallel.py (each run through Flower costs
    about 30 s here, Ray's start-up most of it)."""
    proc = subprocess.run(
        [sys.executable, "run_simulation.py", "--strategy", "fedprox", "--dataset", "synthetic",
         "--set", "model=logreg", "--rounds", "2", "--clients", "4", "--fraction", "0.5",
         "--seeds", "0", "--set", "split-picture=false", "--out", str(tmp_path), "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in ("comparison.csv", "comparison.md", "accuracy.png", "drift.png"):
        assert (tmp_path / name).stat().st_size > 0
    table = (tmp_path / "comparison.md").read_text()
    assert "| fedprox | 1 | 2 |" in table  # seeds, rounds
    assert "update diversity (mean)" in table and "final min-class accuracy" in table
    header = (tmp_path / "comparison.csv").read_text().splitlines()[0].split(",")
    assert {"update_diversity_mean", "final_min_class_accuracy_mean"} <= set(header)
    assert "round 2/2: test accuracy" in proc.stdout  # progress per round
    assert len(read_metrics(tmp_path / "runs" / "fedprox-seed0")) == 2


@pytest.mark.slow  # a run of its own; test_resume_matches_uninterrupted[scaffold] (tests/runner/test_reliability.py) checks
# the same in the default run: its crashed run's rounds 1-3 against the shared uninterrupted run, every column but the
# timings, on SCAFFOLD (client state too)
def test_same_seed_same_run(simulated, sim, tmp_path, request):
    """Same config and seed: the same metrics.csv to the last digit, every column but the
    timings (same partitions and sampled clients give the same per-client metrics). The first
    run is the fedavg run of ``test_every_method_runs_through_flower``."""
    cfg = simulated_config("fedavg", request)
    first = simulated("fedavg", cfg, SUPERNODES)
    assert first.rc == 0
    assert sim.run({**cfg, "results-dir": str(tmp_path), "run-name": "b"}, num_supernodes=SUPERNODES) == 0
    a, b = read_metrics(first.run_dir), read_metrics(tmp_path / "b")
    assert len(a) == len(b) == cfg["num-server-rounds"]
    assert list(a[0]) == list(b[0])
    timing = {k for k in a[0] if "seconds" in k}
    for ra, rb in zip(a, b):  # exactly: results are aggregated in partition order, not arrival order
        assert {k: v for k, v in ra.items() if k not in timing} == {k: v for k, v in rb.items() if k not in timing}
