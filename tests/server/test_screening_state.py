"""Screening keeps a stateful method's server state consistent with what it aggregated: a
rejected client's delta c_i (SCAFFOLD) or drift (FedDyn h) is never applied, and a clipped
client's contributes scaled by its clip factor. Real clients (one attacker scaling its update
by 100 through inject-faults) and real strategies, two rounds, in process."""


import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager

from clients import feddyn, scaffold
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from strategies.base import fedavg_kwargs
from strategies.feddyn import FedDynStrategy
from strategies.scaffold import ScaffoldStrategy
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy, fake_context, make_client
from tests.kit_server import RoundByRound

K = 4
SIZES = [12, 20, 16, 24]
ALPHA = 0.1
ScaffoldClient = scaffold.UPDATE  # the update make_client builds its client with
FedDynClient = feddyn.UPDATE


class Everyone(SimpleClientManager):
    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return [self.clients[str(k)] for k in range(K)]


def _federation(strategy_cls, client_cls, screening, tmp_path):
    cfg = validate_config({
        "strategy": "scaffold" if strategy_cls is ScaffoldStrategy else "feddyn",
        "dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0, "min-fit-clients": K,
        "min-available-clients": K, "learning-rate": 0.1, "batch-size": 8, "feddyn-alpha": ALPHA,
        "inject-faults": "scale:0:100", "screening": screening, "screen-clip-multiple": 3.0, "screen-reject-multiple": 3.0,
    })
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=1))
    inner = strategy_cls.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    strategy = RoundByRound(inner, cfg, tmp_path, num_rounds=2)
    manager = Everyone()
    for k in range(K):
        g = torch.Generator().manual_seed(10 + k)
        x, y = torch.randn(SIZES[k], 60, generator=g), torch.randint(0, 10, (SIZES[k],), generator=g)
        c = make_client(client_cls, dict(cfg), x, y, context=fake_context())
        c.partition_id = k  # the attacker is partition 0
        manager.register(Proxy(str(k), NodeClient(c)))
    return strategy, inner, manager, w0


def _factors(replies, w_t, screening):
    """The hand rule: norms over the weight arrays, bound 3 x median; s_k (0 = rejected)."""
    norms = [np.sqrt(sum(((r[i].astype(np.float64) - w_t[i]) ** 2).sum() for i in range(len(w_t)))) for r in replies]
    bound = 3.0 * np.median(norms)
    if screening == "reject":
        return [1.0 if n <= bound else 0.0 for n in norms]
    return [min(1.0, bound / n) for n in norms]


@pytest.mark.parametrize("screening", ["reject", "clip"])
def test_scaffold_c_takes_only_screened_deltas(screening, tmp_path):
    strategy, inner, manager, w_t = _federation(ScaffoldStrategy, ScaffoldClient, screening, tmp_path)
    c = [np.zeros_like(a, dtype=np.float64) for a in w_t]
    parameters = ndarrays_to_parameters(w_t)
    for t in (1, 2):
        instructions = strategy.configure_fit(t, parameters, manager)
        sent = parameters_to_ndarrays(instructions[0][1].parameters)
        for got, want in zip(sent[2:], c):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)  # c sent = c screened
        results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
        replies = [parameters_to_ndarrays(r.parameters) for _, r in results]
        s = _factors(replies, w_t, screening)
        assert s[0] < 0.05 and s[1:] == [1.0] * (K - 1)  # only the attacker is screened
        parameters, _ = strategy.aggregate_fit(t, results, [])
        # c <- c + (1/N) sum_k s_k delta c_k; weights: n_k-weighted mean of w_t + s_k delta_k
        c = [c[i] + sum(sk * r[2 + i].astype(np.float64) for sk, r in zip(s, replies)) / K for i in range(2)]
        for got, want in zip(inner.cv.c, c):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        kept = [(sk, r, n) for sk, r, n in zip(s, replies, SIZES) if sk > 0]
        total = sum(n for _, _, n in kept)
        want_w = [sum(n * (w_t[i] + sk * (r[i].astype(np.float64) - w_t[i])) for sk, r, n in kept) / total for i in range(2)]
        new = parameters_to_ndarrays(parameters)
        for got, want in zip(new, want_w):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        row = strategy.row
        assert row["num_rejected"] == (1 if screening == "reject" else 0)
        assert row["num_clipped"] == (1 if screening == "clip" else 0)
        w_t = new


@pytest.mark.parametrize("screening", ["reject", "clip"])
def test_feddyn_h_takes_only_screened_drift(screening, tmp_path):
    strategy, inner, manager, w_t = _federation(FedDynStrategy, FedDynClient, screening, tmp_path)
    h = [np.zeros_like(a, dtype=np.float64) for a in w_t]
    parameters = ndarrays_to_parameters(w_t)
    for t in (1, 2):
        instructions = strategy.configure_fit(t, parameters, manager)
        results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
        replies = [parameters_to_ndarrays(r.parameters) for _, r in results]
        s = _factors(replies, w_t, screening)
        assert s[0] < 0.05 and s[1:] == [1.0] * (K - 1)
        parameters, _ = strategy.aggregate_fit(t, results, [])
        used = [[w_t[i] + sk * (r[i].astype(np.float64) - w_t[i]) for i in range(2)] for sk, r in zip(s, replies) if sk > 0]
        # h <- h - alpha (1/N) sum_k (w_k - w_t) over the used replies; w = mean(w_k) - h / alpha
        h = [h[i] - ALPHA / K * sum(u[i] - w_t[i] for u in used) for i in range(2)]
        for got, want in zip(inner.memory.h, h):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        new = parameters_to_ndarrays(parameters)
        for i in range(2):
            np.testing.assert_allclose(new[i], np.mean([u[i] for u in used], axis=0) - h[i] / ALPHA, rtol=1e-4, atol=1e-5)
        w_t = new
