"""What a simulation actor keeps across messages (one model per model name and device, each
partition's tensors on the device) changes no result: the same clients fitted through the
reused objects and through freshly built ones give identical replies and metrics.

Exact equality, not a tolerance: the reused model has every parameter and buffer overwritten
by ``set_weights`` before use, and the cached partition tensors are the same values, so the
same operations run on the same numbers in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import clients.base
import fl_app.node.node_client as node
from fl_app.config import validate_config
from fl_app.registry import get_method
from tasks import models, partitioning
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.conftest import fake_context

CLIENTS = 3
ROUNDS = 2
MODEL = {"fedavg": "logreg", "fedprox": "logreg", "scaffold": "logreg", "moon": "mlp", "fedntd": "mlp"}


def forget_everything() -> None:
    """What a freshly started process holds: no model built, no partition decoded or placed."""
    models._MODEL_CACHE.clear()
    clients.base.partition_on_device.cache_clear()
    partitioning.load_partition.cache_clear()


def run_actor(method: str, fresh: bool) -> list:
    """``ROUNDS`` rounds of ``CLIENTS`` clients served one after another in this process, a new
    client object per message as Flower builds it; with ``fresh`` every message starts from
    empty caches. Returns every reply and metric (timings left out)."""
    forget_everything()
    cfg = validate_config({"strategy": method, "dataset": "synthetic", "model": MODEL[method],
                           "learning-rate": 0.1, "batch-size": 8, "seed": 3})
    weights = get_weights(build_model(cfg["model"], input_shape("synthetic"), seed=0))
    contexts = [fake_context(cfg) for _ in range(CLIENTS)]
    out = []
    for rnd in range(1, ROUNDS + 1):
        replies = []
        for pid in range(CLIENTS):
            if fresh:
                forget_everything()
            client = get_method(method).client(cfg, contexts[pid], pid, CLIENTS)
            extra = [np.zeros_like(a) for a in weights] if method == "scaffold" else []
            reply, n, metrics = node.NodeClient(client).fit([a.copy() for a in weights] + extra, {"server-round": rnd})
            replies.append(reply)
            out.append((reply, n, {k: v for k, v in metrics.items() if k != "fit_seconds"}))
        weights = [np.mean([r[i] for r in replies], axis=0).astype(weights[i].dtype) for i in range(len(weights))]
    return out


@pytest.mark.parametrize("method", sorted(MODEL))
def test_reused_model_and_resident_data_equal_fresh_ones(method):
    reused, fresh = run_actor(method, fresh=False), run_actor(method, fresh=True)
    assert len(reused) == len(fresh) == CLIENTS * ROUNDS
    for (ra, na, ma), (rb, nb, mb) in zip(reused, fresh):
        assert na == nb and ma == mb
        assert len(ra) == len(rb)
        for a, b in zip(ra, rb):
            np.testing.assert_array_equal(a, b)


def test_partition_is_placed_once_per_process():
    """The second client object of a partition gets the very tensors the first one used."""
    forget_everything()
    cfg = validate_config({"strategy": "fedavg", "dataset": "synthetic", "model": "logreg"})
    first = get_method("fedavg").client(cfg, fake_context(cfg), 1, CLIENTS).data
    second = get_method("fedavg").client(cfg, fake_context(cfg), 1, CLIENTS).data
    assert first[0] is second[0] and first[1] is second[1]
    assert first[0].device == models.default_device()
    assert isinstance(first[0], torch.Tensor)
