"""FedSMOO (Sun et al., ICML 2023): the local step, mu_i and h_i across rounds, and the server's
H and s against a hand computation on softmax regression; the exact reductions to FedDyn
(rho = 0) and FedSAM (alpha = 0, ``smoo-s = none``); checkpoints and rejected replies."""


import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager

from clients import feddyn, fedsam, fedsmoo
from fl_app.config import ConfigError
from fl_app.node.node_client import NodeClient
from fl_app.registry import validate_config
from fl_app.server.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from strategies.base import fedavg_kwargs
from strategies.feddyn import FedDynStrategy
from strategies.fedsmoo import FedSMOOStrategy
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy, fake_context, fit_res, make_client
from tests.kit_server import RoundByRound
from tests.kit_training import softmax_regression_grad

# make_client builds each with (cfg, context, ...)
G_STATE = feddyn.GRAD.record  # h_i, kept as FedDyn's g_k = -alpha h_i
MU_STATE = fedsmoo.UPDATE.state["mu"].record


def _data(seed=5, n=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 60, generator=g), torch.randint(0, 10, (n,), generator=g)


def _perturbed_weights(w, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    return [(a + scale * rng.standard_normal(a.shape)).astype(np.float32) for a in w]


def _norm(arrays):
    return np.sqrt(sum((a**2).sum() for a in arrays))


def _reference_round(x, y, w_t, s, mu, h, *, steps, lr, rho, alpha, mode="paper", clip=0.0):
    """One round of FedSMOO's client in float64, full-batch steps (the pinned formulas)."""
    w = [a.astype(np.float64) for a in w_t]
    mu = [a.astype(np.float64) for a in mu]
    shat = [np.zeros_like(a) for a in w]
    for _ in range(steps):
        g = softmax_regression_grad(x, y, *w)
        v = [a - m - b for a, m, b in zip(g, mu, s)]
        shat = [rho * a / (_norm(v) + 1e-12) for a in v]
        mu = [m + e - b for m, e, b in zip(mu, shat, s)]
        gtil = softmax_regression_grad(x, y, *[a + e for a, e in zip(w, shat)])
        d = [a + alpha * (hh - a0) for a, hh, a0 in zip(gtil, h, w_t)]
        if clip > 0:
            d = [a * min(1.0, clip / (_norm(d) + 1e-6)) for a in d]
        w = [a - lr * (dd + alpha * a) for a, dd in zip(w, d)]
    h = [hh + (a - a0) for hh, a, a0 in zip(h, w, w_t)]
    reply = [m - e for m, e in zip(mu, shat)] if mode == "paper" else mu
    return w, mu, h, reply


def _smoo_client(x, y, context=None, **overrides):
    cfg = {"strategy": "fedsmoo", "learning-rate": 0.4, "batch-size": 64, "local-epochs": 1, **overrides}
    return make_client(fedsmoo.UPDATE, cfg, x, y, context=context)


# ---------------------------------------------------------------------- client: hand computation
@pytest.mark.parametrize("mode,clip", [("paper", 0.0), ("code", 0.0), ("paper", 0.05)])
def test_one_local_step_matches_hand_computation(mode, clip):
    x, y = _data()
    lr, rho, alpha = 0.4, 0.3, 0.2
    client = _smoo_client(x, y, **{"learning-rate": lr, "smoo-rho": rho, "smoo-alpha": alpha, "smoo-s": mode,
                                   "smoo-clip-norm": clip})
    w_t = client.get_parameters({})
    rng = np.random.default_rng(2)
    s = [(0.05 * rng.standard_normal(a.shape)).astype(np.float32) for a in w_t]
    mu = [(0.05 * rng.standard_normal(a.shape)).astype(np.float32) for a in w_t]
    h = [(0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in w_t]
    client.save_state(MU_STATE, mu)  # state left by an earlier round on this node
    client.save_state(G_STATE, [-alpha * a for a in h])  # FedDyn's g_k = -alpha h_i
    out, _, metrics = NodeClient(client).fit([a.copy() for a in w_t] + s, {"server-round": 2})

    x64, s64, h64 = x.numpy().astype(np.float64), [a.astype(np.float64) for a in s], [a.astype(np.float64) for a in h]
    w, mu_new, h_new, reply = _reference_round(x64, y.numpy(), w_t, s64, mu, h64, steps=1, lr=lr, rho=rho,
                                               alpha=alpha, mode=mode, clip=clip)
    assert len(out) == 4 and [a.shape for a in out[2:]] == [a.shape for a in w_t]
    for got, want in zip(out[:2] + out[2:], w + reply):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(client.load_state(MU_STATE), mu_new):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(client.load_state(G_STATE), h_new):
        np.testing.assert_allclose(got, -alpha * want, rtol=1e-5, atol=1e-6)
    assert metrics["smoo_mu_norm"] == pytest.approx(_norm(mu_new), rel=1e-5)
    assert metrics["state_arrays_in"] == 4  # mu_i and g_k, two arrays each
    if clip:  # the clip acted: without it the step differs
        free, *_ = _reference_round(x64, y.numpy(), w_t, s64, mu, h64, steps=1, lr=lr, rho=rho, alpha=alpha)
        assert not np.allclose(free[0], w[0], atol=1e-4)


def test_mu_and_h_carried_across_two_rounds_through_context_state():
    x, y = _data(n=9)
    lr, rho, alpha, steps = 0.3, 0.25, 0.15, 2
    context = fake_context()
    client = _smoo_client(x, y, context=context, **{"learning-rate": lr, "smoo-rho": rho, "smoo-alpha": alpha,
                                                    "local-epochs": steps})
    w0 = client.get_parameters({})
    x64, y_np = x.numpy().astype(np.float64), y.numpy()
    mu = [np.zeros(a.shape) for a in w0]
    h = [np.zeros(a.shape) for a in w0]
    rounds = {1: (w0, [np.zeros(a.shape, np.float32) for a in w0]),
              2: (_perturbed_weights(w0, 7), [(0.04 * np.random.default_rng(8).standard_normal(a.shape)).astype(np.float32)
                                               for a in w0])}
    for server_round, (w_t, s) in rounds.items():
        # a new client object each round, as Flower builds one per message: only context.state carries
        client = _smoo_client(x, y, context=context, **{"learning-rate": lr, "smoo-rho": rho, "smoo-alpha": alpha,
                                                        "local-epochs": steps})
        out, _, metrics = NodeClient(client).fit([a.copy() for a in w_t] + s, {"server-round": server_round})
        w, mu, h, reply = _reference_round(x64, y_np, w_t, [a.astype(np.float64) for a in s], mu, h, steps=steps,
                                           lr=lr, rho=rho, alpha=alpha)
        for got, want in zip(out, w + reply):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        for got, want in zip(context.state[MU_STATE].to_numpy_ndarrays(), mu):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        for got, want in zip(context.state[G_STATE].to_numpy_ndarrays(), h):
            np.testing.assert_allclose(got, -alpha * want, rtol=1e-4, atol=1e-6)
        assert metrics["state_arrays_in"] == (0 if server_round == 1 else 4)
    # round 2 really used the carried state: a node without it computes another update
    fresh, _, _ = _smoo_client(x, y, **{"learning-rate": lr, "smoo-rho": rho, "smoo-alpha": alpha,
                                        "local-epochs": steps}).fit([a.copy() for a in rounds[2][0]] + rounds[2][1],
                                                                    {"server-round": 2})
    assert not np.allclose(fresh[0], out[0], atol=1e-5)
    assert not np.allclose(fresh[2], out[2], atol=1e-5)


# ------------------------------------------------------------------------ exact reductions
def test_rho_zero_client_is_exactly_feddyn():
    x, y = _data(n=11)
    alpha = 0.2
    common = {"learning-rate": 0.3, "batch-size": 4, "local-epochs": 2, "momentum": 0.5, "weight-decay": 0.01}
    dyn = make_client(feddyn.UPDATE, {"strategy": "feddyn", "feddyn-alpha": alpha, **common}, x, y)
    smoo = _smoo_client(x, y, **{"smoo-rho": 0.0, "smoo-alpha": alpha, **common})
    w0 = dyn.get_parameters({})
    zeros = [np.zeros_like(a) for a in w0]
    for server_round, w_t in ((1, w0), (2, _perturbed_weights(w0, 3)), (3, _perturbed_weights(w0, 4))):
        a, _, ma = dyn.fit([v.copy() for v in w_t], {"server-round": server_round})
        b, _, mb = smoo.fit([v.copy() for v in w_t] + zeros, {"server-round": server_round})
        assert ma["num_steps"] == mb["num_steps"] == 6
        for u, v in zip(a, b[:2]):
            np.testing.assert_array_equal(u, v)
        assert all(not np.any(v) for v in b[2:])  # stil = mu - shat = 0
        assert ma["train_loss"] == mb["train_loss"]
        for u, v in zip(dyn.load_state(G_STATE), smoo.load_state(G_STATE)):
            np.testing.assert_array_equal(u, v)
    assert np.any(dyn.load_state(G_STATE)[0])  # the dual acted


def test_alpha_zero_with_none_is_exactly_the_fedsam_client():
    x, y = _data(n=11)
    rho = 0.6
    common = {"learning-rate": 0.3, "batch-size": 4, "local-epochs": 2, "momentum": 0.5, "weight-decay": 0.01}
    sam = make_client(fedsam.UPDATE, {"strategy": "fedsam", "sam-rho": rho, **common}, x, y)
    smoo = _smoo_client(x, y, **{"smoo-rho": rho, "smoo-alpha": 0.0, "smoo-s": "none", **common})
    w0 = sam.get_parameters({})
    s = [np.full(a.shape, 0.1, np.float32) for a in w0]  # ignored under "none"
    for server_round, w_t in ((1, w0), (2, _perturbed_weights(w0, 3))):
        a, _, ma = sam.fit([v.copy() for v in w_t], {"server-round": server_round})
        b, _, mb = smoo.fit([v.copy() for v in w_t] + s, {"server-round": server_round})
        for u, v in zip(a, b[:2]):
            np.testing.assert_array_equal(u, v)
        assert all(not np.any(v) for v in b[2:]) and mb["smoo_mu_norm"] == 0.0
        assert ma["train_loss"] == mb["train_loss"]
    assert smoo.load_state(MU_STATE) is None  # mu_i held at zero, never stored
    # and "none" is not "paper": with the same s the paper's step differs
    paper = _smoo_client(x, y, **{"smoo-rho": rho, "smoo-alpha": 0.0, **common})
    c, _, _ = paper.fit([v.copy() for v in w0] + s, {"server-round": 1})
    a, _, _ = make_client(fedsam.UPDATE, {"strategy": "fedsam", "sam-rho": rho, **common}, x, y).fit(
        [v.copy() for v in w0], {"server-round": 1})
    assert not np.allclose(a[0], c[0], atol=1e-5)


# ---------------------------------------------------------------------------------- server
def _strategies(**smoo):
    cfg = validate_config({"strategy": "fedsmoo", "dataset": "synthetic", "model": "logreg", **smoo})
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=3))
    return FedSMOOStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None)), w0


