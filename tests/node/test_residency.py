"""What a simulation actor keeps across messages (one model per model name and device, each
partition's tensors on the device) changes no result: the same clients fitted through the
reused objects and through freshly built ones give identical replies and metrics.

Exact equality, not a tolerance: the reused model is a skeleton only (a round trains on tensors
made from the received arrays, ``evaluate`` overwrites every parameter and buffer with
``set_weights``), and the cached partition tensors are the same values, so the same operations
run on the same numbers in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fl_app.node.drift_client as drift_client
import fl_app.node.node_client as node
from fl_app.node.drift_client import DriftClient
from fl_app.registry import get_method, validate_config
from tasks import models, partitioning
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import fake_context

CLIENTS = 3
ROUNDS = 2
MODEL = {"fedavg": "logreg", "fedprox": "logreg", "scaffold": "logreg", "moon": "mlp", "fedntd": "mlp"}


def forget_everything() -> None:
    """What a freshly started process holds: no model built, no partition decoded or placed."""
    models._MODEL_CACHE.clear()
    drift_client.partition_on_device.cache_clear()
    partitioning.load_partition.cache_clear()
    partitioning.load_client_split.cache_clear()


def run_actor(method: str, fresh: bool, test_fraction: float = 0.0) -> list:
    """``ROUNDS`` rounds of ``CLIENTS`` clients served one after another in this process, a new
    client object per message as Flower builds it; with ``fresh`` every message starts from
    empty caches. Returns every reply and metric (timings left out)."""
    forget_everything()
    cfg = validate_config({"strategy": method, "dataset": "synthetic", "model": MODEL[method],
                           "learning-rate": 0.1, "batch-size": 32, "seed": 3,
                           "client-test-fraction": test_fraction})
    weights = get_weights(build_model(cfg["model"], input_shape("synthetic"), seed=0))
    contexts = [fake_context(cfg) for _ in range(CLIENTS)]
    out = []
    for rnd in range(1, ROUNDS + 1):
        replies = []
        for pid in range(CLIENTS):
            if fresh:
                forget_everything()
            client = DriftClient(get_method(method).update, cfg, contexts[pid], pid, CLIENTS)
            extra = [np.zeros_like(a) for a in weights] if method == "scaffold" else []
            reply, n, metrics = node.NodeClient(client).fit([a.copy() for a in weights] + extra, {"server-round": rnd})
            replies.append(reply)
            out.append((reply, n, {k: v for k, v in metrics.items() if not k.endswith("_seconds")}))
            if test_fraction:  # the global model scored on the client's local test split
                out.append(node.NodeClient(client).evaluate([a.copy() for a in weights], {"server-round": rnd}))
        weights = [np.mean([r[i] for r in replies], axis=0).astype(weights[i].dtype) for i in range(len(weights))]
    return out


@pytest.mark.parametrize("method", sorted(MODEL))
def test_reused_model_and_resident_data_equal_fresh_ones(method):
    reused, fresh = run_actor(method, fresh=False), run_actor(method, fresh=True)
    assert len(reused) == len(fresh) == CLIENTS * ROUNDS
    assert_same(reused, fresh)


def test_local_test_split_reused_equals_fresh():
    """With ``client-test-fraction`` the train and local test splits are placed once per
    process too; replies and local evaluations equal those of fresh processes."""
    reused, fresh = run_actor("fedavg", fresh=False, test_fraction=0.25), run_actor("fedavg", True, 0.25)
    assert len(reused) == len(fresh) == 2 * CLIENTS * ROUNDS
    assert_same(reused, fresh)


def assert_same(reused: list, fresh: list) -> None:
    for (ra, na, ma), (rb, nb, mb) in zip(reused, fresh):
        assert na == nb and ma == mb
        if isinstance(ra, float):  # an evaluation: (loss, examples, metrics)
            assert ra == rb
            continue
        assert len(ra) == len(rb)
        for a, b in zip(ra, rb):
            np.testing.assert_array_equal(a, b)


def test_partition_is_placed_once_per_process():
    """The second client object of a partition gets the very tensors the first one used."""
    forget_everything()
    cfg = validate_config({"strategy": "fedavg", "dataset": "synthetic", "model": "logreg"})
    first = DriftClient(get_method("fedavg").update, cfg, fake_context(cfg), 1, CLIENTS).data
    second = DriftClient(get_method("fedavg").update, cfg, fake_context(cfg), 1, CLIENTS).data
    assert first[0] is second[0] and first[1] is second[1]
    assert first[0].device == models.default_device()
    assert isinstance(first[0], torch.Tensor)


def test_local_test_split_is_placed_once_per_process(monkeypatch):
    """On a device other than the CPU (``meta`` stands in for a GPU: ``.to`` makes a new tensor
    there, as a host-to-device copy does), the second client object of a partition gets the
    very train and local test tensors the first one used."""
    forget_everything()
    monkeypatch.setattr(drift_client, "default_device", lambda: torch.device("meta"))
    cfg = validate_config({"strategy": "fedavg", "dataset": "synthetic", "model": "logreg",
                           "client-test-fraction": 0.25})
    first = DriftClient(get_method("fedavg").update, cfg, fake_context(cfg), 1, CLIENTS)
    second = DriftClient(get_method("fedavg").update, cfg, fake_context(cfg), 1, CLIENTS)
    assert first.data[0].device.type == "meta" and first.test_data[0].device.type == "meta"
    assert first.data[0] is second.data[0] and first.test_data[0] is second.test_data[0]
    assert len(first.test_data[0]) > 0 and first.test_data[0] is not first.data[0]
    forget_everything()
