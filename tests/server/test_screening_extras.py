"""Poisoned extras: a client that sends an ordinary weight update but a poisoned method extra
(SCAFFOLD's delta c_i scaled by 1e4) is caught by the screening rule, as an attacker on its
weights is (fl_app/server/screening.py: the extras are a second group of each reply's update,
screened by the same rule). By hand on a few vectors for each rule a method with extras may
use (clip, reject, krum, multi-krum), then with SCAFFOLD's real clients and server: the server
control variate c takes only the honest clients' delta c_i."""

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager

from clients import scaffold
from fl_app.node.client_state import ContextStore, RevertibleStore
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from fl_app.server.screening import decide
from protocol.counted import COUNTED
from strategies.base import fedavg_kwargs
from strategies.scaffold import ScaffoldStrategy
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy, fake_context, make_client
from tests.kit_server import RoundByRound

POISON = 1e4


def _replies(n=7, seed=0):
    """w_t = 0 (a 2x2 and a 2-vector), n replies: honest updates and extras of norms near 1;
    reply 0's extras times POISON, its weights as honest as the others'."""
    rng = np.random.default_rng(seed)
    w_t = [np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]
    replies = []
    for k in range(n):
        weights = [(0.5 + 0.05 * rng.standard_normal(a.shape)).astype(np.float32) for a in w_t]
        extras = [(0.3 + 0.05 * rng.standard_normal((2, 2))).astype(np.float32),
                  (0.3 + 0.05 * rng.standard_normal(2)).astype(np.float32)]
        if k == 0:
            extras = [(POISON * e).astype(np.float32) for e in extras]
        replies.append(weights + extras)
    return replies, w_t


@pytest.mark.parametrize("mode, attackers", [("reject", 0), ("krum", 1), ("multi-krum", 1)])
def test_a_poisoned_extra_is_dropped_by_the_rules_that_drop_replies(mode, attackers):
    replies, w_t = _replies()
    d = decide(replies, w_t, mode, 0.0, 3.0, 0.2, attackers=attackers)
    assert not d.keep[0]
    if mode != "krum":
        assert all(d.keep[1:])  # the honest ones all pass


def test_a_poisoned_extra_is_clipped_to_the_honest_extras():
    """clip (multiple 1): reply 0's extras have norm ~ POISON x the median extras' norm, so its
    factor is the median extras' norm over its own, and its extras are sent at that median."""
    replies, w_t = _replies()
    d = decide(replies, w_t, "clip", 0.0, 1.0, 0.2)
    extras_norms = [np.sqrt(sum(float((e.astype(np.float64) ** 2).sum()) for e in r[2:])) for r in replies]
    weight_norms = [np.sqrt(sum(float((w.astype(np.float64) ** 2).sum()) for w in r[:2])) for r in replies]
    median_e, median_w = np.median(extras_norms), np.median(weight_norms)
    want = min(1.0, median_e / extras_norms[0], median_w / weight_norms[0])
    assert d.factors[0] == pytest.approx(want, rel=1e-9)
    assert d.factors[0] < 2 / POISON


class Poisoned:
    """A node whose reply's weights are its honest ones but whose extras (delta c_i) are scaled by POISON."""

    def __init__(self, node, num_weights):
        self.node, self.num_weights = node, num_weights

    def fit(self, parameters, config):
        reply, n, metrics = self.node.fit(parameters, config)
        return reply[: self.num_weights] + [POISON * a for a in reply[self.num_weights:]], n, metrics


K = 5
SIZES = [12, 20, 16, 24, 18]


class Everyone(SimpleClientManager):
    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return [self.clients[str(k)] for k in range(K)]


