"""NodeClient (fl_app/node/node_client.py): the node's work around a method's fit, in the right order."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import fl_app.node.node_client as node
from clients import fedavg, scaffold
from fl_app.node.client_state import ClientStateMirror
from fl_app.node.drift_client import DriftClient
from fl_app.node.node_client import NodeClient
from tests.kit import fake_context, make_client


def _data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(16, 60, generator=g), torch.randint(0, 10, (16,), generator=g)


CI_STATE = scaffold.UPDATE.state["ci"].record  # the context.state record SCAFFOLD keeps c_i under
ScaffoldClient = scaffold.UPDATE  # the update make_client builds its client with
FedAvgClient = fedavg.UPDATE


class RecordedClient(DriftClient):
    """SCAFFOLD's client noting the c_i it found kept when the round began (``prepare_round``,
    where the method reads its kept state)."""

    calls: list = []

    def prepare_round(self, parameters, config):
        saved = self.load_state(CI_STATE)
        RecordedClient.calls.append(("prepare", None if saved is None else [a.copy() for a in saved]))
        return super().prepare_round(parameters, config)


def _sent(client):
    weights = client.get_parameters({})
    return [a.copy() for a in weights] + [np.zeros_like(a) for a in weights]


def test_raise_fault_fails_before_any_training():
    RecordedClient.calls = []
    x, y = _data()
    client = make_client(scaffold.UPDATE, {"inject-faults": "raise:0"}, x, y, client_cls=RecordedClient)
    with pytest.raises(RuntimeError, match="injected fault: client of partition 0 raises"):
        NodeClient(client).fit(_sent(client), {"server-round": 1})
    assert RecordedClient.calls == []  # the method's fit never started
    other = make_client(scaffold.UPDATE, {"inject-faults": "raise:1"}, x, y, client_cls=RecordedClient)  # another partition's fault
    NodeClient(other).fit(_sent(other), {"server-round": 1})
    assert len(RecordedClient.calls) == 1


def test_nan_fault_poisons_the_reply_but_not_the_state():
    x, y = _data()
    context = fake_context()
    client = make_client(ScaffoldClient, {"inject-faults": "nan:0", "learning-rate": 0.1}, x, y, context=context)
    reply, n, _ = NodeClient(client).fit(_sent(client), {"server-round": 1})
    assert n == 16 and all(np.isnan(a).all() for a in reply)
    assert all(np.isfinite(a).all() for a in client.load_state(CI_STATE))  # c_i saved before the poison


def test_resume_restores_the_mirror_before_the_round_is_prepared(tmp_path):
    """A resumed run's node starts with an empty context.state: the checkpointed round's state
    is put back before the method reads it in prepare_round()."""
    RecordedClient.calls = []
    x, y = _data()
    saved = [np.full((10, 60), 0.5, np.float32), np.full(10, -0.25, np.float32)]
    ClientStateMirror(str(tmp_path), "partition-0").save(2, {CI_STATE: saved}, keep_from=2)
    client = make_client(scaffold.UPDATE, {"learning-rate": 0.1}, x, y, client_cls=RecordedClient)
    config = {"server-round": 3, "run-dir": str(tmp_path), "checkpoint-every": 2, "checkpoint-round": 2}
    _, _, metrics = NodeClient(client).fit(_sent(client), config)
    (what, seen), = RecordedClient.calls
    assert what == "prepare" and seen is not None
    for got, want in zip(seen, saved):
        np.testing.assert_array_equal(got, want)
    assert metrics["state_arrays_in"] == 2  # counted after the restore: c_i's two arrays, as uninterrupted
    assert sorted(p.name for p in (tmp_path / "client-state" / "partition-0").iterdir()) == [
        "round-2.npz", "round-3.npz"]  # the checkpointed round is kept for the next resume


def test_node_adds_timing_and_state_count_the_method_does_not(monkeypatch):
    monkeypatch.setattr(node, "in_ray_worker", lambda: True)
    monkeypatch.setattr(node, "ray_node_id", lambda: "node-b")
    x, y = _data()
    context = fake_context()
    plain = make_client(ScaffoldClient, {}, x, y, context=context)
    _, _, own = plain.fit(_sent(plain), {"server-round": 1})
    assert not {"fit_seconds", "state_arrays_in", "ray_node"} & set(own)
    wrapped = make_client(ScaffoldClient, {}, x, y, context=context)
    _, _, metrics = NodeClient(wrapped).fit(_sent(wrapped), {"server-round": 2})
    assert metrics["state_arrays_in"] == 2 and metrics["ray_node"] == "node-b" and metrics["fit_seconds"] > 0
    assert list(metrics)[-3:] == ["state_arrays_in", "ray_node", "fit_seconds"]
    assert 0 < metrics["prepare_seconds"] + metrics["train_seconds"] <= metrics["fit_seconds"]  # round_timings
    stateless = make_client(FedAvgClient, {}, x, y)
    _, _, metrics = NodeClient(stateless).fit(stateless.get_parameters({}), {"server-round": 1})
    assert "state_arrays_in" not in metrics  # only methods that keep state report it


def test_method_fit_is_local_training_only():
    """DriftClient.fit fits on one screen and names none of the node's plumbing."""
    source = inspect.getsource(DriftClient.fit)
    assert len(source.splitlines()) <= 40
    for word in ("fault", "mirror", "warm_up", "cache", "perf_counter", "ray_node", "in_ray_worker",
                 "state_arrays_in", "disk", "fit_seconds"):
        assert word not in source, word