def _replies(w_t, rng, n=3):
    clients = [[(a + rng.standard_normal(a.shape)).astype(np.float32) for a in w_t] for _ in range(n)]
    extras = [[(0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in w_t] for _ in range(n)]
    return clients, extras


@pytest.mark.parametrize("mode", ["paper", "code", "none"])
def test_server_h_weights_and_s_match_hand_computation(mode):
    rho, n_total = 0.2, 7
    strategy, w_t = _strategies(**{"smoo-rho": rho, "smoo-alpha": 0.3, "smoo-s": mode})
    rng = np.random.default_rng(0)
    H = [np.zeros(a.shape) for a in w_t]
    s = [np.zeros(a.shape) for a in w_t]
    for server_round in (1, 2):
        clients, extras = _replies(w_t, rng)
        strategy.global_weights, strategy.num_clients = w_t, n_total
        results = [(None, fit_res(c + e, k)) for c, e, k in zip(clients, extras, (10, 30, 5))]  # n_k must not matter
        params, metrics = strategy.aggregate_fit(server_round, results, [])
        new = parameters_to_ndarrays(params)
        assert len(new) == 2  # the global model never carries s
        H = [hh + sum(c[i].astype(np.float64) - w_t[i] for c in clients) / n_total for i, hh in enumerate(H)]
        want = [np.mean([c[i] for c in clients], axis=0, dtype=np.float64) + H[i] for i in range(2)]
        for got, w in zip(new, want):
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6)
        if mode != "none":
            total = [sum(e[i].astype(np.float64) for e in extras) for i in range(2)]
            s = [rho * a / _norm(total) for a in total]
        for got, w in zip(strategy.perturbation.s, s):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)
        assert metrics["smoo_s_norm"] == pytest.approx(rho if mode != "none" else 0.0, rel=1e-5)
        assert metrics["smoo_H_norm"] == pytest.approx(_norm(H), rel=1e-6)
        w_t = new


