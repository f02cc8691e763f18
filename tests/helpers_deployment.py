"""The two real deployments of tests/deployment/test_deployment.py, started in the background at the
session's first test (``deployment_runs``) so that they run while other tests do.

Each deployment starts its own SuperLink and SuperNodes on loopback (``runner/deploy.py``: TLS,
private FLWR_HOME, free ports, no runtime dependency installation) and checks that no process it
started outlives it. The killed-node deployment spends about 60 s idle, waiting for Flower's
heartbeat timeout (30 s interval, two missed: constants of Flower with no public setting), and
the mixed-nodes deployment runs in that wait. Run in the foreground, the two took about 2 minutes
of the default run (115 s and more at load 2-3); most of that is waiting and one-core process
start-ups, which the 2-core machine overlaps with the tests that run meanwhile, on one core.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fl_app.common.procfs import descendants, processes_with_env
from fl_app.registry import METHODS
from runner.deploy import TLS, LocalDeployment

ROOT = Path(__file__).resolve().parent.parent
# SCAFFOLD keeps c_i in context.state; FedGAM-CV is the fallback with the same mechanism.
STATEFUL = "scaffold" if "scaffold" in METHODS else "fedgam-cv"
SMALL = {"dataset": "mnist", "model": "cnn-small", "batch-size": 32, "local-epochs": 1,
         "learning-rate": 0.05, "fraction-fit": 1.0, "checkpoint-every": 0}
TIMEOUT = 420


def has_superlink() -> bool:
    return shutil.which("flower-superlink") is not None or (Path(sys.executable).parent / "flower-superlink").exists()


@pytest.fixture(scope="session")
def deployment_certs(tmp_path_factory) -> TLS:
    """scripts/make_certs.py, as a user runs it: a CA and a SuperLink certificate for 127.0.0.1."""
    out = tmp_path_factory.mktemp("certs")
    keys = [arg for name in ("own", "part", "bad", "stranger") for arg in ("--node-key", name)]
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_certs.py"), "--out", str(out),
                    "--host", "127.0.0.1", *keys], check=True, capture_output=True)
    return TLS.in_dir(out)


@dataclass
class Node:
    config: dict
    key: str | None = None  # supernode-<key>.key from make_certs.py --node-key
    registered: bool = True


@dataclass
class DeployedRun:
    """A finished deployment's exit code, streamed output and (closed) ``LocalDeployment``;
    ``results``: its run folder; ``logs``: its processes' logs (for a failure's message)."""
    rc: int
    output: str
    deployment: LocalDeployment
    results: Path
    logs: str


def leftovers(home: Path) -> list[int]:
    deadline = time.monotonic() + 15
    while (left := processes_with_env("FLWR_HOME", str(home))) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def deploy_and_run(tmp_path: Path, tls: TLS, nodes: list[Node], run_config: dict, data: Path, auth: bool = False,
                   watch=None, timeout: float = TIMEOUT) -> DeployedRun:
    """Start SuperLink + SuperNodes (partitions from ``data``), run ``run_config`` (its
    ``run-name`` under ``tmp_path / "results"``), stop everything.

    ``watch(deployment, line)`` sees every streamed line of the run (e.g. to kill a node)."""
    deployment = LocalDeployment(tls=tls, home=tmp_path / "flwr-home", supernode_auth=auth,
                                 extra_env={"FL_DATA_DIR": str(data)})
    lines: list[str] = []
    try:
        deployment.start_superlink()
        for node in nodes:
            key = None
            if node.key is not None:
                key = tls.ca.parent / f"supernode-{node.key}.key"
                if node.registered:
                    deployment.register_supernode(key.with_suffix(".pub"))
            deployment.add_supernode(node.config, auth_key=key, wait=node.registered)

        def on_line(line: str) -> None:
            lines.append(line)
            if watch is not None:
                watch(deployment, line)

        rc = deployment.run({**SMALL, "results-dir": str(tmp_path / "results"), **run_config},
                            on_line=on_line, timeout=timeout)
    finally:
        survivors = deployment.close()
    assert survivors == [], f"processes survived close(): {survivors}"
    assert leftovers(deployment.home) == [], "a process with this deployment's FLWR_HOME survived"
    logs = "" if rc == 0 else deployment.logs()[-6000:]
    return DeployedRun(rc, "\n".join(lines), deployment, tmp_path / "results" / run_config["run-name"], logs)


class NodeKiller:
    """Once the server logs that the nodes told it their partitions (each in a ClientApp process
    of its own), SIGKILLs SuperNode ``index`` and everything under it (SuperExec, ClientApp) as
    soon as its next ClientApp, round 1's training, runs: a device that dies mid-training
    without telling the SuperLink."""

    def __init__(self, index: int):
        self.index = index
        self.thread: threading.Thread | None = None
        self.killed: dict[int, tuple[str, str]] = {}
        self.done = threading.Event()  # set once the node's tree is killed

    def __call__(self, deployment: LocalDeployment, line: str) -> None:
        if self.thread is None and "nodes for their partition in" in line:
            node = deployment.supernodes[self.index]
            self.thread = threading.Thread(target=self._kill, args=(node.proc.pid,), daemon=True)
            self.thread.start()

    def _kill(self, pid: int) -> None:
        before = set(descendants([pid]))
        deadline = time.monotonic() + 60  # else kill it anyway, between tasks
        while time.monotonic() < deadline:
            tree = descendants([pid])
            if any(name.startswith("flwr-clientapp") and p not in before for p, (_, name) in tree.items()):
                time.sleep(0.5)
                break
            time.sleep(0.1)
        self.killed = descendants([pid])
        for child in self.killed:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.done.set()


def run_killed(small_mnist: Path, tmp_path: Path, certs: TLS, killer: NodeKiller) -> DeployedRun:
    """Two rounds of SCAFFOLD (client state in context.state) on three TLS SuperNodes with
    MNIST partitions; ``killer`` kills node 2 while it trains in round 1."""
    nodes = [Node({"partition-id": i, "num-partitions": 20}) for i in range(3)]
    return deploy_and_run(
        tmp_path, certs, nodes,
        {"strategy": STATEFUL, "num-server-rounds": 2, "min-available-clients": 3, "run-name": "kill"},
        small_mnist, watch=killer,
    )


def run_mixed(small_mnist: Path, tmp_path: Path, certs: TLS, after: tuple[Future, NodeKiller]) -> DeployedRun:
    """One round of FedAvg with SuperNode authentication: a node reading its own parquet file,
    one a partition, one with a data-path that does not exist, and an unregistered one.

    Starts once the killed deployment (``after``) has killed its node (or ended), to run while
    that deployment waits for Flower's heartbeat timeout and not in its busy start-up."""
    killed, killer = after
    deadline = time.monotonic() + TIMEOUT
    while not (killer.done.wait(1) or killed.done()) and time.monotonic() < deadline:
        pass
    table = pq.read_table(small_mnist / "mnist" / "train.parquet")
    rows = np.random.default_rng(0).choice(table.num_rows, size=256, replace=False)
    own = tmp_path / "node-data" / "mnist-own.parquet"
    own.parent.mkdir()
    pq.write_table(table.take(rows), own)
    nodes = [Node({"data-path": str(own)}, "own"), Node({"partition-id": 3, "num-partitions": 20}, "part"),
             Node({"data-path": str(missing_path(tmp_path))}, "bad"),
             Node({"partition-id": 4, "num-partitions": 20}, "stranger", registered=False)]
    return deploy_and_run(
        tmp_path, certs, nodes,
        {"strategy": "fedavg", "num-server-rounds": 1, "min-available-clients": 3,
         "min-fit-clients": 3, "run-name": "mixed"},
        small_mnist, auth=True,
    )


def missing_path(tmp_path: Path) -> Path:
    """The bad node's data-path: a file that does not exist."""
    return tmp_path / "node-data" / "does-not-exist.parquet"


@dataclass
class DeploymentRuns:
    """The futures of the two deployments (``DeployedRun`` each) and the killed one's killer."""
    killed: Future
    killer: NodeKiller
    mixed: Future


@pytest.fixture(scope="session")
def deployment_runs(small_mnist, tmp_path_factory, deployment_certs):
    """Both deployments, each in a thread of its own, started at the first request (the
    session's first test, ``start_deployments_early`` in conftest.py, when a selected test reads
    them); the session waits for both at its end. Each has its own SuperLink, FLWR_HOME and ports
    and stops every process it started before its result is read."""
    killer = NodeKiller(2)
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="deployment")
    killed = pool.submit(run_killed, small_mnist, tmp_path_factory.mktemp("killed"), deployment_certs, killer)
    mixed = pool.submit(run_mixed, small_mnist, tmp_path_factory.mktemp("mixed"), deployment_certs, (killed, killer))
    yield DeploymentRuns(killed, killer, mixed)
    pool.shutdown(wait=True)
