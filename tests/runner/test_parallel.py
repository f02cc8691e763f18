"""Concurrent sweeps: ``run_simulation.py --parallel N`` (runner/parallel.py).

The scheduling (how many workers, each one's share, the pool's order, failures and Ctrl-C) is
tested without Flower; the runner's launch step with stand-in simulations (its outcome in the
sweep's order, a failing run beside finished ones); one small end-to-end sweep through Flower
compares ``--parallel 2`` with ``--parallel 1``; a slow one kills a parallel runner with
``kill -9`` and checks that every worker's watchdog stopped its processes.
"""

from __future__ import annotations

import _thread
import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import run_simulation
from fl_app.common.procfs import descendants, environ_of, processes_with_env
from fl_app.config import ConfigError
from runner import sweep as runner_sweep
from runner.parallel import (
    MEMORY_PER_RUN,
    Failed,
    Machine,
    Pool,
    Share,
    check_workers,
    cpu_quota,
    default_workers,
    run_pool,
    split,
)
from runner.plan import run_name
from tests.kit import ROOT

BIG = 1 << 40  # memory enough not to matter


# ---- how many at once ------------------------------------------------------------------------------------

def test_a_two_core_machine_runs_one_at_a_time():
    assert default_workers(Machine(cores=2, memory=BIG), runs=10) == 1
    assert default_workers(Machine(cores=7, memory=BIG), runs=10) == 1


def test_the_default_follows_cores_memory_gpus_and_the_runs_left():
    assert default_workers(Machine(cores=16, memory=BIG), runs=10) == 4  # 4 cores a run
    assert default_workers(Machine(cores=16, memory=BIG), runs=3) == 3  # never more than runs to launch
    assert default_workers(Machine(cores=16, memory=BIG), runs=10, cpus_per_client=4) == 2  # 2 x 4 cores a run
    assert default_workers(Machine(cores=64, memory=2 * MEMORY_PER_RUN), runs=10) == 2  # memory
    assert default_workers(Machine(cores=64, memory=0), runs=10) == 1  # never 0
    # GPU clients: no more runs than the GPUs hold clients (0.5 GPU each: 2 on one GPU)
    assert default_workers(Machine(cores=16, gpus=1, memory=BIG), runs=10, gpus_per_client=0.5) == 2
    assert default_workers(Machine(cores=16, gpus=1, memory=BIG), runs=10, gpus_per_client=0.1) == 4
    assert default_workers(Machine(cores=64, memory=BIG), runs=10, cluster=True) == 1  # a Ray cluster: ask


def test_a_container_s_cpu_quota_bounds_the_cores(tmp_path):
    (tmp_path / "cpu.max").write_text("400000 100000\n")  # cgroup v2: 4 cores
    assert cpu_quota(str(tmp_path)) == 4
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota(str(tmp_path)) == 2  # rounded up
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(str(tmp_path)) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("800000\n")  # cgroup v1: 8 cores
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(str(tmp_path)) == 8
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(str(tmp_path)) is None
    assert cpu_quota(str(tmp_path / "none")) is None


def test_parallel_below_one_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"--parallel = 0 is invalid: must be >= 1"):
        check_workers(0)
    check_workers(None)
    check_workers(3)
    argv = ["--dataset", "synthetic", "--set", "model=logreg", "--parallel", "0", "--out", str(tmp_path / "o")]
    assert run_simulation.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --parallel = 0 is invalid") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # refused before anything was written


# ---- each worker's share ---------------------------------------------------------------------------------

def test_one_worker_gets_what_a_run_alone_gets():
    assert split(1, Machine(cores=16, gpus=2), gpus_per_client=0.5) == [Share(gpus_per_client=0.5)]
    assert split(3, Machine(cores=16), cluster=True) == [Share()] * 3  # the cluster's scheduler shares it


