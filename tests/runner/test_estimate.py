"""runner/estimate.py: the run-time arithmetic, by hand (the probes are machine-dependent),
this machine's timings (recorded from a finished run, read back) and the estimate's range."""

import csv
import json
import math
import os
import subprocess
import sys
import time

import pytest

from fl_app.registry import get_method, validate_config
from runner.estimate import (
    DEFAULT_TIMINGS,
    Probe,
    Timing,
    describe,
    estimate,
    local_steps,
    margin,
    recent_timings,
    run_seconds,
    timing_of_run,
)

# a timing whose start-up and Flower parts are easy to follow by hand
PLAIN = Timing(reference=0.01, outside=30.0, node=2.0, prepare=0.5, train_ratio=2.0, parallel=2.0, eval_ratio=1.0,
               flower=0.2)


def test_run_seconds_by_hand():
    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "num-server-rounds": 45, "fraction-fit": 0.1,
                           "local-epochs": 2, "batch-size": 64})
    # 100 clients: 600 examples each, ceil(600 / 64) = 10 batches x 2 epochs = 20 steps
    assert local_steps(cfg, 100) == 20
    probe = Probe(step_seconds=0.015, forward_seconds_per_example=1e-5)
    # start: 30 s + 100 nodes x 2 s; per round: 10 clients x (0.5 s + 20 steps x 15 ms x 2) / 2 at once = 5.5 s,
    # plus 10000 x 1e-5 = 0.1 s eval, plus 0.2 s of Flower
    assert run_seconds(cfg, 100, probe, PLAIN, reference=0.01) == pytest.approx(230 + 45 * 5.8)
    # a machine twice as slow now (the reference probe): the start-up and Flower's part double
    assert run_seconds(cfg, 100, probe, PLAIN, reference=0.02) == pytest.approx(460 + 45 * (5.5 + 2.5 + 0.1 + 0.4))
    two_pass = {**cfg, "strategy": "fedgam-cv"}  # two forward-backward passes a step
    step_cost = get_method("fedgam-cv").update.step_cost
    assert run_seconds(two_pass, 100, probe, PLAIN, 0.01, step_cost=step_cost) == pytest.approx(230 + 45 * (2.5 + 3 * step_cost + 0.3))


def test_min_fit_clients_and_synthetic():
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "num-server-rounds": 2, "fraction-fit": 0.1,
                           "min-fit-clients": 3, "min-available-clients": 10, "batch-size": 32,
                           "local-epochs": 1})
    assert local_steps(cfg, 10) == 4  # about 100 examples per synthetic client: ceil(100 / 32)
    probe = Probe(0.01, 0.0)
    # 3 clients a round, 2 at once: 3 x (0.5 + 4 x 0.01 x 2) / 2
    assert run_seconds(cfg, 10, probe, PLAIN, 0.01) == pytest.approx(50 + 2 * (1.5 * 0.58 + 0.2))


def test_describe_probes_once_per_model_and_gives_a_range():
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "num-server-rounds": 1})
    text = describe([cfg, {**cfg, "seed": 1}], clients=4, timings=[])
    assert text.startswith("estimated run time on this machine:") and "for 2 runs" in text
    assert text.count("ms/step") == 1 and "range" in text and "default timings" in text
    est = estimate([cfg], clients=4, timings=[PLAIN, Timing(**{**PLAIN.__dict__, "node": 4.0})])
    assert est.timings == 2 and est.low < est.seconds < est.high
    assert est.high / est.low > 1.5  # both timings' spread, widened either way
    assert margin(load=1.0, cores=2) == 0.2 and margin(load=8.0, cores=2) == pytest.approx(0.5)
    assert margin(load=40.0, cores=2) == 0.6


