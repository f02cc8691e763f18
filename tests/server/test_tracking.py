"""Per-class test accuracy (tasks/train.evaluate), the run's side files and TensorBoard event
files (fl_app/server/tracking.py), and the drift outputs of the comparison (runner/results/report.py)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fl_app.server.tracking import PER_CLASS_FILE, TENSORBOARD_DIR, RunTracker
from runner.results.report import compare, plot_drift, write_comparison
from tasks.train import evaluate

ROOT = Path(__file__).resolve().parents[2]


def _identity_model(classes: int = 4) -> nn.Module:
    """Logits = the input: the prediction is the argmax of x, known in advance."""
    model = nn.Linear(classes, classes)
    with torch.no_grad():
        model.weight.copy_(torch.eye(classes))
        model.bias.zero_()
    return model


@pytest.mark.parametrize("batch_size", [1, 2, 128])
def test_per_class_accuracy_known_predictions(batch_size):
    predicted = torch.tensor([0, 0, 1, 2, 1, 1, 0])
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 2])  # class 3 absent
    x = nn.functional.one_hot(predicted, 4).float()
    loss, acc, per_class = evaluate(_identity_model(), x, labels, batch_size=batch_size, per_class=True)
    # class 0: 2/2 right; class 1: predicted 1, 2, 1 -> 2/3; class 2: predicted 1, 0 -> 0/2; class 3: no sample
    np.testing.assert_allclose(per_class[:3], [1.0, 2 / 3, 0.0])
    assert math.isnan(per_class[3])
    assert acc == pytest.approx(4 / 7)
    # the plain call is unchanged: (loss, accuracy)
    assert evaluate(_identity_model(), x, labels, batch_size=batch_size) == pytest.approx((loss, acc))


def _row(rnd, acc):
    return {"round": rnd, "test_accuracy": acc, "test_loss": 1.0 - acc, "update_diversity": 2.0 + rnd,
            "step_norm": math.nan, "num_clients": 3}


def test_per_class_file_and_tensorboard_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = RunTracker(tmp_path, {"tracking": "tensorboard"})
    tracker.log_round(_row(1, 0.5), [0.25, 0.75, math.nan])
    tracker.log_round(_row(2, 0.625), [0.5, 0.75, 1.0])
    tracker.close()
    with (tmp_path / PER_CLASS_FILE).open() as f:
        rows = list(csv.reader(f))
    assert rows == [["round", "class_0", "class_1", "class_2"], ["1", "0.25", "0.75", ""], ["2", "0.5", "0.75", "1.0"]]
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("test_accuracy")] == [(1, 0.5), (2, 0.625)]
    assert [e.value for e in events.Scalars("update_diversity")] == [3.0, 4.0]
    assert [e.value for e in events.Scalars("per_class_accuracy/class_2")] == [1.0]  # NaN skipped
    assert "step_norm" not in events.Tags()["scalars"]


def test_resumed_round_replaces_its_per_class_row(tmp_path):
    tracker = RunTracker(tmp_path, {"tracking": "none"})
    for rnd in (1, 2, 3):
        tracker.log_round(_row(rnd, 0.5), [0.1 * rnd, 0.2])
    RunTracker(tmp_path, {"tracking": "none"}).log_round(_row(2, 0.5), [0.9, 0.9])  # resumed after round 1
    with (tmp_path / PER_CLASS_FILE).open() as f:
        assert [r[:2] for r in csv.reader(f)] == [["round", "class_0"], ["1", "0.1"], ["2", "0.9"]]
    assert not (tmp_path / TENSORBOARD_DIR).exists()


def test_tensorboard_silently_absent_when_not_installed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    tracker = RunTracker(tmp_path, {"tracking": "tensorboard"})
    tracker.log_round(_row(1, 0.5), [0.5])
    tracker.close()
    assert not (tmp_path / TENSORBOARD_DIR).exists()
    assert (tmp_path / PER_CLASS_FILE).exists()


def _write_run(d: Path, diversity: list[float] | None, min_class: list[float] | None, acc: float) -> Path:
    d.mkdir(parents=True)
    cols = ["round", "test_accuracy"] + (["update_diversity"] if diversity else []) + (
        ["min_class_accuracy"] if min_class else [])
    with (d / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for i in range(3):
            w.writerow([i + 1, acc] + ([diversity[i]] if diversity else []) + ([min_class[i]] if min_class else []))
    (d / "summary.json").write_text(json.dumps({"rounds": 3, "final_accuracy": acc, "best_accuracy": acc,
                                                "total_seconds": 1.0}))
    return d


def test_comparison_drift_columns_and_plot(tmp_path):
    runs = {
        "fedavg": [_write_run(tmp_path / "a0", [2.0, 4.0, "nan"], [0.1, 0.2, 0.3], 0.8),
                   _write_run(tmp_path / "a1", [6.0, 6.0, 6.0], [0.1, 0.2, 0.5], 0.8)],
        "old": [_write_run(tmp_path / "b0", None, None, 0.7)],  # made before the columns existed
    }
    table = {r["method"]: r for r in compare(runs)}
    assert table["fedavg"]["update_diversity_mean"] == pytest.approx((3.0 + 6.0) / 2)  # NaN round left out
    assert table["fedavg"]["final_min_class_accuracy_mean"] == pytest.approx(0.4)
    assert math.isnan(table["old"]["update_diversity_mean"])
    write_comparison(list(table.values()), tmp_path / "out")
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "update diversity (mean)" in md and "| 4.50 | 0.4000 ± 0.1414 |" in md
    assert "| old | 1 | 3 | 0.7000 | 0.7000 | 1.0 | - | - |" in md
    header = (tmp_path / "out" / "comparison.csv").read_text().splitlines()[0]
    assert "update_diversity_mean" in header and "final_min_class_accuracy_mean" in header
    assert plot_drift(runs, tmp_path / "drift.png")
    assert (tmp_path / "drift.png").stat().st_size > 0
    assert not plot_drift({"old": runs["old"]}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_drift_plot_title_carries_the_setup_line(tmp_path):
    """drift.png names the setup as accuracy.png does (dataset, split, clients, model...)."""
    from fl_app.registry import validate_config
    from runner.results.report import drift_title, setup_title

    run = _write_run(tmp_path / "a0", [2.0, 4.0, 3.0], None, 0.8)
    cfg = validate_config({"dataset": "cifar10", "alpha": 0.1, "num-server-rounds": 3, "model": "cnn"})
    (run / "summary.json").write_text(json.dumps({**json.loads((run / "summary.json").read_text()), "config": cfg}))
    setup = setup_title({"fedavg": [run]})
    assert setup.startswith("cifar10, 2 clients, dirichlet partitions (alpha=0.1,") and "model cnn" in setup
    title = drift_title({"fedavg": [run]}).splitlines()
    assert title[0] == "Client update diversity (1 = clients agree)" and title[-1] == "line: mean over seeds"
    assert " ".join(title[1:-1]) == setup


def test_every_title_names_the_whole_split_and_the_model(tmp_path):
    """The plots' titles, comparison.md's header and the terminal summary name the
    split whole (partitioner, its keys, feature noise, the clients' sizes from their
    client_label_counts.csv) and the model, and a plot's title fits its figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fl_app.registry import validate_config
    from runner.results.report import plot_curves, setup_title, terminal_summary

    cfg = validate_config({"dataset": "mnist", "partitioner": "pathological", "classes-per-client": 2,
                           "noise-sigma": 0.1, "num-server-rounds": 3, "model": "cnn-small", "fraction-fit": 0.25})
    runs = {}
    for method, seed in (("fedavg", 0), ("fedprox", 1)):
        run = _write_run(tmp_path / f"{method}-seed{seed}", [2.0, 4.0, 3.0], None, 0.8)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "config": {**cfg, "seed": seed}, "num_clients": 3}))
        sizes = (1200, 450, 3000) if seed == 0 else (980, 2000, 700)
        (run / "client_label_counts.csv").write_text("client,class_0,class_1\n" + "".join(
            f"{k},{n - n // 3},{n // 3}\n" for k, n in enumerate(sizes)))
        runs[method] = [run]
    setup = setup_title(runs)
    assert setup == ("mnist, 3 clients of 450 to 3,000 examples, pathological partitions (noise-sigma=0.1,"
                     " classes-per-client=2), fraction 0.25, 3 rounds, model cnn-small")
    table = compare(runs)
    write_comparison(table, tmp_path / "out", setup)
    assert (tmp_path / "out" / "comparison.md").read_text().startswith(f"Setup: {setup}\n\n| method |")
    assert terminal_summary(table, tmp_path / "out", setup).splitlines()[0] == f"setup: {setup}"

    captured = []
    real_close = plt.close
    with pytest.MonkeyPatch.context() as mp:  # keep the figure to measure its title
        mp.setattr(plt, "close", lambda fig=None: captured.append(fig))
        assert plot_curves(runs, tmp_path / "accuracy.png")
    [fig] = captured
    renderer = fig.canvas.get_renderer()
    box = fig._suptitle.get_window_extent(renderer)
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
    assert setup in fig._suptitle.get_text().replace("\n", " ")
    real_close(fig)


