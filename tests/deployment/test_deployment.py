"""Real deployment on loopback: a TLS SuperLink, SuperNodes with node-local data, `flwr run`.

The same ServerApp/ClientApp as in simulation. The two deployments the default tests read run
in the background from the session's first test on (``deployment_runs``, tests/kit_runs.py:
a SuperNode killed mid-round, and nodes with their own file, a partition, a bad path and no
registration); the tests here read their results. The nodes read the session's MNIST sample
(``small_mnist`` in conftest.py): every ClientApp process decodes its data anew.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from fl_app.common.procfs import alive
from runner.deploy import LocalDeployment
from runner.results.report import read_metrics
from tests.kit_runs import DeployedRun, has_superlink, leftovers, missing_path

pytestmark = pytest.mark.skipif(not has_superlink(), reason="flower-superlink is not installed")


@pytest.fixture
def killed_run(deployment_runs) -> DeployedRun:
    return deployment_runs.killed.result()


def test_node_local_file_and_partition_and_bad_path(deployment_runs):
    """One node reads its own parquet file, one a partition; a node with a bad data-path fails
    its round with an error naming the path, and the run goes on without it. The SuperLink
    authenticates SuperNodes: the three registered ones join, an unregistered one is refused.

    The deployment (``run_mixed`` in tests/kit_runs.py) runs while the killed
    deployment waits for Flower's heartbeat timeout."""
    run = deployment_runs.mixed.result()
    rc, output, deployment = run.rc, run.output, run.deployment
    missing = missing_path(deployment.home.parent)
    assert rc == 0, output[-3000:] + run.logs
    rows = read_metrics(run.results)
    assert [r["round"] for r in rows] == [1]
    assert rows[0]["num_clients"] == 2 and rows[0]["num_failures"] == 1  # 3 sampled, not 4
    stranger = deployment.home / "supernode-3.log"
    assert "Failed to activate SuperNode" in stranger.read_text()
    # the ServerApp's log (streamed by `flwr run`) names the error and the path
    assert any("LocalDataError" in line and str(missing) in line for line in output.splitlines()), output


def test_tls_deployment_keeps_client_state(killed_run):
    """A stateful method on TLS SuperNodes: context.state lives on the SuperNodes between rounds
    (one of the three dies in round 1: ``test_supernode_killed_mid_round``)."""
    assert killed_run.rc == 0, killed_run.output[-3000:] + killed_run.logs
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


def test_supernode_killed_mid_round(killed_run, deployment_runs):
    """One of three SuperNodes dies (SIGKILL of its whole tree) while training in round 1.

    Flower's SuperLink marks it offline after two missed heartbeats (30 s apart) and answers
    its pending train message with a "Node Unavailable" error: round 1 aggregates the other
    two and counts one failure. Round 2 samples only the two nodes left (the sampler does not
    wait for min-available-clients again once the run has started), and the run finishes.
    (Killed in round 1 rather than later: each round of a deployment starts a ClientApp process
    per node, 15-20 s on the 2-core machine, and round 2 still follows the death.)"""
    rc, output, killer = killed_run.rc, killed_run.output, deployment_runs.killer
    assert rc == 0, output[-3000:] + killed_run.logs
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
def test_tls_superlink_refuses_keyless_and_plaintext_nodes_and_plaintext_runs(tmp_path, deployment_certs):
    """What an outsider without the operator's files can do against the README's SuperLink
    (TLS, SuperNode authentication): a SuperNode with no key, a plaintext SuperNode and a
    plaintext `flwr run` are all refused, and no process survives."""
    import tomli_w

    from runner.launch import APP_DIR
    from runner.processes import exe, free_port

    certs = deployment_certs
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
    assert survivors == [] and leftovers(deployment.home) == []
    assert submitted.returncode != 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
    assert "SuperNode authentication is enabled" in keyless.log.read_text()
    assert "Server disconnected without sending a response" in plain.log.read_text()
    assert "Connection to the SuperLink is unavailable" in submitted.stdout + submitted.stderr
    assert json.loads(listed.stdout)["runs"] == []  # nothing was submitted
