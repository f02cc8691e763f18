"""Resume in one process: the ServerApp's ``server_fn`` and the ClientApp's ``client_fn`` driven by
Flower's own server loop (``flwr.server.Server``), with no Ray and no SuperLink
(``serve_in_process`` in tests/kit.py; its rounds equal a simulation's to the last digit).

A run crashes after round 3 (``inject-faults = "crash-after:3"``), a new server and new nodes
(empty ``context.state``) resume it from its checkpoint, and rounds 4-6 must equal those of an
uninterrupted run: the global model, the server's strategy state, the sampler's draws and the
clients' state mirrored on disk all come back. What this leaves out is Flower's transport and the
Ray actors; ``tests/runner/test_reliability.py`` resumes SCAFFOLD (server and client state) through
them, on a fresh SuperLink.
"""

from __future__ import annotations

import pytest

from runner.results.report import read_metrics, read_summary
from tests.kit import serve_in_process
from tests.kit_runs import NEEDS

NODES = 4
# stateless, client and server state (control variates, FedDyn's h and g_k), a server optimiser; FedSWA's
# in-round rate schedule and lookahead server; FedMoSWA's c_i and momentum m (with its first-mean start);
# a fixed head the clients reset (FedGELA), a last round that calibrates the head (CCVR)
METHODS = ["fedavg", "scaffold", "feddyn", "fedyogi", "fedswa", "fedmoswa", "fedgela", "ccvr"]
CLIENT_STATE = ("scaffold", "feddyn", "fedmoswa")


def serve(run_config: dict) -> None:
    serve_in_process(run_config, NODES)


@pytest.mark.parametrize("method", METHODS)
def test_resume_in_process_matches_uninterrupted(method, tmp_path):
    cfg = {"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": 6,
           "fraction-fit": 0.5, "learning-rate": 0.05, "tracking": "none", "results-dir": str(tmp_path),
           **NEEDS.get(method, {})}
    serve({**cfg, "run-name": "full"})
    full = read_metrics(tmp_path / "full")
    assert [r["round"] for r in full] == [1, 2, 3, 4, 5, 6]

    with pytest.raises(RuntimeError, match="injected crash after round 3"):
        serve({**cfg, "run-name": "cut", "inject-faults": "crash-after:3"})
    assert read_summary(tmp_path / "cut") is None
    assert len(read_metrics(tmp_path / "cut")) == 3
    if method in CLIENT_STATE:  # client state was mirrored for the resume
        assert any((tmp_path / "cut" / "client-state").rglob("round-*.npz"))

    serve({**cfg, "run-name": "cut", "resume": True})  # new server, new nodes: nothing kept in memory
    resumed = read_metrics(tmp_path / "cut")
    assert [r["round"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(full[3:], resumed[3:]):
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-6)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    state_columns = [k for k in full[3] if k.startswith("state_arrays_in")]
    assert bool(state_columns) == (method in CLIENT_STATE)  # methods with client state report it
    for a, b in zip(full[3:], resumed[3:]):  # counted after the mirror's state is restored
        assert {k: b[k] for k in state_columns} == {k: a[k] for k in state_columns}, a["round"]
    assert read_summary(tmp_path / "cut")["rounds"] == 6
    assert not (tmp_path / "cut" / "client-state").exists()  # removed once the run finished
