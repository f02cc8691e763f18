"""Control variates (SCAFFOLD option II, FedGAM-CV Algorithm 2, FedPVR) over two rounds with
partial participation: the real strategies and clients, driven through configure_fit ->
client.fit -> aggregate_fit, against an independent numpy re-implementation."""


import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager

from clients import fedavg, fedgam_cv, fedpvr, scaffold
from fl_app.registry import validate_config
from strategies.base import fedavg_kwargs
from strategies.fedgam_cv import FedGAMCVStrategy
from strategies.fedpvr import FedPVRStrategy
from strategies.scaffold import ScaffoldStrategy
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tests.kit import Proxy, fake_context, make_client
from tests.kit_server import RoundByRound
from tests.kit_training import softmax_regression_grad

LR, DECAY, EPOCHS = 0.4, 0.8, 2
SIZES = [5, 8, 6, 9]
ROUNDS = {1: [0, 1], 2: [1, 2]}  # client 1 twice, 2 joins late, 0 keeps its c_i, 3 never
GAM_RHO, GAM_CV_ALPHA = 0.3, 0.6
CI_STATE = scaffold.UPDATE.state["ci"].record  # c_i's context.state record (FedPVR's and FedGAM-CV's too)
# make_client builds each with (cfg, context, ...)


class FixedSampling(SimpleClientManager):
    """Samples the clients listed for the round (partial participation, known in advance)."""

    def __init__(self):
        super().__init__()
        self.round = 0

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        self.round += 1
        return [self.clients[str(k)] for k in ROUNDS[self.round]]


def _data(k):
    g = torch.Generator().manual_seed(100 + k)
    return torch.randn(SIZES[k], 60, generator=g), torch.randint(0, 10, (SIZES[k],), generator=g)


def _cfg(strategy, **kw):
    return validate_config({
        "strategy": strategy, "dataset": "synthetic", "model": "logreg",
        "fraction-fit": 0.5, "min-fit-clients": 2, "min-available-clients": 4,
        "learning-rate": LR, "lr-decay": DECAY, "batch-size": 64, "local-epochs": EPOCHS,
        "gam-rho": GAM_RHO, "gam-cv-alpha": GAM_CV_ALPHA, "gam-alpha": 0.05, **kw,
    })


def _reference(method, w0):
    """Algorithm 2 / SCAFFOLD option II in numpy float64, full-batch local steps."""
    data = [(x.numpy().astype(np.float64), y.numpy()) for x, y in map(_data, range(4))]

    def G(k, w):
        x, y = data[k]
        g = list(softmax_regression_grad(x, y, *w))
        if method == "fedgam-cv":
            n = np.sqrt(sum((a**2).sum() for a in g))
            g_adv = softmax_regression_grad(x, y, *[a + GAM_RHO * b / n for a, b in zip(w, g)])
            g = [a + GAM_CV_ALPHA * GAM_RHO * b for a, b in zip(g, g_adv)]
        return g

    w = [a.astype(np.float64) for a in w0]
    c = [np.zeros_like(a) for a in w]
    ci = {k: [np.zeros_like(a) for a in w] for k in range(4)}
    history = []
    for t, chosen in ROUNDS.items():
        lr = LR * DECAY ** (t - 1)
        c_sent = [a.copy() for a in c]
        locals_, deltas = [], []
        for k in chosen:
            wk = [a.copy() for a in w]
            for _ in range(EPOCHS):  # full batch: one step per epoch, K = EPOCHS
                wk = [a - lr * (g - b + cc) for a, g, b, cc in zip(wk, G(k, wk), ci[k], c)]
            new = [b - cc + (a0 - a) / (lr * EPOCHS) for b, cc, a0, a in zip(ci[k], c, w, wk)]
            deltas.append([a - b for a, b in zip(new, ci[k])])
            ci[k] = new
            locals_.append((wk, SIZES[k]))
        total = sum(n for _, n in locals_)
        w = [sum(wk[i] * n for wk, n in locals_) / total for i in range(len(w))]
        divisor = len(chosen) if method == "fedgam-cv" else 4
        c = [cc + sum(d[i] for d in deltas) / divisor for i, cc in enumerate(c)]
        history.append(dict(w=w, c=c, c_sent=c_sent, ci={k: [a.copy() for a in v] for k, v in ci.items()}))
    return history


