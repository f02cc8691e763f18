"""Summed replies: a cohort node's one n_k-weighted mean and sums for its clients
(protocol/cohort.py ``sum_replies``) in place of every client's own reply.

Checked here without a simulation: the node's sums by hand, each registered server's
declaration (``REPLY_SUMS``), every summing server's aggregation of node sums against the same
clients' own replies, the drift columns from sums against those from the replies, and the
refusals of ``cohort-replies = "sum"``. End to end (metrics.csv and checkpoints of whole runs):
tests/training/test_cohort.py ``test_summed_replies_equal_full_replies``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from fl_app.config import ConfigError
from fl_app.registry import METHODS, get_method, resolve, validate_config
from fl_app.server.drift import drift_from_sums, layout, round_drift
from protocol.cohort import REPLIES, SumSpec, split_summed_reply, sum_replies
from protocol.traffic import SUMMED_CLIENTS, clients_in
from strategies.base import build_strategy
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import FakeManager, assert_arrays_close
from tests.kit_runs import NEEDS
from tests.kit_server import reply_as_fitres

STRATEGIES = sorted({m.strategy for m in METHODS.values()}, key=lambda cls: cls.__name__)
SUMMING = [name for name, m in METHODS.items() if m.strategy.REPLY_SUMS is not None]


# ------------------------------------------------------------------ the node's sums, by hand
def test_sum_replies_by_hand():
    """Two clients (n = 1 and 3) of a model with a float and an integer array, and one summed
    group: the mean is (1 w_1 + 3 w_2) / 4 (the integer array rounded, in its dtype), the
    group's sum plain; a third client with a NaN is rejected and left out
    of every sum, a fourth failed; the drift sums over entry 0 (a head entry)."""
    sent = [np.array([1.0, 1.0], np.float32), np.array(4, np.int64), np.zeros(2, np.float32)]
    a = [np.array([2.0, 1.0], np.float32), np.array(6, np.int64), np.array([1.0, 2.0], np.float32)]
    b = [np.array([1.0, 5.0], np.float32), np.array(10, np.int64), np.array([3.0, -1.0], np.float32)]
    bad = [np.array([np.nan, 1.0], np.float32), np.array(6, np.int64), np.zeros(2, np.float32)]
    spec = SumSpec(mean=2, head=(0,), body=())
    arrays, total, metrics = sum_replies([(7, a, 1, {"train_loss": 0.5}, sent), (9, b, 3, {"train_loss": 0.25}, sent),
                                          (3, bad, 2, {}, sent)], {5: "RuntimeError: boom"}, spec)
    assert total == 4 and metrics[SUMMED_CLIENTS] == 2
    np.testing.assert_array_equal(arrays[0], np.array([1.25, 4.0], np.float32))  # (1 (2,1) + 3 (1,5)) / 4
    assert arrays[0].dtype == np.float32
    assert arrays[1].dtype == np.int64 and arrays[1] == 9  # (6 + 30) / 4
    np.testing.assert_array_equal(arrays[2], np.array([4.0, 1.0], np.float32))  # plain sum
    # drift over entry 0: Delta_a = (1, 0), Delta_b = (0, 4); sum n Delta = (1, 12); directions (1, 1)
    np.testing.assert_array_equal(arrays[3], [1.0, 12.0])
    np.testing.assert_array_equal(arrays[4], [1.0, 1.0])
    records = json.loads(metrics[REPLIES])
    assert [r.get("drift") for r in records[:2]] == [[1.0, 0.0], [16.0, 0.0]]
    node = split_summed_reply(reply_as_fitres((arrays, total, metrics)))
    assert [c.partition for c in node.clients] == [7, 9] and [c.num_examples for c in node.clients] == [1, 3]
    assert node.clients[0].metrics == {"train_loss": 0.5}
    assert node.rejected == [(3, "non-finite values (NaN or Inf)")]
    assert node.failed == [(5, "RuntimeError: boom")]
    assert node.reply.num_examples == 4 and clients_in(node.reply.metrics) == 2
    assert len(parameters_to_ndarrays(node.reply.parameters)) == 3  # the drift sums are not the method's


def test_a_failed_node_fails_every_client_it_names():
    failed = FitRes(Status(Code.FIT_NOT_IMPLEMENTED, "out of memory"), ndarrays_to_parameters([]), 0,
                    {"cohort-partitions": "1,4", SUMMED_CLIENTS: 0})
    node = split_summed_reply(failed)
    assert node.clients == [] and [p for p, _ in node.failed] == [1, 4]
    assert "out of memory" in node.failed[0][1]


# ------------------------------------------------------------------ each server's declaration
@pytest.mark.parametrize("cls", STRATEGIES, ids=lambda cls: cls.__name__)
def test_every_registered_strategy_declares_its_reply_sums(cls):
    """REPLY_SUMS in the class's own body (a subclass of FedAvg's server does not inherit
    "summable"); a plain mean over clients cannot take a sum weighted by n_k; a summed group is
    one the clients send."""
    assert "REPLY_SUMS" in vars(cls), f"{cls.__name__} inherits REPLY_SUMS: declare it in its body"
    if getattr(cls, "UNIFORM_MEAN", False):
        assert cls.REPLY_SUMS is None
    if cls.REPLY_SUMS:
        assert set(cls.REPLY_SUMS) <= set(cls.TRAFFIC.up)


def method_config(name: str) -> dict:
    keys = {k: v for k, v in NEEDS.get(name, {}).items() if k in ("dataset", "model")}
    return validate_config({"strategy": name, "dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0,
                            "min-available-clients": 5, **keys})


def strategy_and_instruction(name: str):
    cfg = method_config(name)
    w0 = get_weights(build_model(cfg["model"], input_shape(cfg["dataset"]), seed=0))
    strategy = build_strategy(get_method(name).strategy, cfg, ndarrays_to_parameters(w0))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w0), FakeManager(5))
    return cfg, strategy, parameters_to_ndarrays(instructions[0][1].parameters), len(w0)


def client_replies(sent: list[np.ndarray], k: int) -> list[tuple[int, list[np.ndarray]]]:
    """k made-up replies: every float array moved by a client's own noise, integers counted on."""
    rng = np.random.default_rng(k)
    out = []
    for i in range(k):
        reply = [a + rng.normal(scale=0.1, size=a.shape).astype(a.dtype) if np.issubdtype(a.dtype, np.floating)
                 else a + i for a in sent]
        out.append((int(rng.integers(5, 50)), reply))
    return out


