"""runner/estimate.py: the run-time arithmetic, by hand (the probe is machine-dependent)."""

import math

import pytest

from fl_app.registry import get_method, validate_config
from runner.estimate import ROUND_SECONDS, START_SECONDS, Probe, describe, local_steps, run_seconds


def test_run_seconds_by_hand():
    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "num-server-rounds": 45, "fraction-fit": 0.1,
                           "local-epochs": 2, "batch-size": 64})
    # 100 clients: 600 examples each, ceil(600 / 64) = 10 batches x 2 epochs = 20 steps
    assert local_steps(cfg, 100) == 20
    probe = Probe(step_seconds=0.015, forward_seconds_per_example=1e-5)
    # per round: 10 clients x 20 steps x 15 ms / 2 in parallel = 1.5 s, plus 10000 x 1e-5 = 0.1 s eval
    assert run_seconds(cfg, 100, probe, parallel=2) == pytest.approx(START_SECONDS + 45 * (1.6 + ROUND_SECONDS))
    two_pass = {**cfg, "strategy": "fedgam-cv"}  # two forward-backward passes a step
    step_cost = get_method("fedgam-cv").update.step_cost
    assert run_seconds(two_pass, 100, probe, parallel=2, step_cost=step_cost) == pytest.approx(START_SECONDS + 45 * (3.1 + ROUND_SECONDS))


def test_min_fit_clients_and_synthetic():
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "num-server-rounds": 2, "fraction-fit": 0.1,
                           "min-fit-clients": 3, "min-available-clients": 10, "batch-size": 32,
                           "local-epochs": 1})
    assert local_steps(cfg, 10) == 4  # about 100 examples per synthetic client: ceil(100 / 32)
    probe = Probe(0.01, 0.0)
    assert run_seconds(cfg, 10, probe, parallel=1) == pytest.approx(START_SECONDS + 2 * (3 * 4 * 0.01 + ROUND_SECONDS))


def test_describe_probes_once_per_model_and_says_it_is_an_estimate():
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "num-server-rounds": 1})
    text = describe([cfg, {**cfg, "seed": 1}], clients=4, parallel=2)
    assert text.startswith("estimated run time on this machine:") and "for 2 runs" in text
    assert text.count("ms/step") == 1 and "an estimate" in text


def test_flower_costs_every_round_and_every_run_even_without_arithmetic():
    """A run with no training and no evaluation still pays Flower's start and its per-round
    cost (the estimate fell short of measured sweeps by a quarter without them)."""
    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "num-server-rounds": 60})
    free = Probe(step_seconds=0.0, forward_seconds_per_example=0.0)
    assert run_seconds(cfg, 100, free, parallel=2) == pytest.approx(20.0 + 60 * 0.3)



def test_a_dataset_in_a_data_folder_is_estimated_from_its_files(tmp_path):
    """A dataset added to tasks/catalogue.py (docs/tasks.md, "Add my dataset") needs no size
    table: the estimate reads the row counts of the folder's parquet files (it raised KeyError)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "my-digits").mkdir()
    for split, rows in (("train", 6400), ("test", 500)):
        pq.write_table(pa.table({"label": list(range(rows))}), tmp_path / "my-digits" / f"{split}.parquet")
    cfg = {**validate_config({"num-server-rounds": 3, "fraction-fit": 0.5, "batch-size": 32}),
           "dataset": "my-digits", "data-dir": str(tmp_path)}
    assert local_steps(cfg, 10) == 20  # 640 examples a client: 20 batches of 32
    probe = Probe(step_seconds=0.01, forward_seconds_per_example=1e-3)
    # per round: 5 clients x 20 steps x 10 ms / 1 = 1 s, plus 500 x 1 ms = 0.5 s eval
    assert run_seconds(cfg, 10, probe, parallel=1) == pytest.approx(START_SECONDS + 3 * (1.5 + ROUND_SECONDS))
    mnist = {**cfg, "dataset": "mnist"}  # no mnist/ in the folder: the hub's 60,000 / 10,000
    assert local_steps(mnist, 10) == math.ceil(6000 / 32)


def test_a_dataset_of_unknown_size_is_named_not_guessed():
    cfg = {**validate_config({"model": "logreg", "dataset": "synthetic", "num-server-rounds": 1})}
    hub_only = {**cfg, "dataset": "my-digits", "data-dir": ""}
    text = describe([cfg, hub_only], clients=4, parallel=2)
    assert "for 1 runs" in text and "1 runs on my-digits not estimated" in text
    assert describe([hub_only], clients=4).startswith("estimated run time on this machine: unknown;")
