"""evaluate-every: the server evaluates every k rounds and at the last round; the rounds in
between still get their metrics.csv row (accuracy and loss cells empty), and the report's
readers (summary, curves, rounds to target) skip the empty cells."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np

from fl_app.config import ConfigError
from fl_app.registry import validate_config
from fl_app.server.recording import evaluated_round
from runner.results.report import curves, plot, read_metrics
from tests.kit import FakeManager, Proxy, fit_res
from tests.kit_server import make_strategy

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
mr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mr)


def test_evaluated_rounds():
    assert [r for r in range(8) if evaluated_round(r, 3, 7)] == [0, 3, 6, 7]
    assert [r for r in range(4) if evaluated_round(r, 1, 3)] == [0, 1, 2, 3]
    assert [r for r in range(4) if evaluated_round(r, 10, 3)] == [0, 3]


def test_bad_value_is_named():
    try:
        validate_config({"evaluate-every": 0})
    except ConfigError as exc:
        assert "evaluate-every" in str(exc) and "0" in str(exc)
    else:
        raise AssertionError("evaluate-every = 0 was accepted")


def run_rounds(tmp_path, rounds, every):
    strategy, _ = make_strategy(tmp_path, rounds=rounds, **{"evaluate-every": every})
    calls = []
    inner_evaluate = strategy.inner.evaluate

    def counting(rnd, params):
        calls.append(rnd)
        return inner_evaluate(rnd, params)

    strategy.inner.evaluate = counting
    manager = FakeManager(2)
    params = strategy.initialize_parameters(manager)
    strategy.evaluate(0, params)
    for rnd in range(1, rounds + 1):
        strategy.configure_fit(rnd, params, manager)
        update = [np.ones((2, 2), np.float32) * rnd, np.ones(2, np.float32)]
        results = [(Proxy(str(i)), fit_res(update, 10, {"train_loss": 1.0})) for i in range(2)]
        params, _ = strategy.aggregate_fit(rnd, results, failures=[])
        strategy.evaluate(rnd, params)
    return calls, tmp_path / "run"


def test_skipped_rounds_write_rows_with_empty_accuracy(tmp_path):
    calls, run = run_rounds(tmp_path, rounds=5, every=2)
    assert calls == [0, 2, 4, 5]
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["round"] for r in rows] == ["1", "2", "3", "4", "5"]
    empty = [r["round"] for r in rows if r["test_accuracy"] == ""]
    assert empty == ["1", "3"] and all(r["test_loss"] == "" for r in rows if r["round"] in empty)
    assert all(float(r["round_seconds"]) >= 0 and r["num_clients"] == "2" for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == 5
    assert summary["final_accuracy"] == 0.5 + 0.1 * 5 and summary["final_loss"] == 4 * 5
    # readers skip the empty cells: curves have the evaluated rounds only; rounds to target
    # is the first evaluated round reaching it
    # (round 0 is the initial model's evaluation, kept in summary.json)
    rounds, values = curves({"fedavg": [run]}, "test_accuracy")["fedavg"]
    assert list(rounds) == [0, 2, 4, 5]
    np.testing.assert_allclose(values, [0.5, 0.7, 0.9, 1.0])
    assert mr.rounds_to_target(read_metrics(run), 0.65) == 2
    assert plot({"fedavg": [run]}, "test_accuracy", "test accuracy", tmp_path / "acc.png")


def test_every_round_by_default(tmp_path):
    calls, run = run_rounds(tmp_path, rounds=3, every=1)
    assert calls == [0, 1, 2, 3]
    with (run / "metrics.csv").open() as f:
        assert all(r["test_accuracy"] != "" for r in csv.DictReader(f))
