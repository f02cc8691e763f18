"""FedGAM client: the update direction is the paper's Eq. 19 (and, for gam-variant "reference",
the GAM optimiser step), both recomputed here independently with closed-form gradients."""


import numpy as np
import torch

from clients import fedavg, fedgam, fedgam_cv
from tests.kit import make_client
from tests.kit_training import softmax_regression_grad

LR = 0.3


def _data(n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 60, generator=g), torch.randint(0, 10, (n,), generator=g)


def _grad(x, y, w):
    gW, gb = softmax_regression_grad(x, y, w[0], w[1])
    return [gW, gb]


def _norm(v):
    return np.sqrt(sum((a**2).sum() for a in v))


def _fit(overrides, x, y, update=fedgam.UPDATE):
    client = make_client(update, {"learning-rate": LR, "batch-size": 64, "local-epochs": 1, **overrides}, x, y)
    w0 = client.get_parameters({})
    new, _, metrics = client.fit([a.copy() for a in w0], {"server-round": 1})
    assert metrics["num_steps"] == 1
    return [a.astype(np.float64) for a in w0], new


def test_paper_update_is_eq19():
    rho, alpha = 0.5, 0.7  # large, so the second term is far above float noise
    x, y = _data()
    w0, new = _fit({"gam-rho": rho, "gam-alpha": alpha}, x, y)
    xn, yn = x.numpy().astype(np.float64), y.numpy()
    g = _grad(xn, yn, w0)
    n = _norm(g)
    g_adv = _grad(xn, yn, [w + rho * gi / n for w, gi in zip(w0, g)])
    G = [a + alpha * rho * b for a, b in zip(g, g_adv)]
    for got, w, gi in zip(new, w0, G):
        np.testing.assert_allclose(got, w - LR * gi, rtol=1e-5, atol=1e-6)
    # and it is not plain SGD
    _, plain = _fit({}, x, y, update=fedavg.UPDATE)
    assert not np.allclose(plain[0], new[0], atol=1e-5)


def test_paper_defaults_are_rho_002_alpha_02():
    keys = fedgam.UPDATE.keys
    assert keys["gam-rho"].default == 0.02 and keys["gam-alpha"].default == 0.2
    assert keys["gam-variant"].default == "paper"
    assert fedgam_cv.UPDATE.keys["gam-cv-alpha"].default == 0.4
    # FedGAM-CV reads its own alpha, so FedGAM's is not listed among its keys (--list, README)
    assert "gam-alpha" not in fedgam_cv.UPDATE.key_names()
    assert set(fedgam.UPDATE.keys) - {"gam-alpha"} <= set(fedgam_cv.UPDATE.keys)


def test_reference_update_is_the_gam_optimiser_step():
    r1, r2, gamma = 0.3, 0.6, 0.5
    b1, b2, b3 = 1.0, -1.0, 1.0
    x, y = _data(seed=2)
    w0, new = _fit({
        "gam-variant": "reference", "gam-rho": r1, "gam-norm-rho": r2, "gam-gamma": gamma,
    }, x, y)
    xn, yn = x.numpy().astype(np.float64), y.numpy()

    def at(w, d, scale):  # w + scale * d / ||d||
        n = _norm(d)
        return [a + scale * b / n for a, b in zip(w, d)]

    g0 = _grad(xn, yn, w0)
    g1 = _grad(xn, yn, at(w0, g0, r1))
    w2 = at(w0, [a - b for a, b in zip(g1, g0)], r2)
    g2 = _grad(xn, yn, w2)
    g3 = _grad(xn, yn, at(w2, g2, r1))
    u = np.concatenate([(b1 * a + b3 * b).ravel() for a, b in zip(g1, g3)])
    m = np.concatenate([(a + abs(b2) * b).ravel() for a, b in zip(g0, g2)])
    vertical = m - (m @ u) / (u @ u) * u  # the part of m orthogonal to u
    G = u - gamma * vertical
    want = np.concatenate([w.ravel() for w in w0]) - LR * G
    got = np.concatenate([a.ravel() for a in new])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # gamma matters (so the decomposition is really applied)
    _, new0 = _fit({"gam-variant": "reference", "gam-rho": r1, "gam-norm-rho": r2, "gam-gamma": 0.0}, x, y)
    assert not np.allclose(np.concatenate([a.ravel() for a in new0]), got, atol=1e-5)
