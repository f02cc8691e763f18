"""run_simulation.py --ray-address: a simulation on a running 2-node Ray cluster (both nodes on
127.0.0.1, 1 CPU each, each with its own temp dir) uses both nodes, and afterwards no process
of the cluster or of the run is left. The cluster is started here with ``ray start --block``
(so its processes stay in our process tree) and stopped by PID, never with ``ray stop``
(which kills Ray processes by name, other users' included)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from fl_app.common.procfs import processes_with_env
from fl_app.server.placement import read_ray_nodes
from runner.processes import Managed, exe, free_port, stop_processes
from runner.results.report import read_metrics, read_summary
from tests.kit import ROOT

MARK = "FL_DRIFT_TEST_MARK"


def start_node(env: dict, temp_dir: Path, log: Path, head_port: int | None = None,
               address: str | None = None) -> Managed:
    """One Ray node on 127.0.0.1 with 1 CPU and its own ports and temp dir (the head when
    ``head_port`` is given, else joining ``address``). ``--block`` keeps ``ray start`` in the
    foreground, so every process it spawns is its descendant."""
    command = [exe("ray"), "start", "--block", "--num-cpus", "1", "--num-gpus", "0",
               "--object-store-memory", str(100 * 2**20), "--node-ip-address", "127.0.0.1",
               "--temp-dir", str(temp_dir), "--disable-usage-stats",
               "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port()),
               "--runtime-env-agent-port", str(free_port())]
    if head_port is not None:
        command += ["--head", "--port", str(head_port), "--ray-client-server-port", str(free_port()),
                    "--include-dashboard", "false"]
    else:
        command += ["--address", str(address)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Managed(log.stem, proc, log)


def wait_for_nodes(env: dict, address: str, count: int, timeout: float = 90) -> list[str]:
    """Node ids of the cluster once ``count`` nodes are alive (a short-lived driver asks)."""
    probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
             "print(' '.join(n['NodeID'] for n in ray.nodes() if n['Alive']))")
    deadline = time.monotonic() + timeout
    ids: list[str] = []
    while time.monotonic() < deadline:
        proc = subprocess.run([sys.executable, "-c", probe, address], env=env, capture_output=True, text=True, check=False,
                              timeout=60)
        ids = proc.stdout.split()
        if proc.returncode == 0 and len(ids) >= count:
            return ids
        time.sleep(2)
    raise AssertionError(f"the Ray cluster at {address} has {len(ids)} of {count} nodes after {timeout}s")


def survivors(mark: str, wait: float = 20) -> list[int]:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        left = processes_with_env(MARK, mark)
        if not left:
            return []
        time.sleep(0.5)
    return left


@pytest.mark.slow
def test_simulation_uses_both_nodes_of_a_ray_cluster(shared_data, tmp_path):
    if not Path(exe("ray")).exists():
        pytest.skip("the ray command is not installed")
    cluster_mark, run_mark = uuid.uuid4().hex, uuid.uuid4().hex
    env = {**os.environ, MARK: cluster_mark, "RAY_DISABLE_USAGE_STATS": "1"}
    env.pop("RAY_ADDRESS", None)
    head_port = free_port()
    address = f"127.0.0.1:{head_port}"
    # short paths: Ray's unix socket paths must stay under 107 characters
    temps = [Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp")) for _ in range(2)]
    nodes: list[Managed] = []
    try:
        nodes.append(start_node(env, temps[0], tmp_path / "head.log", head_port=head_port))
        wait_for_nodes(env, address, 1)
        nodes.append(start_node(env, temps[1], tmp_path / "worker.log", address=address))
        node_ids = wait_for_nodes(env, address, 2)
        for node in nodes:
            node.refresh()

        out = tmp_path / "out"
        run = subprocess.run(
            [sys.executable, "run_simulation.py", "--ray-address", address, "--strategy", "fedavg",
             "--dataset", "mnist", "--rounds", "2", "--clients", "4", "--fraction", "1.0",
             "--data-dir", str(shared_data), "--set", "model='cnn-small'", "--out", str(out), "--quiet"],
            cwd=ROOT, env={**env, MARK: run_mark}, capture_output=True, text=True, timeout=600, check=False,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        run_dir = out / "runs" / "fedavg-seed0"
        rows = read_metrics(run_dir)
        assert [r["round"] for r in rows] == [1, 2] and all(r["num_clients"] == 4 for r in rows)
        assert read_summary(run_dir)["final_accuracy"] > 0.1
        used = read_ray_nodes(run_dir)
        assert sorted(used) == [1, 2]
        assert set().union(*used.values()) == set(node_ids), (used, node_ids)  # fits ran on both nodes
        assert max(r["num_ray_nodes"] for r in rows) == 2
        # the runner stopped its own processes only: the cluster is still up
        assert all(node.proc.poll() is None for node in nodes)
        assert survivors(run_mark) == [], "processes of the run survived it"
    finally:
        for node in reversed(nodes):
            node.refresh()
        left = stop_processes(list(reversed(nodes)))
        stragglers = survivors(cluster_mark)
        for pid in stragglers:  # ours (they carry this test's mark); never by name
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        for temp in temps:
            subprocess.run(["rm", "-rf", str(temp)], check=False)
    assert left == [] and stragglers == [], f"cluster processes survived: {left} {stragglers}"
