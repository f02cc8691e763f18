"""Failures, poisoned updates, bad input and resume: none corrupts or loses a run."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from fl_app.config import ConfigError
from fl_app.registry import validate_config
from runner.results.report import read_metrics, read_summary
from tasks.datasets import DataUnavailableError, PartitionError
from tasks.partitioning import PartitionSpec, check_data
from tests.kit import ROOT, serve_in_process
from tests.kit_runs import SUPERNODES, local_simulation, simulated_config, tiny_parquet


# ------------------------------------------------------------------------------ bad input
def test_wrong_columns_named(tmp_path):
    tiny_parquet(tmp_path, columns=("picture", "target"))
    with pytest.raises(DataUnavailableError) as err:
        check_data(PartitionSpec(dataset="mnist", num_partitions=2, data_dir=str(tmp_path)))
    assert "missing column(s) ['image', 'label']" in str(err.value) and "picture" in str(err.value)


def test_a_test_split_with_a_renamed_column_is_one_line_naming_the_columns(tmp_path, capsys):
    """Only test.parquet renamed (label -> labels): the datasets library failed to cast the two
    files to one schema and logged its schema dump; now one line says which columns the dataset
    needs and which the file has, before that library reads anything."""
    import pyarrow.parquet as pq

    import run_simulation

    tiny_parquet(tmp_path)
    test = tmp_path / "mnist" / "test.parquet"
    pq.write_table(pq.read_table(test).rename_columns(["image", "labels"]), test)
    argv = ["--dataset", "mnist", "--data-dir", str(tmp_path), "--clients", "2", "--check", "--out", str(tmp_path / "o")]
    assert run_simulation.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {test}: missing column(s) ['label']: dataset 'mnist' needs the columns 'image', 'label'"
                   " (the ylecun/mnist schema); found 'image', 'labels'\n")


def test_unreadable_data_file_named(tmp_path):
    tiny_parquet(tmp_path)
    (tmp_path / "mnist" / "train.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(DataUnavailableError) as err:
        check_data(PartitionSpec(dataset="mnist", num_partitions=2, data_dir=str(tmp_path)))
    assert "cannot read" in str(err.value) and "train.parquet" in str(err.value)


def test_more_partitions_than_samples(tmp_path):
    tiny_parquet(tmp_path)
    with pytest.raises(PartitionError, match=r"30 partitions requested \(one per SuperNode\) but 'mnist' has only 20 training samples"):
        check_data(PartitionSpec(dataset="mnist", num_partitions=30, partitioner="iid", data_dir=str(tmp_path)))


def test_empty_partition(tmp_path):
    tiny_parquet(tmp_path)
    spec = PartitionSpec(dataset="mnist", num_partitions=10, alpha=0.1, min_partition_size=0, data_dir=str(tmp_path))
    with pytest.raises(PartitionError, match="partitions are empty"):
        check_data(spec)


def test_unreachable_min_partition_size(tmp_path):
    tiny_parquet(tmp_path)
    spec = PartitionSpec(dataset="mnist", num_partitions=5, alpha=0.5, min_partition_size=3, data_dir=str(tmp_path))
    with pytest.raises(PartitionError, match="min-partition-size=3"):
        check_data(spec)


def test_alpha_must_be_positive():
    for alpha in (0.0, -1.0):
        with pytest.raises(ConfigError, match="'alpha'.*> 0"):
            validate_config({"alpha": alpha})


def test_runner_reports_missing_data_before_training(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "run_simulation.py", "--dataset", "mnist", "--data-dir", str(tmp_path / "none"),
         "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 2
    assert "mnist/train.parquet" in proc.stderr and "ylecun/mnist" in proc.stderr
    assert not (tmp_path / "out" / "runs").exists()


def test_bad_fault_spec_rejected():
    with pytest.raises(ConfigError, match="inject-faults"):
        validate_config({"inject-faults": "explode:1"})


# ------------------------------------------------------------------- end-to-end behaviour
# (`sim`, the session's SuperLink, and `small_mnist` are fixtures in tests/conftest.py)
def faults_config(data_dir, results_dir) -> dict:
    """Partition 0 raises every round, partition 1 returns NaN weights every round (5 nodes)."""
    return {"strategy": "fedavg", "dataset": "mnist", "model": "lenet", "num-server-rounds": 2,
            "fraction-fit": 1.0, "learning-rate": 0.05, "data-dir": str(data_dir),
            "inject-faults": "raise:0,nan:1", "results-dir": str(results_dir), "run-name": "faults"}


def assert_faults_did_not_corrupt(run_dir) -> None:
    """Each round: one failure, one rejected reply, three counted; a finite loss, and learning."""
    rows = read_metrics(run_dir)
    assert len(rows) == 2
    for r in rows:
        assert r["num_failures"] == 1 and r["num_rejected"] == 1 and r["num_clients"] == 3
        assert math.isfinite(r["test_loss"])
    assert rows[-1]["test_accuracy"] > 0.2  # 10 classes: well above chance


def test_raising_and_nan_clients_do_not_corrupt_the_run_in_process(small_mnist, tmp_path):
    """The ServerApp and ClientApp in one process (``serve_in_process``, no Ray): a client's
    exception is a failure, a NaN reply is rejected, and the run goes on, on the three others.
    (The data test of tests/runner/test_fresh_clone.py's pytest without a data folder.)"""
    serve_in_process({**faults_config(small_mnist, tmp_path), "tracking": "none"}, 5)
    assert_faults_did_not_corrupt(tmp_path / "faults")


@pytest.mark.slow  # one Flower simulation (about 30 s); the same run in process is the test above, and a
# node's failure through Flower is counted in the default run by tests/deployment/test_deployment.py (a bad data path)
def test_raising_and_nan_clients_do_not_corrupt_the_run(small_mnist, sim, tmp_path):
    """The same faults through Flower's Ray simulation. (``small_mnist`` first: without data the
    test skips before the session's SuperLink starts.)"""
    assert sim.run(faults_config(small_mnist, tmp_path), num_supernodes=5) == 0
    assert_faults_did_not_corrupt(tmp_path / "faults")


def test_too_many_failures_stop_the_run_in_process(tmp_path):
    """The ServerApp and ClientApp in one process (``serve_in_process``, no Ray): a node's
    injected ``raise`` is a failure, and one failure in four breaks min-fit-fraction = 0.9: the
    run stops in round 1 with the reason, and summary.json records it."""
    from fl_app.server.participation import RunAborted

    cfg = {"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "num-server-rounds": 3,
           "fraction-fit": 1.0, "min-fit-fraction": 0.9, "inject-faults": "raise:0", "tracking": "none",
           "results-dir": str(tmp_path), "run-name": "abort"}
    with pytest.raises(RunAborted, match=r"only 3 of 4 sampled clients .*1 failed.*min-fit-fraction = 0.9"):
        serve_in_process(cfg, 4)
    summary = read_summary(tmp_path / "abort")  # the stop is recorded, with its reason
    assert summary["rounds"] == 0 and "1 failed" in summary["stopped"] and "min-fit-fraction = 0.9" in summary["stopped"]


@pytest.mark.slow  # one Flower simulation; test_too_many_failures_stop_the_run_in_process (above) runs the same
# ServerApp and ClientApp without Ray, and test_resume_matches_uninterrupted[scaffold] checks that a
# ServerApp's exception reaches the output `flwr run` streams
def test_too_many_failures_stop_the_run(sim, tmp_path):
    cfg = {"strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "num-server-rounds": 3,
           "fraction-fit": 1.0, "min-fit-fraction": 0.9, "inject-faults": "raise:0",
           "results-dir": str(tmp_path), "run-name": "abort"}
    lines: list[str] = []
    sim.run(cfg, num_supernodes=4, on_line=lines.append)
    assert any("min-fit-fraction = 0.9" in line for line in lines)
    summary = read_summary(tmp_path / "abort")  # the stop is recorded, with its reason
    assert summary["rounds"] == 0 and "1 failed" in summary["stopped"] and "min-fit-fraction = 0.9" in summary["stopped"]


# FedAvg's resume takes the same path as SCAFFOLD's (checkpointed weights and sampler draws) without
# the strategy and client state, and is checked in one process (tests/server/test_resume.py) with them.
@pytest.mark.parametrize("method", [pytest.param("fedavg", marks=pytest.mark.slow), "scaffold"])
def test_resume_matches_uninterrupted(simulated, sim, method, tmp_path, request):
    """Crash a 6-round run after round 3 (injected server crash: synthetic rounds are too fast
    to interrupt from outside at a known point), resume it, and compare rounds 4-6 with an
    uninterrupted run: the method's run of tests/runner/test_simulation.py (same config, the session's
    SuperLink). Rounds 1-3 before the crash are the same-seed check of the default run: the
    same config and seed give the uninterrupted run's metrics.csv to the last digit, every
    column but the timings (tests/runner/test_simulation.py's test_same_seed_same_run, a run of its
    own, is slow)."""
    cfg = simulated_config(method, request)
    assert cfg["num-server-rounds"] == 6
    full = simulated(method, cfg, SUPERNODES)
    assert full.rc == 0, "\n".join(full.lines[-30:])
    full = read_metrics(full.run_dir)
    cfg = {**cfg, "results-dir": str(tmp_path), "run-name": "cut"}

    lines: list[str] = []  # the crash on the session's SuperLink (its start paid once), the resume on a fresh one
    sim.run({**cfg, "inject-faults": "crash-after:3"}, num_supernodes=SUPERNODES, on_line=lines.append)
    assert any("injected crash after round 3" in line for line in lines)  # the ServerApp's error reaches the user
    assert read_summary(tmp_path / "cut") is None
    cut = read_metrics(tmp_path / "cut")
    assert len(cut) == 3 and list(cut[0]) == list(full[0])
    assert [without_timings(r) for r in cut] == [without_timings(r) for r in full[:3]]  # same seed, same run
    if method == "scaffold":  # client state was mirrored for the resume
        assert any((tmp_path / "cut" / "client-state").rglob("round-*.npz"))

    with local_simulation() as fresh:  # a fresh SuperLink: nothing survives in memory
        assert fresh.run({**cfg, "resume": True}, num_supernodes=SUPERNODES) == 0
    assert not fresh.home.exists()  # its temporary FLWR_HOME is deleted after good runs
    resumed = read_metrics(tmp_path / "cut")
    assert [r["round"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(full[3:], resumed[3:]):
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-6)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        state = [k for k in a if k.startswith("state_arrays_in")]  # counted after the restore
        assert {k: b[k] for k in state} == {k: a[k] for k in state}
    assert not (tmp_path / "cut" / "client-state").exists()  # removed once the run finished


def without_timings(row: dict) -> dict:
    """A metrics.csv row less its timings (``*seconds*``), which differ between runs of one
    config; the rest does not (replies are aggregated in partition order, not arrival order)."""
    return {k: v for k, v in row.items() if "seconds" not in k}


def test_reply_views_equal_flowers_decoding():
    """The server checks each reply on zero-copy views of its bytes; they must be exactly the
    arrays Flower's own decoding gives (dtypes, shapes, Fortran order, 0-d)."""
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    from fl_app.server.recording import array_views

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((4, 3, 5, 5)).astype(np.float32), np.arange(7, dtype=np.int64),
              np.array(2.5, dtype=np.float64), np.asfortranarray(rng.standard_normal((5, 3))),
              np.array([np.nan, 1.0], dtype=np.float16)]
    parameters = ndarrays_to_parameters(arrays)
    views = array_views(parameters)
    for view, want in zip(views, parameters_to_ndarrays(parameters), strict=True):
        assert view.dtype == want.dtype and view.shape == want.shape
        np.testing.assert_array_equal(view, want)


# ----------------------------------------------------------------- non-finite aggregate
def test_non_finite_aggregate_is_discarded(tmp_path):
    """Replies that pass every check can still aggregate to a non-finite model (a method's own
    server update overflowing, say): the wrapper then keeps the previous global model (returns no
    parameters) and the run goes on."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.server.strategy import FedAvg

    from tests.kit import Proxy
    from tests.kit_server import RoundByRound

    class OverflowingServer(FedAvg):
        """A server update that overflows: the aggregate holds Inf."""

        def aggregate_fit(self, server_round, results, failures):
            parameters, metrics = super().aggregate_fit(server_round, results, failures)
            return ndarrays_to_parameters([np.full((2,), np.inf, np.float32)]), {"server_metric": 1.0}

    cfg = validate_config({"dataset": "synthetic", "model": "logreg"})
    ones = np.ones((2,), dtype=np.float32)
    results = [(Proxy(str(i)), FitRes(Status(Code.OK, ""), ndarrays_to_parameters([ones]), 10, {}))
               for i in range(2)]
    recording = RoundByRound(OverflowingServer(), cfg, tmp_path / "run", num_rounds=1)
    recording.participation.sampled, recording.round_started, recording.row = 2, 0.0, {}
    parameters, metrics = recording.aggregate_fit(1, results, [])
    assert parameters is None and metrics == {}
    assert recording.row["num_clients"] == 2 and recording.row["num_rejected"] == 0
    assert "server_metric" not in recording.row

    recording = RoundByRound(FedAvg(), cfg, tmp_path / "run2", num_rounds=1)  # control: kept
    recording.participation.sampled, recording.round_started, recording.row = 2, 0.0, {}
    parameters, _ = recording.aggregate_fit(1, results, [])
    assert parameters is not None
