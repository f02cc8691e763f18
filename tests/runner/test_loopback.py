"""A local simulation is reachable from its own machine only: while a run trains, no process of
its tree (the SuperLink, SuperExec, the simulation's Ray driver, Ray's GCS, raylet, agents and
the ClientApp actors) listens on an address outside 127.0.0.0/8 (by default Ray's
daemons listen on every interface and register the node by the machine's external address).
The sockets are read from /proc (``fl_app.common.procfs.listening_sockets``) every 0.2 s while the run
lasts, so that a process that listens for a moment is seen too."""

from __future__ import annotations

import ipaddress
import threading

import pytest

from fl_app.common.procfs import listening_sockets, processes_with_env


def sample_sockets(home: str, stop: threading.Event, seen: set) -> None:
    """Add (command name, address, port) of every listening socket of the processes that carry
    ``FLWR_HOME=home`` to ``seen``, every 0.2 s until ``stop`` is set."""
    while not stop.wait(0.2):
        seen.update((name, address, port) for _, name, address, port in
                    listening_sockets(processes_with_env("FLWR_HOME", home)))


@pytest.mark.slow  # 27 s idle: a live simulation sampled for its sockets
def test_a_local_simulation_listens_on_loopback_only(sim, mnist_sample, tmp_path):
    """The session's simulation (``sim``), as ``run_simulation.py`` starts it: a run of 2 rounds
    and 2 nodes."""
    data = mnist_sample(600, 100)
    seen: set[tuple[str, str, int]] = set()
    stop = threading.Event()
    sampler = threading.Thread(target=sample_sockets, args=(str(sim.home), stop, seen), daemon=True)
    sampler.start()
    try:
        rc = sim.run({"model": "cnn-small", "dataset": "mnist", "data-dir": str(data), "num-server-rounds": 2,
                      "partitioner": "iid", "tracking": "none", "results-dir": str(tmp_path), "run-name": "r"},
                     num_supernodes=2, timeout=300)
    finally:
        stop.set()
        sampler.join()
    assert rc == 0 and (tmp_path / "r" / "metrics.csv").exists()
    names = {name for name, _, _ in seen}
    assert {"flower-superlin", "gcs_server", "raylet"} <= names, f"not every daemon was seen listening: {sorted(seen)}"
    outside = sorted(s for s in seen if not ipaddress.ip_address(s[1]).is_loopback)
    assert outside == [], f"listening outside 127.0.0.0/8 and ::1: {outside}"
