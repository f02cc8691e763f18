"""fl-drift's Flower server (fl_app/server/server.py) beside Flower's own: a method's strategy is a
plain Flower ``Strategy``, so Flower's ``Server`` runs it too, and to the same global model."""

from __future__ import annotations

import numpy as np
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import Server, SimpleClientManager

from fl_app.node.node_client import NodeClient
from fl_app.registry import get_method, validate_config
from fl_app.server.server import DriftServer
from strategies.base import fedavg_kwargs
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy, fake_context, make_client

SIZES = (12, 20, 16, 24)


def run(server_cls, method: str, tmp_path, rounds: int = 2) -> list[np.ndarray]:
    """``rounds`` rounds of ``method`` on 4 in-process synthetic clients under ``server_cls``;
    the final global weights."""
    cfg = validate_config({"strategy": method, "dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0,
                           "min-fit-clients": 4, "min-available-clients": 4, "learning-rate": 0.1,
                           "batch-size": 8, "num-server-rounds": rounds, "checkpoint-every": 0,
                           "tracking": "none", "results-dir": str(tmp_path)})
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=1))
    strategy = get_method(method).strategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    manager = SimpleClientManager()
    for k, n in enumerate(SIZES):
        g = torch.Generator().manual_seed(10 + k)
        x, y = torch.randn(n, 60, generator=g), torch.randint(0, 10, (n,), generator=g)
        client = make_client(get_method(method).update, dict(cfg), x, y, fake_context())
        manager.register(Proxy(str(k), NodeClient(client)))
    if server_cls is DriftServer:
        server = DriftServer(client_manager=manager, strategy=strategy, cfg=cfg, run_dir=tmp_path / "run")
    else:
        server = Server(client_manager=manager, strategy=strategy)
    server.set_max_workers(1)  # in one process the clients share the cached model
    server.fit(rounds, timeout=None)
    return parameters_to_ndarrays(server.parameters)


def test_a_method_strategy_runs_under_flowers_own_server_to_the_same_model(tmp_path):
    """SCAFFOLD (extra arrays on the wire, server state) under Flower's ``Server`` and under
    ``DriftServer``: the same global model. Tolerance 1e-6 relative: both sum the replies in
    the order they come back (a set of futures), so the float sums may differ in order."""
    flower = run(Server, "scaffold", tmp_path / "flower")
    ours = run(DriftServer, "scaffold", tmp_path / "ours")
    assert len(flower) == len(ours)
    for a, b in zip(flower, ours):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    initial = get_weights(build_model("logreg", input_shape("synthetic"), seed=1))
    assert not np.allclose(flower[0], initial[0])  # it trained
    assert (tmp_path / "ours" / "run" / "metrics.csv").exists()


def test_the_server_reads_the_facts_the_method_registers_not_its_wrappers(tmp_path):
    """DP-FedAvg's strategy is one of Flower's DP wrappers, which declare none of the method's
    facts; the ServerApp hands the server the registered class, whose UNIFORM_MEAN weights the
    drift columns (read from the wrapper, they were n_k-weighted: same_metrics caught it)."""
    from fl_app.server_app import server_fn
    from strategies.dp_fedavg import DPFedAvgStrategy
    from tests.kit import fake_context

    components = server_fn(fake_context({"strategy": "dp-fedavg", "dataset": "synthetic", "model": "logreg",
                                         "results-dir": str(tmp_path), "tracking": "none"}))
    server = components.server
    assert not isinstance(server.strategy, DPFedAvgStrategy)
    assert server.method_class is DPFedAvgStrategy and DPFedAvgStrategy.UNIFORM_MEAN


def test_a_server_built_first_is_given_its_strategy_by_flowers_call(tmp_path):
    """``DriftServer`` without a strategy, then Flower's ``set_strategy``: the strategy runs,
    its client-local entries stay out of screening, its class is the method's when none was
    registered, and a resumed run restores the strategy's state from the checkpoint."""
    from fl_app.server.checkpoint import Checkpoint
    from strategies.base import DriftFedAvg

    class Kept(DriftFedAvg):
        screen_skip = (1, 3)
        state = None

        def set_state(self, state):
            self.state = state

    cfg = validate_config({"dataset": "synthetic", "model": "logreg", "tracking": "none",
                           "num-server-rounds": 3, "results-dir": str(tmp_path)})
    resumed = Checkpoint(1, [np.zeros(2)], {"h": [np.ones(2)]})
    server = DriftServer(client_manager=SimpleClientManager(), cfg=cfg, run_dir=tmp_path / "run", resume_from=resumed)
    strategy = Kept()
    server.set_strategy(strategy)
    assert server.strategy is strategy and server.method_class is Kept
    assert server.screening.skip == frozenset({1, 3})
    assert list(strategy.state) == ["h"] and np.array_equal(strategy.state["h"][0], np.ones(2))