def test_the_cores_are_split_and_every_share_holds_one_client():
    assert [s.ray_cpus for s in split(4, Machine(cores=16))] == [4, 4, 4, 4]
    assert [s.ray_cpus for s in split(2, Machine(cores=5))] == [3, 2]
    assert [s.ray_cpus for s in split(2, Machine(cores=2))] == [1, 1]
    assert [s.ray_cpus for s in split(2, Machine(cores=2), cpus_per_client=2)] == [2, 2]  # asked beyond the machine
    assert all(s.ray_gpus is None and s.cuda_devices is None for s in split(2, Machine(cores=4)))


def test_gpus_by_device_when_there_are_enough_else_a_larger_fraction_per_client():
    own = split(2, Machine(cores=16, gpus=4), gpus_per_client=0.5)
    assert [(s.cuda_devices, s.ray_gpus, s.gpus_per_client) for s in own] == [("0,1", 2, 0.5), ("2,3", 2, 0.5)]
    named = split(2, Machine(cores=16, gpus=2), gpus_per_client=0.5, visible="3,5")  # torch's 0, 1 are 3, 5
    assert [s.cuda_devices for s in named] == ["3", "5"]
    # one GPU, 4 runs, 0.1 GPU a client: each run fits 2.5 clients on it, 10 together as one run alone
    shared = split(4, Machine(cores=16, gpus=1), gpus_per_client=0.1)
    assert {(s.ray_gpus, s.cuda_devices, round(s.gpus_per_client, 9)) for s in shared} == {(1, None, 0.4)}
    assert {s.gpus_per_client for s in split(4, Machine(cores=16, gpus=1), gpus_per_client=0.5)} == {1.0}


# ---- the pool --------------------------------------------------------------------------------------------

class Fake:
    """A stand-in worker: records its jobs; ``stop`` marks it closed (and releases a job waiting
    for it, as closing a LocalSimulation ends its `flwr run`)."""

    def __init__(self, share):
        self.share, self.jobs, self.stops = share, [], 0
        self.closed = threading.Event()

    def stop(self):
        self.stops += 1
        self.closed.set()


def make_pool(jobs, n, work, fail_start=()):
    made: list[Fake] = []

    def start(share):
        if share in fail_start:
            raise RuntimeError(f"worker {share} did not start")
        made.append(Fake(share))
        return made[-1]

    return Pool(jobs, list(range(n)), start=start, stop=Fake.stop, work=work), made


def test_results_come_in_job_order_whoever_finishes_first_and_every_worker_works():
    def work(worker, job):
        worker.jobs.append(job)
        time.sleep(0.3 if job == 0 else 0.01)  # job 0 finishes last
        return job * 10

    pool, made = make_pool(range(6), 2, work)
    assert pool.results() == [0, 10, 20, 30, 40, 50]
    assert len(made) == 2 and all(w.jobs for w in made) and sorted(j for w in made for j in w.jobs) == list(range(6))
    assert [w.stops for w in made] == [1, 1]  # each stopped once, at the end


def test_a_failing_job_is_recorded_and_the_others_go_on():
    def work(worker, job):
        if job == 1:
            raise ValueError("boom")
        return job

    results, made = None, None
    pool, made = make_pool(range(4), 2, work)
    results = pool.results()
    assert results[0] == 0 and results[2] == 2 and results[3] == 3
    assert isinstance(results[1], Failed) and str(results[1].error) == "boom"


def test_one_worker_is_the_plain_loop_in_this_thread_and_raises_as_it_comes():
    threads = []

    def work(worker, job):
        threads.append(threading.current_thread())
        if job == 1:
            raise ValueError("boom")
        return job

    pool, made = make_pool(range(3), 1, work)
    with pytest.raises(ValueError, match="boom"):
        pool.results()
    assert threads == [threading.main_thread()] * 2 and made[0].stops == 1  # job 2 never ran; stopped
    assert run_pool([1, 2], [0], start=Fake, stop=Fake.stop, work=lambda w, j: j + 1) == [2, 3]