def scaffold_federation(screening: str, attackers: int, tmp_path, num_rounds: int, attacker: type):
    """K real SCAFFOLD clients (each behind ``NodeClient``, on its own context) and SCAFFOLD's
    strategy inside the server's steps; client 0 wrapped in ``attacker``. Returns (the strategy,
    the server's steps, the manager, w0, the clients' contexts)."""
    cfg = validate_config({
        "strategy": "scaffold", "dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0,
        "min-fit-clients": K, "min-available-clients": K, "learning-rate": 0.1, "batch-size": 8,
        "screening": screening, "screen-attackers": attackers,
    })
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=1))
    inner = ScaffoldStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    strategy = RoundByRound(inner, cfg, tmp_path, num_rounds=num_rounds)
    manager = Everyone()
    contexts = [fake_context() for _ in range(K)]
    for k in range(K):
        g = torch.Generator().manual_seed(10 + k)
        x, y = torch.randn(SIZES[k], 60, generator=g), torch.randint(0, 10, (SIZES[k],), generator=g)
        node = NodeClient(make_client(scaffold.UPDATE, dict(cfg), x, y, context=contexts[k], partition=k,
                                      num_partitions=K))
        manager.register(Proxy(str(k), attacker(node, len(w0)) if k == 0 else node))
    return inner, strategy, manager, w0, contexts


@pytest.mark.parametrize("screening, attackers", [("multi-krum", 1), ("reject", 0)])
def test_scaffold_c_never_takes_a_poisoned_delta_c(screening, attackers, tmp_path):
    inner, strategy, manager, w0, _ = scaffold_federation(screening, attackers, tmp_path, 1, Poisoned)
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w0), manager)
    results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
    replies = [parameters_to_ndarrays(r.parameters) for _, r in results]
    assert np.linalg.norm(replies[0][2]) > 100 * np.linalg.norm(replies[1][2])  # the poison is sent
    strategy.aggregate_fit(1, results, [])
    assert strategy.row["num_rejected"] == 1
    # c <- c + (1/N) sum of the kept clients' delta c_i: the four honest ones (c starts at 0)
    want = [sum(r[2 + i].astype(np.float64) for r in replies[1:]) / K for i in range(2)]
    for got, w in zip(inner.cv.c, want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)


class PoisonedInRoundOne(Poisoned):
    """``Poisoned`` in round 1 only; honest after."""

    def fit(self, parameters, config):
        if int(config["server-round"]) == 1:
            return super().fit(parameters, config)
        return self.node.fit(parameters, config)


@pytest.mark.parametrize("screening, attackers", [("reject", 0), ("multi-krum", 1)])
def test_a_left_out_scaffold_client_goes_back_so_c_stays_the_mean_of_the_c_i(screening, attackers, tmp_path):
    """SCAFFOLD's server c = (1/N) sum_i c_i holds as long as a client's c_i moves only when the
    server takes its delta c_i (c and every c_i start at 0; every client is sampled every round).
    Client 0's round-1 reply is rejected (its delta c_i poisoned), so its c_i must go back to
    what it was before round 1; multi-krum also leaves out one client in round 2. After two rounds,
    the c_i each client starts its next round from (its store settled with its last counted round)
    average to the server's c. Before the rollback, client 0 kept the c_i of its rejected round
    and the mean was off by (1/N) of it."""
    inner, strategy, manager, w0, contexts = scaffold_federation(screening, attackers, tmp_path, 2,
                                                                 PoisonedInRoundOne)
    parameters = ndarrays_to_parameters(w0)
    for t in (1, 2):
        instructions = strategy.configure_fit(t, parameters, manager)
        results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
        parameters, _ = strategy.aggregate_fit(t, results, [])
        if t == 1:
            assert strategy.row["num_rejected"] == 1  # client 0, whose c_i moved all the same
    counted = strategy.server.counted.rounds  # each client's last counted round (absent: none)
    assert sum(r == 2 for r in counted.values()) == (K if screening == "reject" else K - 1)
    record = scaffold.UPDATE.state["ci"].record
    starts = []
    for k in range(K):
        store = RevertibleStore(ContextStore(contexts[k].state))
        store.settle(k, {COUNTED: counted.get(str(k), 0)})
        kept = store.loader(k)(record)
        starts.append(kept if kept is not None else [np.zeros_like(c) for c in inner.cv.c])
    for j, c in enumerate(inner.cv.c):
        np.testing.assert_allclose(c, sum(s[j].astype(np.float64) for s in starts) / K, rtol=1e-5, atol=1e-7)