def test_flower_and_the_nodes_cost_every_run_even_without_arithmetic():
    """A run with no training and no evaluation still pays the start-up (per node) and Flower's
    rounds: the nodes' start-up was 2.6-2.9 s each on the 2-core machine, not a fixed 20 s a run."""
    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "num-server-rounds": 60})
    free = Probe(step_seconds=0.0, forward_seconds_per_example=0.0)
    quiet = Timing(**{**PLAIN.__dict__, "prepare": 0.0})
    assert run_seconds(cfg, 100, free, quiet, 0.01) == pytest.approx(30 + 100 * 2 + 60 * 0.2)
    assert all(t.node > 0 and t.outside > 0 for t in DEFAULT_TIMINGS)


def fake_run(folder, rounds=3, total=40.0):
    """A finished run's summary.json and metrics.csv, as the server writes them."""
    folder.mkdir(parents=True)
    cfg = validate_config({"dataset": "mnist", "model": "cnn-small", "num-server-rounds": rounds, "fraction-fit": 0.5})
    (folder / "summary.json").write_text(json.dumps({"config": cfg, "rounds": rounds, "total_seconds": total,
                                                     "stopped": None}))
    keys = ["round", "round_seconds", "fit_phase_seconds", "fit_seconds_mean", "num_clients", "prepare_seconds_mean",
            "train_seconds_mean", "evaluate_seconds", "aggregate_seconds"]
    with open(folder / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        w.writerow([0, "", "", "", "", "", "", 1.0, ""])
        for k in range(1, rounds + 1):
            # 5 clients of 4 s each in an 8 s fit phase: 2.5 at once; 1 s evaluating, 0.5 s else
            w.writerow([k, 9.5, 8.0, 4.0, 5, 1.0, 3.0, 1.0, 0.0])
    return folder


def test_a_finished_runs_timing_is_recorded_and_read_back(tmp_path, monkeypatch):
    import runner.estimate as est

    monkeypatch.setattr(est, "measure", lambda cfg: Probe(0.001, 1e-5))
    monkeypatch.setattr(est, "reference_seconds", lambda: 0.01)
    run = fake_run(tmp_path / "runs" / "fedavg-seed0")
    timing = est.record_timing(run, wall=60.0, clients=10, path=tmp_path / "t.jsonl")
    # 20 s outside the server; (40 - 3 x 9.5) / 10 nodes; 600 steps of a 6000-example client at 1 ms
    assert timing.outside == pytest.approx(20.0) and timing.node == pytest.approx(1.15)
    assert timing.parallel == pytest.approx(2.5) and timing.prepare == pytest.approx(1.0)
    assert timing.train_ratio == pytest.approx(3.0 / (local_steps({"dataset": "mnist", "local-epochs": 1,
                                                                   "batch-size": 32}, 10) * 0.001))
    assert timing.eval_ratio == pytest.approx(1.0 / (10000 * 1e-5)) and timing.flower == pytest.approx(0.5)
    assert recent_timings(tmp_path / "t.jsonl") == [timing]
    # probed before the run (as the sweep does): those probes, not the ones after it
    before = est.timing_of_run(run, 60.0, 10, before=(0.02, Probe(0.002, 1e-5)))
    assert before.reference == 0.02 and before.train_ratio == pytest.approx(timing.train_ratio / 2)
    assert recent_timings(tmp_path / "t.jsonl", now=1e12) == []  # too old
    assert timing_of_run(fake_run(tmp_path / "short", rounds=2), 60.0, 10) is not None
    (tmp_path / "short" / "metrics.csv").write_text("round,round_seconds\n1,3\n")  # an older run's columns
    assert timing_of_run(tmp_path / "short", 60.0, 10) is None


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
    assert run_seconds(cfg, 10, probe, PLAIN, 0.01) == pytest.approx(50 + 3 * (5 * (0.5 + 0.4) / 2 + 0.5 + 0.2))
    mnist = {**cfg, "dataset": "mnist"}  # no mnist/ in the folder: the hub's 60,000 / 10,000
    assert local_steps(mnist, 10) == math.ceil(6000 / 32)


def test_a_dataset_of_unknown_size_is_named_not_guessed():
    cfg = {**validate_config({"model": "logreg", "dataset": "synthetic", "num-server-rounds": 1})}
    hub_only = {**cfg, "dataset": "my-digits", "data-dir": ""}
    text = describe([cfg, hub_only], clients=4, timings=[])
    assert "for 1 runs" in text and "1 runs on my-digits not estimated" in text
    assert describe([hub_only], clients=4).startswith("estimated run time on this machine: unknown;")


def test_the_timings_recorded_nearest_the_load_now_make_the_estimate():
    """Timings taken beside other work are 2-3x slower in their start-up and nodes than idle ones
    (an idle sweep estimated from loaded timings at 14 min took 5.0): the estimate uses the
    timings whose background load (``load_now`` as the run started) is nearest the load now, and
    all of them when none recorded it; an older entry's 1-minute load average at the run's end
    is read less the run's own ``parallel``."""
    from runner.estimate import closest_in_load

    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "num-server-rounds": 5})
    idle = Timing(**{**PLAIN.__dict__, "background": 0.0})
    busy = Timing(**{**PLAIN.__dict__, "node": 6.0, "outside": 90.0, "background": 6.0})
    assert idle.background == 0.0 and busy.background == 6.0
    assert Timing(**PLAIN.__dict__).background == -1.0  # not recorded
    pool = [busy] * 9 + [idle]
    assert closest_in_load(pool, 0.3) == [idle] and closest_in_load(pool, 5.0) == [busy] * 8
    assert closest_in_load([PLAIN, PLAIN], 0.3) == [PLAIN, PLAIN]
    assert estimate([cfg], 100, timings=pool, load=0.2).runs == estimate([cfg], 100, timings=[idle], load=0.2).runs
    assert estimate([cfg], 100, timings=pool, load=6.0).runs == estimate([cfg], 100, timings=[busy], load=6.0).runs
    # no timings of this machine: the defaults nearest the load now (an idle one among them)
    assert min(t.background for t in DEFAULT_TIMINGS) < 0.5


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="load_now reads /proc (Linux)")
def test_load_now_counts_the_work_beside_the_runners_process_tree():
    """The load counts the runnable threads outside the caller's process tree: a busy process
    beside it adds one (a loop never sleeps: it is always running or ready to run); the same
    process as the caller's child (a sweep's SuperLink, Ray and their polls, about 1 thread on the
    idle 2-core machine) does not, so the load a sweep records before each run reads what
    ``--check`` reads before any of them started (before, the idle machine's runs recorded 1.0-1.1)."""
    from runner.estimate import beside_tree, load_now, runnable_threads

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)
        processes = runnable_threads()
        assert processes[busy.pid][1] >= 1 and processes[busy.pid][0] == os.getpid()
        mine, beside_other = beside_tree(processes, os.getpid()), beside_tree(processes, other.pid)
        assert beside_other - mine == processes[busy.pid][1]  # counted beside another tree, not beside its own
        assert load_now(root=other.pid) >= 0.9
    finally:
        busy.kill()
        other.kill()
        busy.wait()
        other.wait()