def test_a_worker_that_cannot_start_leaves_its_jobs_to_the_others():
    pool, made = make_pool(range(4), 2, lambda w, j: j, fail_start={0})
    assert pool.results() == [0, 1, 2, 3] and len(made) == 1
    pool, made = make_pool(range(4), 2, lambda w, j: j, fail_start={0, 1})
    with pytest.raises(RuntimeError, match="did not start"):  # none started: raised as the sequential runner does
        pool.results()


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler during the test, as in the runner's process: ``interrupt_main``
    calls whatever handler is installed, and an in-process Flower run earlier in the suite may
    leave Flower's (``flwr.supercore.exit.signal_handler``), under which no KeyboardInterrupt comes."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_every_worker_and_starts_no_further_job(python_sigint):
    """Ctrl-C reaches the main thread while both workers run a job: both are stopped (which
    ends their runs), no job after them starts, and the KeyboardInterrupt goes on."""
    both = threading.Barrier(2)
    started = []

    def work(worker, job):
        started.append(job)
        both.wait(10)
        if job == 0:
            _thread.interrupt_main()  # as a terminal's Ctrl-C: KeyboardInterrupt in the main thread
        assert worker.closed.wait(10), "the worker was not stopped"
        return job

    pool, made = make_pool(range(5), 2, work)
    with pytest.raises(KeyboardInterrupt):
        pool.results()
    assert sorted(started) == [0, 1] and pool.stopping.is_set()
    assert [w.stops for w in made] == [1, 1]


# ---- the runner's launch step, with stand-in simulations -------------------------------------------------

class FakeSimulation:
    """Stands in for LocalSimulation in ``runner.sweep.launch``: a run writes the summary
    the ServerApp would (fedprox's seed-1 run writes none: a failed run), and runs on the
    first worker take longer, so runs finish out of the sweep's order."""

    started: list[FakeSimulation] = []

    def __init__(self, app_dir=None, ray_address=None, hold=()):
        self.app_dir, self.ray_resources, self.env, self.closed = app_dir, {}, {}, 0
        FakeSimulation.started.append(self)

    def start(self):
        pass

    def close(self):
        self.closed += 1

    def run(self, cfg, num_supernodes, cpus_per_client=1, gpus_per_client=0.0, on_line=None, timeout=None):
        if self is FakeSimulation.started[0]:
            time.sleep(0.2)
        on_line(f"INFO :      fl-drift: round 1/1: test accuracy 0.{cfg['seed']}")
        if cfg["run-name"] != "fedprox-seed1":
            run_dir = Path(cfg["results-dir"]) / cfg["run-name"]
            (run_dir / "summary.json").write_text(json.dumps({
                "config": cfg, "rounds": 1, "final_accuracy": 0.5, "best_accuracy": 0.5, "total_seconds": 1.0}))
            (run_dir / "metrics.csv").write_text("round,test_accuracy\n1,0.5\n")  # as a finished run keeps it
        return 0