def test_make_results_adds_the_drift_plot_only_where_runs_have_it(tmp_path):
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "scripts" / "make_results.py")
    mr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mr)
    dirs = {"fedavg": [_write_run(tmp_path / "r" / "fedavg-seed0", [2.0, 3.0, 4.0], [0.1, 0.2, 0.3], 0.8)],
            "fedprox": []}
    lines = mr.drift_figure("toy", dirs, tmp_path / "fig", tmp_path)
    assert lines[0] == "![toy update diversity](fig/toy-drift.png)"
    assert (tmp_path / "fig" / "toy-drift.png").exists()
    old = {"fedavg": [_write_run(tmp_path / "o" / "fedavg-seed0", None, None, 0.8)]}
    assert mr.drift_figure("old", old, tmp_path / "fig", tmp_path) == []


class _Proxy:
    def __init__(self, cid):
        self.cid = cid


class _Manager:
    def __init__(self):
        self.proxies = [_Proxy("0"), _Proxy("1")]

    def num_available(self):
        return 2

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return self.proxies[:num_clients]


def _record_one_round(run_dir: Path, **keys) -> dict:
    """One round through DriftServer's steps (FedAvg, logreg shapes, a fixed evaluation), as the
    ServerApp runs it, with run-config ``keys``; returns the validated config."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    from fl_app.registry import validate_config
    from strategies.base import DriftFedAvg, fedavg_kwargs
    from tests.kit_server import RoundByRound

    cfg = validate_config({"fraction-fit": 1.0, "num-server-rounds": 1, "model": "logreg",
                           "dataset": "synthetic", **keys})
    w0 = [np.zeros((10, 60), np.float32), np.zeros(10, np.float32)]

    def evaluate_fn(rnd, arrays, config):  # the initial model (round 0): 0.1, loss 2.0
        return (2.0 if rnd == 0 else 1.0), {"accuracy": 0.1 if rnd == 0 else 0.5, "min_class_accuracy": 0.25,
                                            "per_class_accuracy": [0.25, 0.75]}

    inner = DriftFedAvg.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), evaluate_fn))
    strategy = RoundByRound(inner, cfg, run_dir, 1)
    params = strategy.initialize_parameters(_Manager())
    assert "per_class_accuracy" not in strategy.evaluate(0, params)[1]  # kept out of Flower's history
    ins = strategy.configure_fit(1, params, _Manager())
    results = [(p, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([a + 1 for a in w0]), 5, {})) for p, _ in ins]
    params, _ = strategy.aggregate_fit(1, results, [])
    _, metrics = strategy.evaluate(1, params)  # the last round: summary.json, trackers closed
    assert "per_class_accuracy" not in metrics
    return cfg


@pytest.mark.parametrize("keys, tensorboard", [({"tensorboard": True}, True), ({"tensorboard": False}, False),
                                               ({"tracking": "none"}, False),
                                               ({"tracking": "tensorboard", "tensorboard": False}, False)])
def test_recording_strategy_writes_min_class_column_side_file_and_honours_the_key(tmp_path, keys, tensorboard):
    _record_one_round(tmp_path / "run", **keys)
    with (tmp_path / "run" / "metrics.csv").open() as f:
        assert float(next(csv.DictReader(f))["min_class_accuracy"]) == 0.25
    assert (tmp_path / "run" / PER_CLASS_FILE).read_text().splitlines()[1] == "1,0.25,0.75"
    assert (tmp_path / "run" / TENSORBOARD_DIR).is_dir() == tensorboard


def test_plots_start_at_round_0_the_initial_model(tmp_path):
    """summary.json keeps the initial model's evaluation and the accuracy and loss curves start
    with it; the rows of metrics.csv stay rounds 1..T."""
    from runner.results.report import curve_stats, read_metrics, read_summary

    _record_one_round(tmp_path / "run")
    summary = read_summary(tmp_path / "run")
    assert summary["initial_accuracy"] == 0.1 and summary["initial_loss"] == 2.0
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [1]
    rounds, mean, *_ = curve_stats({"fedavg": [tmp_path / "run"]}, "test_accuracy")["fedavg"]
    assert list(rounds) == [0, 1] and list(mean) == [0.1, 0.5]
    rounds, mean, *_ = curve_stats({"fedavg": [tmp_path / "run"]}, "test_loss")["fedavg"]
    assert list(rounds) == [0, 1] and list(mean) == [2.0, 1.0]
    rounds, *_ = curve_stats({"fedavg": [tmp_path / "run"]}, "min_class_accuracy")["fedavg"]
    assert list(rounds) == [1]  # only accuracy and loss have a round 0


def test_tracking_key_refuses_an_unknown_tracker():
    from fl_app.config import ConfigError
    from fl_app.registry import validate_config

    with pytest.raises(ConfigError, match="'tracking' = 'tensorboard,mlfow' is invalid: 'mlfow' is not a tracker; "
                                          "valid: 'none' or a comma list of tensorboard, mlflow, wandb"):
        validate_config({"tracking": "tensorboard,mlfow"})


@pytest.mark.parametrize("package", ["mlflow", "wandb"])
def test_a_named_tracker_that_is_not_installed_stops_the_run_at_start(tmp_path, monkeypatch, package):
    from fl_app.config import ConfigError

    monkeypatch.setitem(sys.modules, package, None)  # import raises ImportError
    with pytest.raises(ConfigError, match=rf"names '{package}' but the {package} package is not installed; "
                                          rf"install the extra: pip install -e \"\.\[{package}\]\""):
        RunTracker(tmp_path, {"tracking": package})


def test_mlflow_run_read_back_from_a_local_store(tmp_path, monkeypatch):
    """A run with tracking = "mlflow" leaves an MLflow run (config as params, rounds as metric
    history, summary metrics, finished) that ``mlflow.search_runs`` reads back from ./mlruns."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store otherwise
    cfg = _record_one_round(tmp_path / "results" / "run-a", tracking="mlflow,tensorboard", seed=7)
    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    runs = mlflow.search_runs(experiment_names=["fl-drift"], output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    assert run.data.params["seed"] == "7" and run.data.params["strategy"] == "fedavg"
    assert len(run.data.params) == len(cfg)
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "test_accuracy")
    assert [(m.step, m.value) for m in history] == [(1, 0.5)]
    assert run.data.metrics["per_class_accuracy/class_1"] == 0.75
    assert run.data.metrics["summary.final_accuracy"] == 0.5 and run.data.metrics["summary.rounds"] == 1
    assert (tmp_path / "results" / "run-a" / TENSORBOARD_DIR).is_dir()  # both trackers ran


def test_mlflow_default_store_is_next_to_the_runs(tmp_path):
    from fl_app.server.tracking import mlflow_default_uri

    assert mlflow_default_uri(tmp_path / "results" / "run-a") == f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"


def test_wandb_offline_writes_its_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # dir= wins: the run folder
    _record_one_round(tmp_path / "run", tracking="wandb")
    folders = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(folders) == 1
    records = list(folders[0].glob("run-*.wandb"))  # the run's record, for `wandb sync`
    assert len(records) == 1
    # wandb 0.31 has no Python reader for it (its Go core does): the protobuf records hold the
    # config keys, the logged metric names and the summary's names as plain bytes.
    data = records[0].read_bytes()
    for name in (b"num-server-rounds", b"test_accuracy", b"per_class_accuracy/class_1", b"final_accuracy"):
        assert name in data, name
