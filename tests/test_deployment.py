"""Real deployment on loopback: a TLS SuperLink, SuperNodes with node-local data, `flwr run`.

The same ServerApp/ClientApp as in simulation. Each deployment starts its own SuperLink and
SuperNodes (``runner/deploy.py``: private FLWR_HOME, free ports, no runtime dependency
installation) and checks that no process it started outlives it. The nodes read the session's
MNIST sample (``small_mnist`` in conftest.py): every ClientApp process decodes its data anew.
The killed-node deployment runs in a background thread while the mixed-nodes test runs its own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fl_app.common.procfs import alive, descendants, processes_with_env
from fl_app.registry import METHODS
from runner.deploy import TLS, LocalDeployment
from runner.results.report import read_metrics
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    shutil.which("flower-superlink") is None and not (Path(sys.executable).parent / "flower-superlink").exists(),
    reason="flower-superlink is not installed",
)

# SCAFFOLD keeps c_i in context.state; FedGAM-CV is the fallback with the same mechanism.
STATEFUL = "scaffold" if "scaffold" in METHODS else "fedgam-cv"
SMALL = {"dataset": "mnist", "model": "cnn-small", "batch-size": 32, "local-epochs": 1,
         "learning-rate": 0.05, "fraction-fit": 1.0, "checkpoint-every": 0}
TIMEOUT = 420


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> TLS:
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


def _leftovers(home: Path) -> list[int]:
    deadline = time.monotonic() + 15
    while (left := processes_with_env("FLWR_HOME", str(home))) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def deploy_and_run(tmp_path: Path, tls: TLS, nodes: list[Node], run_config: dict, data: Path, auth: bool = False,
                   watch=None, timeout: float = TIMEOUT):
    """Start SuperLink + SuperNodes (partitions from ``data``), run, stop everything; returns
    (rc, output, deployment).

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
    output = "\n".join(lines)
    if rc != 0:
        print(output[-6000:], deployment.logs()[-6000:])
    assert survivors == [], f"processes survived close(): {survivors}"
    assert _leftovers(deployment.home) == [], "a process with this test's FLWR_HOME survived"
    return rc, output, deployment


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


@dataclass
class KilledRun:
    rc: int
    output: str
    deployment: LocalDeployment
    killer: NodeKiller
    results: Path


def _run_killed(small_mnist: Path, tmp_path: Path, certs: TLS, killer: NodeKiller) -> KilledRun:
    nodes = [Node({"partition-id": i, "num-partitions": 20}) for i in range(3)]
    rc, output, deployment = deploy_and_run(
        tmp_path, certs, nodes,
        {"strategy": STATEFUL, "num-server-rounds": 2, "min-available-clients": 3, "run-name": "kill"},
        small_mnist, watch=killer,
    )
    return KilledRun(rc, output, deployment, killer, tmp_path / "results" / "kill")


@pytest.fixture(scope="module")
def killed_deployment(small_mnist, tmp_path_factory, certs):
    """Two rounds of SCAFFOLD (client state in context.state) on three TLS SuperNodes with
    MNIST partitions; one node dies (SIGKILL of its whole tree) while training in round 1.

    Two tests read this one deployment: the node's death and the state the surviving nodes keep
    over TLS (``killed_run``). It runs in a background thread from the module's first test on,
    so that the other deployment test can run while its SuperLink waits (about 60 s, with the
    machine idle) for the dead node's missed heartbeats. It has its own SuperLink, FLWR_HOME and
    ports, and stops every process it started before its result is read; the module waits for it.
    Yields (future of the ``KilledRun``, the ``NodeKiller``)."""
    killer = NodeKiller(2)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="killed-deployment")
    future = pool.submit(_run_killed, small_mnist, tmp_path_factory.mktemp("killed"), certs, killer)
    yield future, killer
    pool.shutdown(wait=True)


@pytest.fixture
def killed_run(killed_deployment) -> KilledRun:
    future, _ = killed_deployment
    return future.result()