def test_server_s_is_zero_for_a_zero_sum():
    strategy, w_t = _strategies()
    strategy.perturbation.s = [np.ones(a.shape, np.float32) for a in w_t]
    strategy.global_weights, strategy.num_clients = w_t, 2
    zeros = [np.zeros_like(a) for a in w_t]
    plus = [np.full(a.shape, 0.5, np.float32) for a in w_t]
    minus = [-a for a in plus]
    strategy.aggregate_fit(1, [(None, fit_res(w_t + plus, 1)), (None, fit_res(w_t + minus, 1))], [])
    assert all(np.array_equal(a, z) for a, z in zip(strategy.perturbation.s, zeros))


def test_rho_zero_server_is_exactly_feddyn():
    alpha, n_total = 0.1, 5
    smoo, w_t = _strategies(**{"smoo-rho": 0.0, "smoo-alpha": alpha})
    dyn = FedDynStrategy(parts={"memory": FedDynStrategy.SERVER.parts["memory"].part(smoo.memory.trainable, alpha)},
                         num_state=len(w_t))
    rng = np.random.default_rng(1)
    for server_round in (1, 2, 3):
        clients, extras = _replies(w_t, rng)
        for strategy in (smoo, dyn):
            strategy.global_weights, strategy.num_clients = w_t, n_total
        a, _ = dyn.aggregate_fit(server_round, [(None, fit_res(c, 1)) for c in clients], [])
        b, metrics = smoo.aggregate_fit(server_round, [(None, fit_res(c + e, 1)) for c, e in zip(clients, extras)], [])
        a, b = parameters_to_ndarrays(a), parameters_to_ndarrays(b)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
        assert all(not np.any(v) for v in smoo.perturbation.s) and metrics["smoo_s_norm"] == 0.0
        w_t = b


