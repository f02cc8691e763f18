"""RI-FedAvg: the Roughness Index on analytic functions, batched == loop, and the client's
regularised SGD step (docs/methods.md, "ri-fedavg")."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Context, RecordDict

from clients import ri_fedavg
from clients.ri_fedavg import DIRECTIONS_STREAM, ri_sample, stream_seed
from fl_app.node.drift_client import DriftClient
from fl_app.registry import validate_config
from tasks.catalogue import InputShape
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tasks.roughness import (
    grid,
    model_loss_fn,
    model_roughness,
    normalised_total_variation,
    profile_losses,
    profile_losses_loop,
    random_directions,
    roughness_index,
)

L, M_POINTS = 0.01, 19


def unit(*v) -> torch.Tensor:
    t = torch.tensor(v, dtype=torch.float64)
    return t / t.norm()


def directions_of(*rows) -> dict[str, torch.Tensor]:
    return {"w": torch.stack(rows)}


def both(loss_fn, center, directions, l=L, m=M_POINTS):
    """Profiles from the batched (odd chunk) and the loop implementation."""
    s = grid(l, m, dtype=torch.float64)
    batched = profile_losses(loss_fn, center, directions, s, chunk=7)
    loop = profile_losses_loop(loss_fn, center, directions, s)
    return batched, loop


def hand_T(f, center: np.ndarray, d: np.ndarray, l=L, m=M_POINTS) -> float:
    """Eqs. 6-8 written out with numpy and python loops."""
    values = [f(center + (-l + j * 2 * l / m) * d) for j in range(m + 1)]
    tv = sum(abs(values[j + 1] - values[j]) for j in range(m))
    return tv / (2 * l * (max(values) - min(values)))


def test_quadratic_matches_hand_computation():
    # f(w) = ||w||^2 at w_t = (0, 3, 0). Along e1 the minimum is inside [-l, l] (the profile
    # falls then rises symmetrically: TV = 2A, T = 1/l); along e2 and (e1+e2)/sqrt2 it is
    # monotone (TV = A, T = 1/(2l)). So T = (2a, a, a) with a = 1/(2l), I = sqrt(2)/4.
    center = {"w": torch.tensor([0.0, 3.0, 0.0], dtype=torch.float64)}
    dirs = directions_of(unit(1, 0, 0), unit(0, 1, 0), unit(1, 1, 0))
    loss = lambda p: (p["w"] ** 2).sum()
    for values in both(loss, center, dirs):
        t = normalised_total_variation(values, L)
        a = 1 / (2 * L)
        torch.testing.assert_close(t, torch.tensor([2 * a, a, a], dtype=torch.float64), rtol=1e-9, atol=0)
        assert roughness_index(t, 10.0) == pytest.approx(math.sqrt(2) / 4, rel=1e-9)


def test_quadratic_plus_sinusoid_matches_hand_computation():
    # f(w) = ||w||^2 + c sin(k w1): rough along e1, smooth along e2 (T = 1/(2l) exactly).
    c, k = 0.05, 2000.0
    w0 = np.array([0.3, 1.0, -0.2])
    f_np = lambda w: float(np.sum(w ** 2) + c * np.sin(k * w[0]))
    f_t = lambda p: (p["w"] ** 2).sum() + c * torch.sin(k * p["w"][0])
    raw = [np.array([1.0, 0, 0]), np.array([0, 1.0, 0]), np.array([1.0, 2.0, -1.0])]
    raw = [d / np.linalg.norm(d) for d in raw]
    expected = np.array([hand_T(f_np, w0, d) for d in raw])
    center = {"w": torch.tensor(w0)}
    dirs = directions_of(*[torch.tensor(d) for d in raw])
    for values in both(f_t, center, dirs):
        t = normalised_total_variation(values, L)
        np.testing.assert_allclose(t.numpy(), expected, rtol=1e-9)
        assert t[1].item() == pytest.approx(1 / (2 * L), rel=1e-9)
        assert t[0].item() > 3 / (2 * L)  # the sinusoid makes e1 rough
        i = roughness_index(t, 10.0)
        assert i == pytest.approx(np.std(expected) / np.mean(expected), rel=1e-9)


def test_flat_loss_gives_finite_zero_not_nan():
    center = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    dirs = directions_of(unit(1, 0), unit(1, 1))
    for values in both(lambda p: p["w"].sum() * 0 + 2.0, center, dirs):
        t = normalised_total_variation(values, L)
        assert torch.equal(t, torch.zeros(2, dtype=torch.float64))
        assert roughness_index(t, 10.0) == 0.0
    # one flat direction among rough ones: T = 0 there, everything finite
    loss = lambda p: p["w"][0] ** 2
    values, _ = both(loss, {"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}, directions_of(unit(1, 0), unit(0, 1)))
    t = normalised_total_variation(values, L)
    assert torch.isfinite(t).all() and t[1] == 0 and t[0] == pytest.approx(1 / L)
    assert roughness_index(t, 10.0) == pytest.approx(1.0)  # T = (x, 0): std/mean = 1


def test_index_population_std_and_clipping():
    t = torch.tensor([0.0, 0.0, 0.0, 100.0])
    assert roughness_index(t, 10.0) == pytest.approx(math.sqrt(3))  # population std
    assert roughness_index(t, 1.0) == 1.0
    assert roughness_index(torch.tensor([5.0, 5.0]), 10.0) == 0.0


def test_directions_unit_norm_over_whole_vector_and_seeded():
    model = build_model("mlp", InputShape(0, 8, 3), seed=0)
    center = dict(model.named_parameters())
    d = random_directions(center, 4, torch.Generator().manual_seed(3))
    norms = sum(v.reshape(4, -1).double().pow(2).sum(1) for v in d.values()).sqrt()
    torch.testing.assert_close(norms, torch.ones(4, dtype=torch.float64))
    for name, p in center.items():  # each layer alone is not unit norm
        assert d[name].shape == (4, *p.shape)
    again = random_directions(center, 4, torch.Generator().manual_seed(3))
    other = random_directions(center, 4, torch.Generator().manual_seed(4))
    assert all(torch.equal(d[n], again[n]) for n in d)
    assert not all(torch.equal(d[n], other[n]) for n in d)


@pytest.mark.parametrize("name,shape", [("mlp", InputShape(0, 8, 3)), ("cnn-bn", InputShape(1, 8, 3))])
def test_batched_equals_loop_and_independent_evaluation(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, seed=0).double().eval()
    x = torch.randn(16, *((shape.channels, shape.size, shape.size) if shape.channels else (shape.size,))).double()
    y = torch.randint(0, 3, (16,))
    center = {n: p.detach() for n, p in model.named_parameters()}
    dirs = random_directions(center, 3, torch.Generator().manual_seed(1))
    s = grid(0.5, 9, dtype=torch.float64)
    fn = model_loss_fn(model, x, y)
    batched = profile_losses(fn, center, dirs, s, chunk=7)
    loop = profile_losses_loop(fn, center, dirs, s)
    torch.testing.assert_close(batched, loop, rtol=0, atol=1e-6)
    torch.testing.assert_close(profile_losses(fn, center, dirs, s, chunk=0), loop, rtol=0, atol=1e-6)
    # independently: write each perturbed vector into a copy of the model and call it
    names = list(center)
    w0 = torch.cat([p.reshape(-1) for p in center.values()])  # (channels-last weights: no view)
    probe = copy.deepcopy(model)
    for i in (0, 2):
        di = torch.cat([dirs[n][i].reshape(-1) for n in names])
        for j in (0, 4, 9):
            torch.nn.utils.vector_to_parameters(w0 + s[j] * di, probe.parameters())
            with torch.no_grad():
                want = F.cross_entropy(probe(x), y)
            assert batched[i, j].item() == pytest.approx(want.item(), abs=1e-6)
    assert not torch.allclose(batched[:, 0], batched[:, -1])  # the perturbation did something
    if name == "cnn-bn":  # buffers (running stats) were read, not updated
        for (n, b), b0 in zip(model.named_buffers(), build_model(name, shape, seed=0).double().buffers()):
            assert torch.equal(b, b0), n


def make_client(overrides: dict, n: int = 24, seed: int = 0):
    cfg = validate_config({"strategy": "ri-fedavg", "dataset": "synthetic", "model": "logreg", **overrides})
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    client = DriftClient(ri_fedavg.UPDATE, cfg, context, partition_id=2, num_partitions=4)
    gen = torch.Generator().manual_seed(seed)
    dim = input_shape("synthetic").size
    x = torch.randn(n, dim, generator=gen)
    y = torch.randint(0, input_shape("synthetic").classes, (n,), generator=gen)
    client.use_data((x, y))
    return client, cfg, x, y


def test_client_reports_index_of_its_sample_and_directions():
    client, cfg, x, y = make_client({"ri-interval": 2.0, "ri-samples": 10, "ri-points": 6, "ri-directions": 5})
    model = build_model("logreg", input_shape("synthetic"), seed=1)
    _, _, metrics = client.fit(get_weights(model), {"server-round": 3})
    # recompute with the loop reference on the client's sample and the round's seeded directions
    xs, ys = ri_sample(client.prepare_round(get_weights(model), {"server-round": 3}))
    assert len(xs) == 10
    center = {n: p.detach() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(stream_seed(cfg["seed"], 2, 3, DIRECTIONS_STREAM))
    dirs = random_directions(center, 5, gen)
    values = profile_losses_loop(model_loss_fn(model.eval(), xs, ys), center, dirs, grid(2.0, 6))
    want = roughness_index(normalised_total_variation(values, 2.0), 10.0)
    assert metrics["ri"] == pytest.approx(want, abs=1e-6)
    assert metrics["ri"] > 0.01
    # another round draws other directions
    _, _, metrics4 = client.fit(get_weights(model), {"server-round": 4})
    assert metrics4["ri"] != metrics["ri"]


def test_client_sgd_step_uses_roughness_proximal_gradient():
    # batch >= n and 2 epochs: exactly two full-batch steps. Step 1 is at w = w_t (no
    # proximal force); step 2 is w2 = w1 - eta * (grad F(w1) + 2 lambda I (w1 - w_t)).
    lam, eta = 5.0, 0.5
    client, cfg, x, y = make_client({
        "ri-lambda": lam, "learning-rate": eta, "local-epochs": 2, "batch-size": 64,
        "ri-interval": 2.0, "ri-points": 6, "ri-directions": 5,
    })
    model = build_model("logreg", input_shape("synthetic"), seed=1)
    weights, n, metrics = client.fit(get_weights(model), {"server-round": 1})
    assert n == len(x) and metrics["num_steps"] == 2
    i = client.prepare_round(get_weights(model), {"server-round": 1}).state["ri"]  # I_k, measured before the loop
    assert metrics["ri"] == i and i > 0.01

    def grad(ws):
        ws = [w.clone().requires_grad_(True) for w in ws]
        W, b = ws
        loss = F.cross_entropy(x @ W.T + b, y)
        return torch.autograd.grad(loss, ws)

    w0 = [p.detach().clone() for p in model.parameters()]  # logreg: head.weight, head.bias
    w1 = [w - eta * g for w, g in zip(w0, grad(w0))]
    w2 = [w - eta * (g + 2 * lam * i * (w - a)) for w, g, a in zip(w1, grad(w1), w0)]
    got = [torch.as_tensor(a) for a in weights]
    for g_, w_ in zip(got, w2):
        torch.testing.assert_close(g_, w_, rtol=0, atol=1e-6)
    # the proximal term is large enough that leaving it out would fail the check
    plain = [w - eta * g for w, g in zip(w1, grad(w1))]
    assert max((p - q).abs().max().item() for p, q in zip(plain, w2)) > 1e-3


def test_float64_evaluation_of_a_float32_model():
    model = build_model("cnn-bn", InputShape(1, 8, 3), seed=0)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,))
    t64, i64 = model_roughness(model, x, y, 4, 0.5, 5, 10.0, torch.Generator().manual_seed(2), dtype=torch.float64)
    double = copy.deepcopy(model).double()
    t_ref, i_ref = model_roughness(double, x.double(), y, 4, 0.5, 5, 10.0, torch.Generator().manual_seed(2))
    torch.testing.assert_close(t64, t_ref, rtol=1e-9, atol=0)
    assert i64 == pytest.approx(i_ref, rel=1e-9)
    assert next(model.parameters()).dtype == torch.float32 and model.training


def test_evaluation_in_batches_is_the_same_mean_loss():
    """The CPU path evaluates ``batch_size`` examples at a time; the loss is the full mean."""
    model = build_model("cnn", input_shape("mnist"), seed=0).eval()
    x, y = torch.randn(37, 1, 28, 28), torch.randint(0, 10, (37,))
    params = {n: p.detach() for n, p in model.named_parameters()}
    whole = model_loss_fn(model, x, y)(params)
    with torch.no_grad():
        want = F.cross_entropy(model(x), y)
    for batch in (5, 32, 37, 100):
        assert model_loss_fn(model, x, y, batch_size=batch)(params).item() == pytest.approx(want.item(), abs=1e-6)
    assert whole.item() == pytest.approx(want.item(), abs=1e-6)


def test_perturbed_points_keep_the_weights_layout():
    """A channels-last conv weight stays channels-last at every grid point (else the
    convolutions fall back to the slow layout); the values are center + s d_i."""
    from tasks.roughness import point_along

    model = build_model("cnn", input_shape("mnist"), seed=0)
    center = {n: p.detach() for n, p in model.named_parameters()}
    dirs = random_directions(center, 2, torch.Generator().manual_seed(0))
    s = torch.tensor(0.25)
    point = point_along(center, dirs, 1, s)
    for name, c in center.items():
        assert point[name].stride() == c.stride(), name
        torch.testing.assert_close(point[name], c + 0.25 * dirs[name][1])
    norms = sum(dirs[n].reshape(2, -1).double().pow(2).sum(1) for n in dirs).sqrt()
    torch.testing.assert_close(norms, torch.ones(2, dtype=torch.float64), atol=1e-5, rtol=0)