def wait_for_the_kill(killed_deployment, timeout: float = 420) -> None:
    """Until the killed deployment's node is dead (its SuperLink then waits for the heartbeats)
    or that deployment has ended."""
    future, killer = killed_deployment
    deadline = time.monotonic() + timeout
    while not (killer.done.wait(1) or future.done()) and time.monotonic() < deadline:
        pass


def test_node_local_file_and_partition_and_bad_path(killed_deployment, small_mnist, tmp_path, certs):
    """One node reads its own parquet file, one a partition; a node with a bad data-path fails
    its round with an error naming the path, and the run goes on without it. The SuperLink
    authenticates SuperNodes: the three registered ones join, an unregistered one is refused.

    Starts once the killed deployment (``killed_deployment``) has killed its node, to run while
    that deployment waits for Flower's heartbeat timeout."""
    wait_for_the_kill(killed_deployment)
    table = pq.read_table(small_mnist / "mnist" / "train.parquet")
    rows = np.random.default_rng(0).choice(table.num_rows, size=256, replace=False)
    own = tmp_path / "node-data" / "mnist-own.parquet"
    own.parent.mkdir()
    pq.write_table(table.take(rows), own)
    missing = tmp_path / "node-data" / "does-not-exist.parquet"
    nodes = [Node({"data-path": str(own)}, "own"), Node({"partition-id": 3, "num-partitions": 20}, "part"),
             Node({"data-path": str(missing)}, "bad"),
             Node({"partition-id": 4, "num-partitions": 20}, "stranger", registered=False)]
    rc, output, deployment = deploy_and_run(
        tmp_path, certs, nodes,
        {"strategy": "fedavg", "num-server-rounds": 1, "min-available-clients": 3,
         "min-fit-clients": 3, "run-name": "mixed"},
        small_mnist, auth=True,
    )
    assert rc == 0, output[-3000:]
    rows = read_metrics(tmp_path / "results" / "mixed")
    assert [r["round"] for r in rows] == [1]
    assert rows[0]["num_clients"] == 2 and rows[0]["num_failures"] == 1  # 3 sampled, not 4
    stranger = deployment.home / "supernode-3.log"
    assert "Failed to activate SuperNode" in stranger.read_text()
    # the ServerApp's log (streamed by `flwr run`) names the error and the path
    assert any("LocalDataError" in line and str(missing) in line for line in output.splitlines()), output


def test_tls_deployment_keeps_client_state(killed_run):
    """A stateful method on TLS SuperNodes: context.state lives on the SuperNodes between rounds
    (one of the three dies in round 1: ``test_supernode_killed_mid_round``)."""
    assert killed_run.rc == 0, killed_run.output[-3000:]
    deployment = killed_run.deployment
    # TLS end to end: the SuperLink served HTTPS with our certificate, nodes verified it
    link_log = (deployment.home / "superlink.log").read_text()
    assert "--ssl-certfile" in link_log and "--insecure" not in link_log
    assert all("--root-certificates" in (deployment.home / f"supernode-{i}.log").read_text() for i in range(3))
    rows = read_metrics(killed_run.results)
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[0]["num_clients"] + rows[0]["num_failures"] == 3  # every node was asked to train in round 1
    # context.state on the SuperNodes: nothing carried into round 1, c_i carried into round 2 by
    # every node that trained (the two left: the killed node's round-1 reply never comes)
    assert rows[0]["state_arrays_in_max"] == 0
    assert rows[1]["num_clients"] == 2 and rows[1]["state_arrays_in_min"] > 0 and rows[1]["ci_norm_min"] > 0
    # the check above is only meaningful if we saw (and stopped) the whole process tree
    names = {name for _, name in deployment.seen.values()}
    assert any(n.startswith("flower-superex") for n in names), names  # comm: 15 chars