@pytest.mark.parametrize("method", ["scaffold", "fedgam-cv"])
def test_two_rounds_partial_participation_follow_algorithm_2(method, tmp_path):
    strategy_cls, client_cls = {
        "scaffold": (ScaffoldStrategy, scaffold.UPDATE), "fedgam-cv": (FedGAMCVStrategy, fedgam_cv.UPDATE),
    }[method]
    cfg = _cfg(method)
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=3))
    inner = strategy_cls.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    strategy = RoundByRound(inner, cfg, tmp_path, num_rounds=2)
    manager = FixedSampling()
    clients = []
    for k in range(4):
        x, y = _data(k)
        client = make_client(client_cls, dict(cfg), x, y, context=fake_context())
        clients.append(client)
        manager.register(Proxy(str(k), client))

    expected = _reference(method, w0)
    parameters = ndarrays_to_parameters(w0)
    for t in (1, 2):
        instructions = strategy.configure_fit(t, parameters, manager)
        assert [p.cid for p, _ in instructions] == [str(k) for k in ROUNDS[t]]
        sent = parameters_to_ndarrays(instructions[0][1].parameters)
        assert len(sent) == 4  # weight, bias, c_weight, c_bias
        for got, want in zip(sent[2:], expected[t - 1]["c_sent"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
        for _, res in results:
            assert res.metrics["num_steps"] == EPOCHS
        parameters, metrics = strategy.aggregate_fit(t, results, [])
        assert strategy.row["num_rejected"] == 0  # reply count/shapes equal what was sent
        want = expected[t - 1]
        agg = parameters_to_ndarrays(parameters)
        assert len(agg) == 2  # the global model never carries c
        for got, w in zip(agg, want["w"]):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)
        for got, w in zip(inner.cv.c, want["c"]):
            np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)
        c_norm = np.sqrt(sum((a**2).sum() for a in want["c"]))
        assert metrics["cv_norm"] == pytest.approx(c_norm, rel=1e-4)
        for k in range(4):
            stored = clients[k].load_state(CI_STATE)
            if all(not np.any(a) for a in want["ci"][k]):
                assert stored is None  # never trained: c_i still the implicit zero
                continue
            for got, w in zip(stored, want["ci"][k]):
                np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)
        assert "ci_norm_mean" in strategy.row and "cv_norm" in strategy.row
    assert np.any(expected[1]["c_sent"][0])  # round 2 really ran with c != 0


def test_divisors_differ_between_scaffold_and_fedgam_cv():
    def divisor(cls):
        return cls.SERVER.parts["cv"].divisor

    assert divisor(ScaffoldStrategy) == "total" and divisor(FedPVRStrategy) == "total"
    assert divisor(FedGAMCVStrategy) == "participants"


def test_k_is_total_local_steps_not_batches_per_epoch():
    x, y = torch.randn(10, 60), torch.randint(0, 10, (10,))
    lr = 0.2
    client = make_client(scaffold.UPDATE, {"learning-rate": lr, "batch-size": 4, "local-epochs": 2}, x, y)
    w0 = client.get_parameters({})
    c = [np.full(a.shape, 0.01, np.float32) for a in w0]
    out, _, metrics = client.fit([a.copy() for a in w0] + c, {"server-round": 1})
    K = 2 * 3  # two epochs of ceil(10 / 4) batches
    assert metrics["num_steps"] == K
    w, delta = out[:2], out[2:]
    for d, a0, a, cc in zip(delta, w0, w, c):
        np.testing.assert_allclose(d, -cc + (a0 - a) / (lr * K), rtol=1e-4, atol=1e-6)
    ci = client.load_state(CI_STATE)
    assert metrics["ci_norm"] == pytest.approx(np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in ci)), rel=1e-5)


@pytest.mark.parametrize("layers", [1, 2])
def test_fedpvr_carries_only_the_last_linear_layers(layers):
    cfg = validate_config({"strategy": "fedpvr", "dataset": "synthetic", "model": "mlp", "pvr-layers": layers})
    model = build_model("mlp", input_shape("synthetic"), seed=0)
    w0 = get_weights(model)  # body.1.weight, body.1.bias, head.weight, head.bias
    strategy = FedPVRStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    masked = w0[-2 * layers:]
    assert [c.shape for c in strategy.cv.c] == [a.shape for a in masked]

    x, y = torch.randn(6, 60), torch.randint(0, 10, (6,))
    lr = 0.3
    over = {"model": "mlp", "pvr-layers": layers, "learning-rate": lr, "batch-size": 64, "local-epochs": 1}
    c = [np.random.default_rng(i).normal(size=a.shape).astype(np.float32) for i, a in enumerate(masked)]
    pvr = make_client(fedpvr.UPDATE, over, x, y)
    out, _, _ = pvr.fit([a.copy() for a in w0] + c, {"server-round": 1})
    assert len(out) == 4 + 2 * layers and [a.shape for a in out[4:]] == [a.shape for a in masked]
    assert [a.shape for a in pvr.load_state(CI_STATE)] == [a.shape for a in masked]
    plain, _, _ = make_client(fedavg.UPDATE, over, x, y).fit([a.copy() for a in w0], {"server-round": 1})
    n_free = 4 - 2 * layers
    for i in range(n_free):  # unmasked layers: plain SGD, no correction
        np.testing.assert_allclose(out[i], plain[i], rtol=0, atol=1e-7)
    for i in range(n_free, 4):  # masked: one step with g - c_i + c, c_i = 0
        np.testing.assert_allclose(out[i], plain[i] - lr * c[i - n_free], rtol=1e-5, atol=1e-6)