def test_configure_fit_sends_weights_then_s():
    strategy, w0 = _strategies()
    strategy.perturbation.s = [np.full(a.shape, 0.25, np.float32) for a in w0]
    manager = SimpleClientManager()
    for k in range(2):
        manager.register(Proxy(str(k), None))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w0), manager)
    assert instructions
    sent = parameters_to_ndarrays(instructions[0][1].parameters)
    assert len(sent) == 4
    for got, want in zip(sent, w0 + strategy.perturbation.s):
        np.testing.assert_array_equal(got, want)


def test_checkpoint_round_trip_continues_identically(tmp_path):
    a, w_t = _strategies(**{"smoo-rho": 0.3})
    b, _ = _strategies(**{"smoo-rho": 0.3})
    assert set(b.get_state()) == {"smoo-s"}  # H appears with the first aggregation
    rng = np.random.default_rng(4)
    clients, extras = _replies(w_t, rng)
    a.global_weights, a.num_clients = w_t, 4
    params, _ = a.aggregate_fit(1, [(None, fit_res(c + e, 1)) for c, e in zip(clients, extras)], [])
    w1 = parameters_to_ndarrays(params)
    save_checkpoint(tmp_path, Checkpoint(1, w1, a.get_state()))
    b.set_state(load_checkpoint(tmp_path).strategy_state)
    assert all(np.array_equal(x, y) for x, y in zip(a.perturbation.s, b.perturbation.s))
    assert np.any(b.perturbation.s[0])
    assert all(np.array_equal(x, y) for x, y in zip(a.memory.H, b.memory.H))
    clients, extras = _replies(w1, rng)
    outs = []
    for strategy in (a, b):
        strategy.global_weights, strategy.num_clients = w1, 4
        p, _ = strategy.aggregate_fit(2, [(None, fit_res(c + e, 1)) for c, e in zip(clients, extras)], [])
        outs.append(parameters_to_ndarrays(p))
    assert all(np.array_equal(x, y) for x, y in zip(*outs))
    with pytest.raises(ValueError, match="s does not match"):
        b.set_state({"smoo-s": [np.zeros(3)]})


