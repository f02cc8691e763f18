"""README.md's set-up, run and documentation-site commands, run as printed (slow: `python -m
pytest -m slow`).

The commands are taken from the fenced blocks that README marks with ``<!-- test: NAME -->``.
Only sizes are changed (fewer rounds, nodes, clients and seeds: ``SHRINK``); each replaced
text must be in README, so the test fails when README's command changes under it. The run
blocks run in a copy of the checkout (its results and Flower home stay out of the working
tree) with the data of ``$FL_DATA_DIR``. The set-up block's ``pip install`` lines run in a new
virtual environment that sees this environment's installed packages (a ``.pth`` file), so
nothing is downloaded but the build backend; set ``FL_TEST_PIP_INDEX_URL`` to point pip at a
local index on an offline machine. The venv and test-suite lines of that block are not run
(the first needs a download of every dependency, the second is the suite itself).

Every process the commands start carries the copy's ``FLWR_HOME`` in its environment; after
the commands the test looks for such processes, stops them by PID and fails if there were any.
The documentation block's ``mkdocs serve`` runs on a free port and is stopped by its PID.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
import venv

import pytest

from tests.kit import ROOT, find_data_dir
from tests.kit_runs import base_env, copy_checkout, processes_with_env, readme_block, shrink, stop_pids

pytestmark = pytest.mark.slow


def test_readme_setup_install_lines(tmp_path):
    """Each `pip install` line (the lean install, then `.[dev]`), in order, in one new environment."""
    commands = [line.split("#", 1)[0].strip() for line in readme_block("setup").splitlines()
                if line.startswith("pip install")]
    assert commands[0] == "pip install -e ." and len(commands) == 2, commands
    checkout = copy_checkout(tmp_path / "checkout")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    parent = next(p for p in sys.path if p.endswith("site-packages"))
    (site / "_parent_env.pth").write_text(parent + "\n")
    env = base_env()
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(env_dir)
    if os.environ.get("FL_TEST_PIP_INDEX_URL"):
        env["PIP_INDEX_URL"] = os.environ["FL_TEST_PIP_INDEX_URL"]
    for command in commands:
        proc = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        assert proc.returncode == 0, command + "\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "Successfully installed" in proc.stdout and "fl-drift" in proc.stdout, command


def test_readme_run_commands_produce_metrics(tmp_path):
    data = find_data_dir()
    if not (data / "mnist" / "train.parquet").exists():
        pytest.skip(f"MNIST parquet not found at {data} (set FL_DATA_DIR)")
    checkout = copy_checkout(tmp_path / "checkout")
    port = 30000 + os.getuid() % 10000 * 2
    for p in (port, port + 1):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", p)) == 0:
                pytest.skip(f"port {p} of README's private SuperLink is in use (a SuperLink started from README?)")
    script = "set -euo pipefail\n" + shrink("run-flwr") + "\n" + shrink("run-runner")
    env = {**base_env(), "FL_DATA_DIR": str(data)}
    marker = f"FLWR_HOME={checkout / '.flwr_home'}"
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=1500, start_new_session=True, check=False)
    finally:
        time.sleep(3)  # the SuperLink stops its SuperExec on SIGTERM
        left = processes_with_env(marker)
        stop_pids(left)
    output = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, output
    assert not left, f"processes left running by README's commands (stopped now): {left}\n{output}"
    flwr_runs = list((checkout / "results").glob("fedprox-mnist-dirichlet-seed0-*/metrics.csv"))
    assert flwr_runs, output
    assert '"status": "finished:completed"' in proc.stdout, output  # flwr ls --format json: the real status
    assert (checkout / "results" / "cmp" / "runs" / "fedavg-seed0" / "metrics.csv").exists(), output
    assert (checkout / "results" / "cmp" / "runs" / "fedacg-seed0" / "metrics.csv").exists(), output
    assert (checkout / "results" / "cmp" / "accuracy.png").exists(), output


def test_readme_docs_block_serves_the_site(tmp_path):
    """The documentation block: its install line installs the ``docs`` extra that pyproject
    declares, and its ``mkdocs serve`` (on a free port) serves the README as the home page and
    the pages the README links."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    install, serve = (part.strip() for part in readme_block("docs").strip().split("&&"))
    assert install == 'pip install -e ".[docs]"'
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("mkdocs") for dep in extras["docs"]), extras["docs"]
    assert serve == "mkdocs serve"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(["bash", "-c", f"exec {serve} --dev-addr 127.0.0.1:{port}"], cwd=ROOT, env=base_env(),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        pages = {}
        for path in ("", "running/", "configuration/"):
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=5) as response:
                        pages[path] = response.read().decode()
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                    time.sleep(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert "One comparison" in pages[""] and "fedgam-mnist-dir03-accuracy.png" in pages[""]
    assert "pitfalls" in pages["running/"] and "General keys" in pages["configuration/"]


def test_readme_first_comparison_shows_a_difference(tmp_path):
    """The README's comparison, run verbatim (3 minutes on 2 idle cores): FedACG's paired
    difference from FedAvg has a 95% interval above 0, as the README says it prints; a first
    comparison whose methods tie teaches a newcomer nothing (it compared FedAvg with FedProx at
    mu 0.01: identical to 5e-5)."""
    data = find_data_dir()
    if not (data / "mnist" / "train.parquet").exists():
        pytest.skip(f"MNIST parquet not found at {data} (set FL_DATA_DIR)")
    checkout = copy_checkout(tmp_path / "checkout")
    env = {**base_env(), "FL_DATA_DIR": str(data)}
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + readme_block("run-runner")], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=1500, start_new_session=True, check=False)
    output = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, output
    with open(checkout / "results" / "cmp" / "comparison.csv", newline="") as f:
        rows = {row["method"]: row for row in csv.DictReader(f)}
    assert float(rows["fedacg"]["final_diff_ci_low"]) > 0, output
    assert "fedavg" in rows and int(rows["fedacg"]["paired_seeds"]) == 3, output
