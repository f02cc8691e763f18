#!/usr/bin/env python
"""Measurements of the runner's life cycle and of a refused federation. Not a test;
run by hand, one at a time (each starts a simulation), from this checkout or, with
``--repo DIR``, from another checkout of fl-drift (an older commit, for a before/after):

    FL_DATA_DIR=/path/to/data python bench/trust.py kill9               # processes left after kill -9
    FL_DATA_DIR=/path/to/data python bench/trust.py refusal --supernodes 200000
    python bench/trust.py settle --nodes 200000                          # in-process, no Flower run

- ``kill9``: starts ``run_simulation.py`` (MNIST, cnn-small, 2 clients) in a session of its
  own, waits until Ray's raylet runs in its process tree, sends it SIGKILL, waits
  ``--wait`` s (30) and lists the processes still carrying its FLWR_HOME and the Ray session
  folders of its Ray; then stops those processes by PID (this script's own clean-up).
- ``refusal``: one ``flwr run`` with ``num-supernodes = N`` on a private SuperLink; prints the
  seconds from the submission to the first ``fl-drift:`` refusal line and to ``flwr run``'s
  return, and the refusal line.
- ``settle``: Flower's own simulated-node registration (``_register_nodes``, main thread)
  beside ``fl_app.server.startup.settled_count`` on a client manager wrapped as Flower's
  legacy ServerApp wraps it: the registration's time alone and beside the reads, and when
  the count is known.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kill9(repo: Path, wait: float) -> None:
    from fl_app.common.procfs import descendants, environ_of, proc_table, processes_with_env

    out = Path(f"/tmp/fl-drift-bench-kill9-{os.getpid()}")
    argv = ["--strategy", "fedavg", "--dataset", "mnist", "--set", "model=cnn-small", "--set", "tracking=none",
            "--clients", "2", "--rounds", "50", "--out", str(out)]
    runner = subprocess.Popen([sys.executable, "run_simulation.py", *argv], cwd=repo, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and runner.poll() is None:
        tree = descendants([runner.pid])
        if any(name == "raylet" for _, name in tree.values()):
            break
        time.sleep(0.5)
    else:
        sys.exit("the runner ended or Ray never started")
    home = next(env["FLWR_HOME"] for pid in tree if "FLWR_HOME" in (env := environ_of(pid)))
    ray_roots = {environ_of(pid).get("RAY_TMPDIR", "/tmp") for pid in tree}
    pids = {str(pid) for pid in tree}
    print(f"runner PID {runner.pid}: {len(processes_with_env('FLWR_HOME', home))} processes with its FLWR_HOME; kill -9")
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    time.sleep(wait)
    left = processes_with_env("FLWR_HOME", home)
    names = proc_table()
    print(f"{len(left)} processes left {wait:g} s later: {sorted(names[p][2] for p in left if p in names)}")
    sessions = [s for root in ray_roots for s in Path(root, "ray").glob("session_2*") if s.name.rsplit("_", 1)[-1] in pids]
    print(f"{len(sessions)} Ray session folders of its Ray left: {[str(s) for s in sessions]}")
    for pid in left:  # this script's clean-up
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def refusal(repo: Path, supernodes: int) -> None:
    sys.path.insert(0, str(repo))
    from runner.launch import LocalSimulation

    first: list[float] = []
    line_seen: list[str] = []

    def on_line(line: str) -> None:
        if "fl-drift:" in line and not first:
            first.append(time.monotonic() - started)
            line_seen.append(line)

    with LocalSimulation(app_dir=repo) as sim:
        started = time.monotonic()
        sim.run({"model": "cnn-small", "num-server-rounds": 1, "tracking": "none", "results-dir": str(sim.home / "r")},
                num_supernodes=supernodes, on_line=on_line, timeout=900)
        returned = time.monotonic() - started
    print(f"num-supernodes={supernodes}: first fl-drift line after {first[0] if first else float('nan'):.1f} s,"
          f" flwr run returned after {returned:.1f} s")
    print(line_seen[0] if line_seen else "(no fl-drift line)")


def settle(nodes: int) -> None:
    from dataclasses import replace

    from flwr.server.compat.app_utils import start_update_client_manager_thread
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from fl_app.server.sampling import SeededClientManager
    from fl_app.server.startup import settled_count

    def factory():
        return vce_api.LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, vce_api.NoOpFederationManager(),
                                        vce_api.ObjectStoreFactory())

    started = time.monotonic()
    vce_api._register_nodes(nodes, factory())
    print(f"{nodes} nodes registered alone in {time.monotonic() - started:.1f} s")
    states = factory()
    run = replace(Run.create_empty(1), federation_id=NOOP_FEDERATION_ID)
    states.state().run_ids[1] = RunRecord(run=run)
    grid = InMemoryGrid(state_factory=states)
    grid._run = run
    manager = SeededClientManager(0)
    _, stop, _ = start_update_client_manager_thread(grid, manager)
    counted: dict[str, float] = {}
    started = time.monotonic()

    def server() -> None:
        counted["nodes"] = settled_count(manager, 2)
        counted["at"] = time.monotonic() - started

    reader = threading.Thread(target=server)
    reader.start()
    vce_api._register_nodes(nodes, states)
    registered = time.monotonic() - started
    reader.join()
    stop.set()
    print(f"beside settled_count: registered in {registered:.1f} s; count {counted['nodes']} known at {counted['at']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("kill9", "refusal", "settle"))
    parser.add_argument("--repo", type=Path, default=ROOT, help="the fl-drift checkout to run (default: this one)")
    parser.add_argument("--wait", type=float, default=30.0, help="kill9: seconds to wait after the kill")
    parser.add_argument("--supernodes", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=200_000)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.what == "kill9":
        kill9(args.repo.resolve(), args.wait)
    elif args.what == "refusal":
        refusal(args.repo.resolve(), args.supernodes)
    else:
        settle(args.nodes)


if __name__ == "__main__":
    main()