def test_launch_files_the_runs_in_the_sweep_s_order_with_a_failed_one_listed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner_sweep, "LocalSimulation", FakeSimulation)
    FakeSimulation.started = []
    runs = tmp_path / "runs"
    configs = [(row, seed, {"strategy": row, "dataset": "synthetic", "model": "logreg", "seed": seed,
                            "results-dir": str(runs), "run-name": run_name(row, seed)})
               for row in ("fedavg", "fedprox") for seed in (0, 1)]
    args = argparse.Namespace(parallel=2, clients=4, cpus_per_client=1.0, quiet=True, verbose=False, ray_address=None)
    outcome = runner_sweep.launch(args, configs, runs, 0.0)
    assert list(outcome.runs) == ["fedavg", "fedprox"]
    assert outcome.runs["fedavg"] == [runs / "fedavg-seed0", runs / "fedavg-seed1"]
    assert outcome.runs["fedprox"] == [runs / "fedprox-seed0"]
    assert outcome.failed == ["fedprox-seed1"]
    assert len(FakeSimulation.started) == 2 and [s.closed for s in FakeSimulation.started] == [1, 1]
    assert {s.ray_resources["num-cpus"] for s in FakeSimulation.started} == {max(1, Machine.here().cores // 2)}
    out = capsys.readouterr()
    assert "running 4 runs 2 at a time (--parallel 2)" in out.out
    assert "  [3/4] fl-drift: round 1/1: test accuracy 0.0" in out.out.replace("INFO :      ", "")
    assert "  [4/4] run failed" in out.err

    # run again in the same folder: finished runs are kept, only the failed one runs again
    FakeSimulation.started = []
    again = runner_sweep.launch(args, configs, runs, 0.0)
    assert again.runs == outcome.runs and again.failed == ["fedprox-seed1"]
    assert len(FakeSimulation.started) == 1  # one run left: one worker
    assert "[1/4] fedavg seed 0: finished earlier, kept" in capsys.readouterr().out


# ---- end to end through Flower ---------------------------------------------------------------------------

def sweep(out: Path, parallel: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run_simulation.py", "--strategy", "fedavg,fedprox", "--dataset", "synthetic",
         "--set", "model=logreg", "--set", "tracking=none", "--rounds", "2", "--clients", "4", "--fraction", "0.5",
         "--seeds", "0", "--out", str(out), "--quiet", "--parallel", str(parallel)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)


def timing(column: str) -> bool:
    """Wall-clock columns: seconds per run and round, client compute and its paired difference."""
    return "seconds" in column or column.startswith("compute_diff")


def without_timing(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: v for k, v in row.items() if not timing(k)} for row in csv.DictReader(f)]


# two sweeps of two runs each: about 100 s on a 2-core machine shared with other work
@pytest.mark.slow
def test_parallel_two_gives_the_comparison_of_one_at_a_time(tmp_path):
    one, two = sweep(tmp_path / "one", 1), sweep(tmp_path / "two", 2)
    for proc in (one, two):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 at a time" in two.stdout and "at a time" not in one.stdout
    a, b = without_timing(tmp_path / "one" / "comparison.csv"), without_timing(tmp_path / "two" / "comparison.csv")
    assert len(a) == 2 and a == b
    for name in ("fedavg-seed0", "fedprox-seed0"):  # the same run folders, the same rounds
        assert (tmp_path / "two" / "runs" / name / "summary.json").exists()
        rows = [without_timing(tmp_path / d / "runs" / name / "metrics.csv") for d in ("one", "two")]
        assert rows[0] == rows[1] and len(rows[0]) == 2


# ---- kill -9 of a parallel runner ------------------------------------------------------------------------

def homes_with_ray(pid: int) -> set[str] | None:
    """The FLWR_HOMEs of the runner's process tree once two raylets run in it, else None."""
    tree = descendants([pid])
    if sum(name == "raylet" for _, name in tree.values()) < 2:
        return None
    return {env["FLWR_HOME"] for p in tree if "FLWR_HOME" in (env := environ_of(p))}


@pytest.mark.slow  # two Rays started on a 2-core machine: about 60-90 s
def test_kill_9_of_a_parallel_runner_leaves_no_process_of_any_worker(tmp_path):
    out = tmp_path / "out"
    argv = ["--strategy", "fedavg,fedprox", "--dataset", "synthetic", "--set", "model=logreg", "--set",
            "tracking=none", "--clients", "2", "--rounds", "500", "--out", str(out), "--parallel", "2", "--quiet"]
    runner = subprocess.Popen([sys.executable, "run_simulation.py", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, homes = time.monotonic() + 300, None
        while runner.poll() is None and time.monotonic() < deadline and not homes:
            homes = homes_with_ray(runner.pid)
            time.sleep(0.5)
        assert homes and len(homes) == 2, f"two workers with Ray never ran (runner exit {runner.poll()})"
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        deadline = time.monotonic() + 30
        while any(processes_with_env("FLWR_HOME", h) for h in homes) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(processes_with_env("FLWR_HOME", h) for h in homes), "a worker's processes outlived the runner"
        while any(Path(h).exists() for h in homes) and time.monotonic() < deadline + 10:
            time.sleep(0.2)
        assert not any(Path(h).exists() for h in homes)  # each watchdog removed its worker's FLWR_HOME
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