def test_beside_tree_by_hand():
    from runner.estimate import beside_tree

    # pid: (parent, runnable threads); the tree of 10 is 10, 11 and 12 (11's child)
    processes = {1: (0, 1), 10: (1, 2), 11: (10, 1), 12: (11, 5), 20: (1, 3), os.getpid(): (1, 7)}
    assert beside_tree(processes, 10) == 1 + 3  # and never the reader itself
    assert beside_tree(processes, 20) == 1 + 2 + 1 + 5


def test_a_timing_of_this_machine_is_moved_to_the_load_now():
    """This machine's timing recorded idle, estimated at load 4 on 2 cores: its start-up, nodes
    and Flower's parts take ``slowdown(4) = 1 + 1.5 * 4 / 2 = 4`` times as long; the local steps
    and the evaluation follow the probe (taken at the load now), unchanged."""
    from runner.estimate import slowdown

    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "num-server-rounds": 45, "fraction-fit": 0.1,
                           "local-epochs": 2, "batch-size": 64})
    probe = Probe(step_seconds=0.015, forward_seconds_per_example=1e-5)
    idle = Timing(**{**PLAIN.__dict__, "background": 0.0})
    assert slowdown(0.0, 2) == 1.0 and slowdown(4.0, 2) == 4.0 and slowdown(2.0, 4) == 1.75
    cores = os.cpu_count()
    factor = slowdown(4.0) / slowdown(0.0)
    assert factor == pytest.approx(1 + 1.5 * 4 / cores)
    # by hand (test_run_seconds_by_hand): start 230 s, per round 10 x 0.5 s / 2 = 2.5 s prepare, 3 s steps,
    # 0.1 s eval, 0.2 s Flower
    moved = run_seconds(cfg, 100, probe, idle, 0.0, load=4.0)
    assert moved == pytest.approx(230 * factor + 45 * (2.5 * factor + 3.0 + 0.1 + 0.2 * factor))
    assert run_seconds(cfg, 100, probe, idle, 0.0, load=0.0) == pytest.approx(230 + 45 * 5.8)
    assert run_seconds(cfg, 100, probe, PLAIN, 0.0, load=4.0) == pytest.approx(230 + 45 * 5.8)  # load not recorded


