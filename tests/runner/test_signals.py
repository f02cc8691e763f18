"""Ctrl-C and SIGTERM of a runner mid-run: it exits promptly, leaves no process behind (the
SuperLink, Flower's and Ray's processes), keeps what was kept (the rows and checkpoint of the
rounds done), and ``--resume`` gives the uninterrupted run's metrics.csv rows.

A runner (``run_simulation.py``) runs SCAFFOLD (server and client state) on an MNIST sample with
2 clients; once its first checkpoint is written it gets SIGINT on its whole process group (what a
terminal's Ctrl-C sends) or SIGTERM on its own PID (what ``timeout`` and job schedulers send).
``kill -9`` is tests/runner/test_runner_lifecycle.py's and tests/training/test_cohort_kill_resume.py's.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fl_app.common.procfs import descendants, environ_of, processes_with_env
from tests.kit import ROOT

pytestmark = pytest.mark.slow  # three runners per signal, each starting Flower and Ray: 1-3 minutes

ROUNDS = 30  # rounds of an MNIST sample take a fraction of a second: enough left when the signal lands
GONE_WITHIN = 30.0  # a bound on waiting for processes to go, not a measured time


def runner(out: Path, data: Path) -> subprocess.Popen:
    argv = ["--strategy", "scaffold", "--dataset", "mnist", "--data-dir", str(data), "--set", "model=cnn-small",
            "--set", "tracking=none", "--clients", "2", "--fraction", "1.0", "--rounds", str(ROUNDS),
            "--out", str(out)]
    return started(argv)


def started(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.Popen([sys.executable, "run_simulation.py", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def rows(out: Path) -> list[dict]:
    """The run's metrics.csv rows less what differs between two runs of one config (timings, Ray node)."""
    found = list(out.glob("runs/*/metrics.csv"))
    if not found:
        return []
    with found[0].open(newline="") as f:
        return [{k: v for k, v in row.items() if "seconds" not in k and k != "ray_node"} for row in csv.DictReader(f)]


def wait_until(condition, timeout: float, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(step)
    return value


@pytest.fixture(scope="module")
def uninterrupted(mnist_sample, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("signals") / "full"
    proc = runner(out, mnist_sample(600, 100))
    output = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, output[-3000:]
    want = rows(out)
    assert [r["round"] for r in want] == [str(r) for r in range(1, ROUNDS + 1)]
    return want


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_signalled_runner_stops_its_processes_keeps_its_rounds_and_resumes_to_the_uninterrupted_run(
        how, tmp_path, mnist_sample, uninterrupted):
    out = tmp_path / "cut"
    proc = runner(out, mnist_sample(600, 100))
    try:
        checkpoint = wait_until(lambda: proc.poll() is None and next(out.glob("runs/*/checkpoint.npz"), None), 600)
        assert checkpoint, f"the runner ended before its first checkpoint: {proc.stdout.read()[-3000:]}"
        homes = {env["FLWR_HOME"] for pid in descendants([proc.pid]) if "FLWR_HOME" in (env := environ_of(pid))}
        assert homes, "no process of the runner carries its FLWR_HOME"
        signalled = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground process group
        else:
            os.kill(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]  # prompt: a hang guard, not a timing
        print(f"{how}: the runner exited {time.monotonic() - signalled:.1f} s after the signal")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if how == "ctrl-c" else 128 + signal.SIGTERM), output[-3000:]
    by = "Ctrl-C" if how == "ctrl-c" else "SIGTERM"
    assert f"interrupted ({by}): the runs finished or checkpointed in {out} are kept" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    left = wait_until(lambda: not any(processes_with_env("FLWR_HOME", home) for home in homes), GONE_WITHIN)
    assert left, f"processes left after the runner exited: {[processes_with_env('FLWR_HOME', h) for h in homes]}"

    kept = rows(out)
    print(f"{how}: {len(kept)} of {ROUNDS} rounds kept")
    assert 1 <= len(kept) < ROUNDS, f"{len(kept)} rows kept of {ROUNDS}"
    assert kept == uninterrupted[: len(kept)]  # the rows kept are the run's own
    assert not list(out.glob("runs/*/summary.json")) and list(out.glob("runs/*/checkpoint.npz"))

    resumed = started(["--resume", str(out), "--quiet"])
    output = resumed.communicate(timeout=900)[0]
    assert resumed.returncode == 0, output[-3000:]
    assert rows(out) == uninterrupted