def test_bad_replies_are_rejected_and_good_ones_pass(tmp_path):
    cfg = validate_config({"strategy": "fedsmoo", "dataset": "synthetic", "model": "logreg",
                           "min-available-clients": 3, "fraction-fit": 1.0, "min-fit-fraction": 0.0})
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=3))
    inner = FedSMOOStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    strategy = RoundByRound(inner, cfg, tmp_path, num_rounds=1)
    manager = SimpleClientManager()
    clients = []
    for k in range(3):
        x, y = _data(seed=10 + k)
        clients.append(make_client(fedsmoo.UPDATE, dict(cfg), x, y, context=fake_context()))
        manager.register(Proxy(str(k), clients[-1]))
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(w0), manager)
    results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
    good = results[0][1]
    arrays = parameters_to_ndarrays(results[1][1].parameters)
    results[1] = (results[1][0], FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays[:2]), 7, {}))  # no s part
    arrays = parameters_to_ndarrays(results[2][1].parameters)
    arrays[3] = np.full_like(arrays[3], np.nan)
    results[2] = (results[2][0], FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 7, {}))
    params, metrics = strategy.aggregate_fit(1, results, [])
    assert strategy.row["num_rejected"] == 2 and strategy.row["num_clients"] == 1
    assert len(parameters_to_ndarrays(params)) == 2 and np.isfinite(metrics["smoo_s_norm"])
    assert "smoo_mu_norm_mean" in strategy.row and "smoo_H_norm" in strategy.row
    assert len(parameters_to_ndarrays(good.parameters)) == 4


def test_config_keys_and_errors():
    cfg = validate_config({"strategy": "fedsmoo", "smoo-rho": 0, "smoo-alpha": 0})
    assert cfg["smoo-rho"] == 0.0 and cfg["smoo-alpha"] == 0.0 and cfg["smoo-s"] == "paper"
    assert cfg["smoo-clip-norm"] == 0.0
    with pytest.raises(ConfigError, match="paper, code, none"):
        validate_config({"strategy": "fedsmoo", "smoo-s": "simplified"})
    with pytest.raises(ConfigError, match="'smoo-rho'"):
        validate_config({"strategy": "fedsmoo", "smoo-rho": -0.1})