def test_server_c_survives_a_checkpoint_round_trip():
    cfg = _cfg("scaffold")
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=3))
    a = ScaffoldStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    a.cv.c = [np.full(x.shape, 0.5, np.float32) for x in a.cv.c]
    b = ScaffoldStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    b.set_state(a.get_state())
    assert all(np.array_equal(x, y) for x, y in zip(a.cv.c, b.cv.c))


class AllClients(SimpleClientManager):
    """Full participation: every registered client, in id order."""

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return [self.clients[k] for k in sorted(self.clients)]


def _skewed_data(k, n=40):
    """Client k sees mostly classes 2k and 2k+1 (label skew), features shifted per client."""
    g = torch.Generator().manual_seed(200 + k)
    y = torch.where(torch.rand(n, generator=g) < 0.8, 2 * k + torch.randint(0, 2, (n,), generator=g),
                    torch.randint(0, 10, (n,), generator=g))
    centres = torch.randn(10, 60, generator=torch.Generator().manual_seed(7))
    return centres[y] + torch.randn(n, 60, generator=g), y


def run_scaffold_federation(momentum: float, rounds: int, lr=0.05, epochs=2, batch=8):
    """SCAFFOLD, 4 clients, full participation: (global loss per round, ||c|| per round)."""
    cfg = validate_config({
        "strategy": "scaffold", "dataset": "synthetic", "model": "logreg", "fraction-fit": 1.0,
        "min-fit-clients": 4, "min-available-clients": 4, "learning-rate": lr, "momentum": momentum,
        "batch-size": batch, "local-epochs": epochs,
    })
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=3))
    strategy = ScaffoldStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    manager = AllClients()
    data = [_skewed_data(k) for k in range(4)]
    for k, (x, y) in enumerate(data):
        manager.register(Proxy(str(k), make_client(scaffold.UPDATE, dict(cfg), x, y, context=fake_context())))
    x_all, y_all = torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])
    model = build_model("logreg", input_shape("synthetic"), seed=3)

    def global_loss(arrays):
        with torch.no_grad():
            for p, a in zip(model.parameters(), arrays):
                p.copy_(torch.as_tensor(a))
            return float(torch.nn.functional.cross_entropy(model(x_all), y_all))

    parameters, losses, c_norms = ndarrays_to_parameters(w0), [global_loss(w0)], []
    for t in range(1, rounds + 1):
        instructions = strategy.configure_fit(t, parameters, manager)
        results = [(p, p.fit(ins, None, None)) for p, ins in instructions]
        parameters, metrics = strategy.aggregate_fit(t, results, [])
        losses.append(global_loss(parameters_to_ndarrays(parameters)))
        c_norms.append(metrics["cv_norm"])
    return losses, c_norms


def test_scaffold_under_momentum_converges_and_keeps_c_bounded():
    """Momentum 0.9, 10 rounds: with c_i+ divided by lr * K_eff the global loss falls and ||c||
    stays near the size of the clients' gradients. (Dividing by lr * K instead over-counts each
    client's direction about tenfold; c then grows round over round and the loss blows up.)"""
    losses, c_norms = run_scaffold_federation(momentum=0.9, rounds=10)
    assert all(np.isfinite(losses)) and all(np.isfinite(c_norms))
    assert losses[-1] < 0.1 * losses[0]
    assert losses[-1] <= 1.5 * min(losses)  # no rebound at the end
    assert max(c_norms) <= 1.5 * c_norms[0] and max(c_norms) < 5.0  # ||c|| bounded, not growing