def test_an_idle_machines_timings_give_way_to_the_defaults_at_load():
    """A machine that has only run idle estimates a run at load 4 from the default timings
    recorded beside 4 busy processes (its idle ones moved by the load model missed by 2x: 8.2 min
    estimated, 15 min taken); beside a little load, and wherever its own are as near, its own."""
    from runner.estimate import choose_timings

    idle = Timing(**{**PLAIN.__dict__, "background": 0.0})
    busy = Timing(**{**PLAIN.__dict__, "background": 4.0})
    pool, mine = choose_timings([idle] * 3, 4.0)
    assert not mine and pool and all(t in DEFAULT_TIMINGS for t in pool)
    assert min(abs(t.background - 4.0) for t in pool) < 0.5
    assert choose_timings([idle] * 3, 0.5) == ([idle] * 3, True)
    assert choose_timings([idle, busy], 8.0) == ([busy], True)  # 4 away, the defaults' nearest 3.1: within reach
    assert choose_timings([PLAIN], 4.0) == ([PLAIN], True)  # a load not recorded: its own
    cfg = validate_config({"strategy": "fedavg", "dataset": "mnist", "num-server-rounds": 5})
    est = estimate([cfg], 100, timings=[idle] * 3, load=4.0)
    assert not est.own and est.timings == 3


def test_the_range_widens_with_the_distance_to_the_timings_load():
    assert margin(load=0.0, cores=2, far=0.0) == pytest.approx(0.2)
    assert margin(load=2.0, cores=2, far=2.0) == pytest.approx(0.2 + 0.25)
    assert margin(load=8.0, cores=2, far=4.0) == pytest.approx(0.5 + 0.5)
    assert margin(load=40.0, cores=2, far=30.0) == 1.0


def test_a_timing_records_the_load_beside_its_run(tmp_path, monkeypatch):
    """The background load measured before a run (the sweep's ``probe_before``) is what its
    timing records; an older entry without it is read from its load average less ``parallel``."""
    import runner.estimate as est

    monkeypatch.setattr(est, "measure", lambda cfg: Probe(0.001, 1e-5))
    run = fake_run(tmp_path / "runs" / "fedavg-seed0")
    timing = est.record_timing(run, wall=60.0, clients=10, path=tmp_path / "t.jsonl",
                               before=(0.01, Probe(0.001, 1e-5), 3.0))
    assert timing.background == 3.0 and recent_timings(tmp_path / "t.jsonl")[0].background == 3.0
    entry = json.loads((tmp_path / "t.jsonl").read_text())
    del entry["background"]
    (tmp_path / "old.jsonl").write_text(json.dumps({**entry, "load": 7.0, "parallel": 2.5}) + "\n")
    assert recent_timings(tmp_path / "old.jsonl")[0].background == pytest.approx(4.5)