@pytest.mark.parametrize("name", SUMMING)
def test_every_summing_server_aggregates_node_sums_as_the_clients_replies(name):
    """5 clients' replies aggregated one by one, and as two nodes' sums (clients {0, 1, 2} and
    {3, 4}, ``sum_replies``), by two copies of the method's server after the same
    ``configure_fit``: the same new model and server state (c for the control variates), within
    float32 rounding of the other summation order (1e-6 of each array's scale)."""
    cfg, full, sent, num_state = strategy_and_instruction(name)
    _, summed, _, _ = strategy_and_instruction(name)
    replies = client_replies(sent, 5)
    fit = [(None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(r), n, {"num_steps": 3})) for n, r in replies]
    want, _ = full.aggregate_fit(1, fit, [])
    _, head, body = layout(cfg["model"], cfg["dataset"], get_method(name).strategy)
    spec = SumSpec(num_state, head, body)
    nodes = []
    for group in ([0, 1, 2], [3, 4]):
        ret = sum_replies([(i, replies[i][1], replies[i][0], {}, sent) for i in group], {}, spec)
        nodes.append((None, split_summed_reply(reply_as_fitres(ret)).reply))
    assert [clients_in(res.metrics) for _, res in nodes] == [3, 2]
    got, _ = summed.aggregate_fit(1, nodes, [])
    assert_arrays_close(parameters_to_ndarrays(got), parameters_to_ndarrays(want), rel=1e-6, what=name)
    if hasattr(full, "get_state"):
        a, b = full.get_state(), summed.get_state()
        assert a.keys() == b.keys()
        for key in a:
            assert_arrays_close(b[key], a[key], rel=1e-6, what=f"{name} {key}")


# ------------------------------------------------------------------ the drift columns
def test_drift_columns_from_sums_equal_those_from_the_replies():
    """The mlp's 4 arrays, 5 clients on two nodes: every drift column from the nodes' sums
    equals ``round_drift`` on the clients' own replies within float64 rounding (1e-9)."""
    cfg = {"model": "mlp", "dataset": "synthetic"}
    strategy = get_method("fedavg").strategy
    sent = get_weights(build_model("mlp", input_shape("synthetic"), seed=0))
    replies = client_replies(sent, 5)
    want = round_drift(cfg, strategy, sent, replies)
    _, head, body = layout("mlp", "synthetic", strategy)
    spec = SumSpec(len(sent), head, body)
    nodes = [split_summed_reply(reply_as_fitres(sum_replies(
        [(i, replies[i][1], replies[i][0], {}, sent) for i in group], {}, spec))) for group in ([0, 3], [1, 2, 4])]
    got = drift_from_sums(cfg, strategy, nodes)
    assert got.keys() == want.keys() and len(want) == 7
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9), key


def test_drift_from_sums_refuses_a_plain_mean_server():
    with pytest.raises(ValueError, match="plain mean over clients"):
        drift_from_sums({"model": "mlp", "dataset": "synthetic"}, get_method("feddyn").strategy, [])


# ------------------------------------------------------------------ refusals, before any training
@pytest.mark.parametrize("keys, words", [
    ({"strategy": "fednova"}, "FedNovaStrategy) needs every client's reply"),
    ({"screening": "clip"}, "screening = 'clip' acts on each client's reply"),
    ({"execution": "per-client"}, "execution = 'per-client' has no cohort node"),
    ({"inject-faults": "alie:0,ipm:1"}, "omniscient attacks (alie, ipm) replace single clients' replies at the server"),
])
def test_cohort_replies_sum_is_refused_in_one_line_where_it_cannot_be(keys, words):
    with pytest.raises(ConfigError) as err:
        resolve({"cohort-replies": "sum", **keys})
    message = str(err.value)
    assert words in message and "'cohort-replies' = 'sum'" in message and "valid choices: auto, full" in message
    assert "\n" not in message