def test_supernode_killed_mid_round(killed_run):
    """One of three SuperNodes dies (SIGKILL of its whole tree) while training in round 1.

    Flower's SuperLink marks it offline after two missed heartbeats (30 s apart) and answers
    its pending train message with a "Node Unavailable" error: round 1 aggregates the other
    two and counts one failure. Round 2 samples only the two nodes left (the sampler does not
    wait for min-available-clients again once the run has started), and the run finishes.
    (Killed in round 1 rather than later: each round of a deployment starts a ClientApp process
    per node, 15-20 s on the 2-core machine, and round 2 still follows the death.)"""
    rc, output, killer = killed_run.rc, killed_run.output, killed_run.killer
    assert rc == 0, output[-3000:]
    assert killer.thread is not None and not killer.thread.is_alive()
    names = {name for _, name in killer.killed.values()}
    assert "flower-supernod" in names and any(n.startswith("flower-superex") for n in names), names
    assert alive(killer.killed) == []
    run_dir = killed_run.results
    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == [1, 2]
    # The dead node fails once (in round 1; in round 2 had it finished round 1 before dying),
    # and is not sampled after that: round 2 trains on the two nodes left.
    assert rows[0]["num_clients"] + rows[0]["num_failures"] == 3
    assert rows[0]["num_failures"] + rows[1]["num_failures"] == 1
    assert rows[1]["num_clients"] == 2
    assert all(math.isfinite(r["test_accuracy"]) for r in rows)
    assert (run_dir / "summary.json").exists()


@pytest.mark.slow  # about 60 s on the shared 2-core machine
def test_tls_superlink_refuses_keyless_and_plaintext_nodes_and_plaintext_runs(tmp_path, certs):
    """What an outsider without the operator's files can do against the README's SuperLink
    (TLS, SuperNode authentication): a SuperNode with no key, a plaintext SuperNode and a
    plaintext `flwr run` are all refused, and no process survives."""
    import tomli_w

    from runner.launch import APP_DIR
    from runner.processes import exe, free_port

    deployment = LocalDeployment(tls=certs, home=tmp_path / "flwr-home", supernode_auth=True)
    outsider = tmp_path / "outsider-home"  # the submitter's FLWR_HOME: a plaintext connection
    outsider.mkdir()
    node = [exe("flower-supernode"), "--max-retries", "2", "--max-wait-time", "20",
            "--node-config", "partition-id=0 num-partitions=2", "--host", "127.0.0.1"]
    try:
        deployment.start_superlink()
        (outsider / "config.toml").write_text(tomli_w.dumps(
            {"superlink": {"default": "plain", "plain": {"address": deployment.address, "insecure": True}}}))
        keyless = deployment._spawn("keyless", [*node, "--superlink", deployment.address, "--root-certificates",
                                                str(certs.ca), "--port", str(free_port())])
        plain = deployment._spawn("plain", [*node, "--superlink", deployment.address, "--insecure",
                                            "--port", str(free_port())])
        submitted = subprocess.run([exe("flwr"), "run", str(APP_DIR), "plain"], capture_output=True, text=True,
                                   env={**deployment.env, "FLWR_HOME": str(outsider)}, timeout=180)
        for refused in (keyless, plain):
            assert refused.proc.wait(timeout=180) != 0, refused.log.read_text()[-2000:]
        listed = subprocess.run([exe("flwr"), "ls", deployment.connection, "--format", "json"],
                                capture_output=True, text=True, env=deployment.env, cwd=deployment.home, timeout=120)
    finally:
        survivors = deployment.close()
    assert survivors == [] and _leftovers(deployment.home) == []
    assert submitted.returncode != 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
    assert "SuperNode authentication is enabled" in keyless.log.read_text()
    assert "Server disconnected without sending a response" in plain.log.read_text()
    assert "Connection to the SuperLink is unavailable" in submitted.stdout + submitted.stderr
    assert json.loads(listed.stdout)["runs"] == []  # nothing was submitted
