"""Every registered method trains two rounds end to end in this process: the method's strategy
inside ``DriftServer``'s steps (``RoundByRound``), its clients inside ``NodeClient``, each client loading its own
partition, Flower's sampling and the server's evaluation, with no Ray and no SuperLink.

What this leaves out is Flower's transport (serialising the messages, the Ray actors and the
ClientApp's mods); ``tests/runner/test_simulation.py`` runs that for a few methods that cover each
kind of server and client (plain FedAvg, client state, local BN entries, Flower's DP wrappers and
its server optimisers). A two-round simulation costs about 18 s of start-up per method; this
costs well under a second, so every method is checked on every test run.
"""

from __future__ import annotations

import math

import pytest
from flwr.app import Context, RecordDict
from flwr.common import ndarrays_to_parameters

from fl_app.node.drift_client import DriftClient
from fl_app.node.node_client import NodeClient
from fl_app.registry import METHODS, method_names, validate_config
from fl_app.server.sampling import SeededClientManager
from fl_app.server_app import evaluate_global
from strategies.base import fedavg_kwargs
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tasks.partitioning import PartitionSpec, load_test
from tests.kit import Proxy
from tests.kit_runs import NEEDS, SIMULATED
from tests.kit_server import RoundByRound

NODES = 4
# Left to the simulation test: dp-fedavg's client-side clipping is a ClientApp mod
# (fl_app/client_app.py), which only Flower's transport applies, and fedbn needs a BN model on
# MNIST images (cnn-bn on full MNIST took about 3 minutes with its clients one after another in one
# process; the simulation test trains lenet-bn on a 6,000-image sample). Those two runs are `slow`
# (the default run keeps its 10 minutes): by default their parts are checked in process
# (tests/methods/test_dp_fedavg.py, tests/methods/test_fedbn.py).
TRANSPORT_ONLY = {"dp-fedavg", "fedbn"}


def two_rounds(method: str, results_dir) -> tuple[list[dict], float]:
    """The metrics rows of a two-round run of ``method``, as the simulation test configures it,
    and the initial model's test loss."""
    cfg = validate_config({"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": 2,
                           "fraction-fit": 0.5, "learning-rate": 0.05, "results-dir": str(results_dir),
                           "run-name": method, "checkpoint-every": 0, "tracking": "none", **NEEDS.get(method, {})})
    registered = METHODS[method]
    model = build_model(cfg["model"], input_shape(cfg["dataset"]), seed=cfg["seed"])
    w0 = get_weights(model)
    test = list(load_test(PartitionSpec.from_config(cfg, NODES)))

    def evaluate_fn(server_round, arrays, config):
        return evaluate_global(model, test, arrays)

    inner = registered.strategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), evaluate_fn))
    strategy = RoundByRound(inner, cfg, results_dir / method, num_rounds=2, method_class=registered.strategy)
    manager = SeededClientManager(cfg["seed"])  # the run's sampling: the same clients whatever ran before
    for k in range(NODES):
        context = Context(run_id=0, node_id=k, node_config={}, state=RecordDict(), run_config={})
        manager.register(Proxy(str(k), NodeClient(DriftClient(registered.update, cfg, context, k, NODES))))
    parameters = strategy.initialize_parameters(manager)
    strategy.evaluate(0, parameters)
    for t in (1, 2):
        results = [(p, p.fit(ins, None, None)) for p, ins in strategy.configure_fit(t, parameters, manager)]
        new, _ = strategy.aggregate_fit(t, results, [])
        parameters = new if new is not None else parameters
        strategy.evaluate(t, parameters)
    return strategy.rows, strategy.initial["initial_loss"]


def test_every_method_is_checked_in_process_or_simulated():
    assert TRANSPORT_ONLY <= set(SIMULATED) and set(SIMULATED) <= set(method_names())


@pytest.mark.parametrize("method", [m for m in method_names() if m not in TRANSPORT_ONLY])
def test_every_method_trains_two_rounds_in_process(method, tmp_path):
    rows, initial_loss = two_rounds(method, tmp_path)
    assert len(rows) == 2
    for r in rows:
        assert math.isfinite(r["test_loss"]) and math.isfinite(r["train_loss"])
        assert r["num_clients"] == 2 and r["num_failures"] == 0 and r["num_rejected"] == 0
    assert rows[-1]["test_accuracy"] > 0.15  # 10 classes: above chance after 2 rounds
    assert rows[-1]["test_loss"] < initial_loss  # learnt: a diverging update (loss 4e10) passes the line above
