"""A cohort run killed with SIGKILL and resumed equals the uninterrupted run.

The runner (``run_simulation.py``) runs SCAFFOLD (its clients keep c_i: the cohort node's rows,
journalled each round under the run folder), FedMoSWA (c_i too, its server's momentum m with
its first-mean start, and an in-round rate decay, fedmoswa-rho = 0.1), and the other methods of
``METHODS`` (each with the state it keeps: the server's Delta, c and c_i, a client's last global or
local model, the last round's calibration), as one cohort node on the CPU; the second copy of
the run is killed with ``kill -9`` while its rounds go on, at whatever point of a round the
signal lands (a journal file or checkpoint half written is never read: both are atomic), then
continued with ``run_simulation.py --resume``. Every metrics.csv row but the timings equals the
uninterrupted run's: the clients' state came back from the journal as of the checkpoint's round,
the journal's files of the rounds after it were dropped. SCAFFOLD runs once more with ``reject``
leaving an attacker's reply out: its clients' copies from before each round come back with the
rows, and the server's last counted round of each client with the checkpoint.
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

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 12
ARGS = ["--dataset", "synthetic", "--rounds", str(ROUNDS), "--clients", "6",
        "--fraction", "0.5", "--set", "model=logreg", "--set", "execution=cohort", "--set", "tracking=none",
        "--quiet"]
METHODS = {
    "scaffold": [],
    "fedmoswa": ["--set", "fedmoswa-rho=0.1"],
    "fedcm": [],  # the server's Delta, sent down each round, from the checkpoint
    "mofedsam": [],
    "fedgamma": [],  # c_i in the journal, c at the server
    "fedlesam": ["--set", "fedlesam-direction=client"],  # the client's last received global model
    "fedswa": [],
    "fedinit": [],  # the client's last local model
    "fedgela": ["--set", "model=mlp"],  # a model with a body: the ETF head is fixed on it
    "ccvr": ["--set", "model=mlp"],  # the calibration round (the last) runs after the resume
    # partition 0 scales its update and reject leaves it out, so every client keeps the copy from
    # before each round and the rounds with its rows, and partition 0 goes back each time it is
    # sampled: the journal restores all of it, the checkpoint each client's last counted round
    "scaffold+reject": ["--set", "screening=reject", "--set", "inject-faults=scale:0:100"],
}
CLIENT_STATE = {"scaffold", "fedmoswa", "fedgamma", "fedlesam", "fedinit", "scaffold+reject"}
"""The methods above whose clients keep state between rounds: their cohort node journals it."""


def metrics_rows(out: Path) -> list[dict]:
    """The run's metrics.csv rows, timing columns left out (no two runs share them)."""
    files = list(out.rglob("metrics.csv"))
    if not files:
        return []
    with files[0].open(newline="") as f:
        return [{k: v for k, v in row.items() if "seconds" not in k and k != "ray_node"} for row in csv.DictReader(f)]


def runner(*argv: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "run_simulation.py", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_a_cohort_run_killed_and_resumed_equals_the_uninterrupted_run(method, tmp_path):
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0"}
    args = ["--strategy", method.split("+")[0], *ARGS, *METHODS[method]]
    full = runner(*args, "--out", str(tmp_path / "full"), env=env)
    assert full.wait(timeout=900) == 0, full.stdout.read()
    want = metrics_rows(tmp_path / "full")
    assert want and want[-1]["round"] == str(ROUNDS)

    killed = runner(*args, "--out", str(tmp_path / "cut"), env=env)
    deadline = time.monotonic() + 600
    while len(metrics_rows(tmp_path / "cut")) < 4 and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert killed.poll() is None, f"the run ended before the kill: {killed.stdout.read()}"
    os.kill(killed.pid, signal.SIGKILL)  # kill -9 of the runner: its watchdog stops the rest
    killed.wait()
    cut = metrics_rows(tmp_path / "cut")
    assert 4 <= len(cut) < len(want), f"killed after {len(cut)} rows of {len(want)}"
    journal = list((tmp_path / "cut").rglob("client-rows/node-0/round-*.npz"))
    assert bool(journal) == (method in CLIENT_STATE), f"journal of the clients' rows: {journal[:1]}"

    deadline = time.monotonic() + 60  # the dead runner's folder lock is taken over once its processes are gone
    while True:
        resumed = runner("--resume", str(tmp_path / "cut"), env=env)
        code = resumed.wait(timeout=900)
        output = resumed.stdout.read()
        if code != 2 or "in use by another run_simulation.py" not in output or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert code == 0, output
    got = metrics_rows(tmp_path / "cut")
    assert [r["round"] for r in got] == [r["round"] for r in want]
    for mine, theirs in zip(got, want):
        assert mine == theirs, f"round {theirs['round']}"