@pytest.mark.parametrize("divisor, expected_d", [("total", 10), ("participants", 2)])
def test_scaffold_cv_divisor_key_sets_d_of_the_c_update(divisor, expected_d):
    """c <- c + (1/D) sum delta c_i: D = N = 10 (SCAFFOLD) or D = |S_t| = 2 (FedGAM-CV's Eq. 22)."""
    from flwr.common import Code, FitRes, Status

    cfg = _cfg("scaffold", **{"cv-divisor": divisor})
    w0 = get_weights(build_model("logreg", input_shape("synthetic"), seed=0))
    strategy = ScaffoldStrategy.from_config(cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(w0), None))
    assert strategy.cv.divisor == divisor
    strategy.num_clients = 10
    deltas = [[np.full(a.shape, v, np.float32) for a in w0] for v in (1.0, 3.0)]
    results = [
        (Proxy(str(i), None), FitRes(Status(Code.OK, ""), ndarrays_to_parameters(w0 + d), 5, {}))
        for i, d in enumerate(deltas)
    ]
    strategy.aggregate_fit(1, results, [])
    for c in strategy.cv.c:
        np.testing.assert_allclose(c, (1.0 + 3.0) / expected_d, rtol=1e-6)


def test_cv_divisor_is_validated_with_its_choices():
    from protocol.keys import ConfigError

    with pytest.raises(ConfigError, match="participants"):
        _cfg("scaffold", **{"cv-divisor": "clients"})


# ---- scaffold-correction: where c - c_i goes ------------------------------------------------------

@pytest.mark.parametrize("reading", ["direction", "post-step"])
def test_both_readings_of_the_correction_by_hand(reading):
    """Two steps of heavy-ball SGD (beta 0.9) on the one-matrix hand model, by hand:
    ``direction`` (Algorithm 1's corrected gradient, through momentum; c_i+ with K_eff = 2 + beta)
    and ``post-step`` (NIID-Bench's and Flower's niid_bench: the optimiser steps on g, then
    w <- w - lr (c - c_i) outside its buffer; c_i+ with K = 2)."""
    from tests.kit_training import linear_round, values, weight

    def grad(w):  # softmax(w) - e_0: the cross-entropy gradient at x = [1], y = 0
        p = np.exp(w) / np.exp(w).sum()
        return p - np.array([1.0, 0.0])

    theta, lr, beta = np.array([0.2, -0.1]), 0.5, 0.9
    c, ci = np.array([0.3, -0.2]), np.array([-0.1, 0.05])
    corr = c - ci
    if reading == "direction":
        b1 = grad(theta) + corr
        w1 = theta - lr * b1
        w2 = w1 - lr * (beta * b1 + grad(w1) + corr)
        k = 2 + beta
    else:
        b1 = grad(theta)
        w1 = theta - lr * b1 - lr * corr
        w2 = w1 - lr * (beta * b1 + grad(w1)) - lr * corr
        k = 2
    ci_new = ci - c + (theta - w2) / (lr * k)
    run = linear_round(scaffold.UPDATE, {"scaffold-correction": reading}, tuple(theta), lr=lr, momentum=beta,
                       state={"ci": weight(tuple(ci))}, server={"c": weight(tuple(c))})
    assert values(run.params) == pytest.approx(w2, abs=1e-12)
    assert values(run.state["ci"]) == pytest.approx(ci_new, abs=1e-12)
    assert values(run.reply["delta_c"]) == pytest.approx(ci_new - ci, abs=1e-12)


def test_the_readings_agree_without_momentum_and_differ_with_it():
    from tests.kit_training import linear_round, weight

    state, server = {"ci": weight((-0.1, 0.05))}, {"c": weight((0.3, -0.2))}
    runs = {(r, m): linear_round(scaffold.UPDATE, {"scaffold-correction": r}, (0.2, -0.1), momentum=m, state=state,
                                 server=server, weight_decay=0.01)
            for r in ("direction", "post-step") for m in (0.0, 0.9)}
    assert torch.allclose(runs["direction", 0.0].params["weight"], runs["post-step", 0.0].params["weight"],
                          rtol=0, atol=1e-12)
    assert not torch.allclose(runs["direction", 0.9].params["weight"], runs["post-step", 0.9].params["weight"])


def test_the_post_step_reading_runs_as_a_cohort():
    from tests.kit import assert_cohort_matches

    def states(shapes, k):
        return {"ci": {n: torch.full(s, 0.01 * (k + 1)) for n, s in shapes.items()}}

    assert_cohort_matches(scaffold.UPDATE, {"scaffold-correction": "post-step"}, states=states,
                          server=lambda shapes: {"c": {n: torch.full(s, 0.02) for n, s in shapes.items()}})
