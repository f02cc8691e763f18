"""The local optimiser choice (tasks/optim.py): K_eff, Adam/AdamW through the client loop
against torch's own optimisers, fresh state each round, and the methods that refuse Adam."""


import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients import scaffold
from fl_app.config import GENERAL_KEYS, ConfigError
from fl_app.registry import METHODS, resolve, validate_config
from tasks.datasets import input_shape
from tasks.models import build_model, get_weights
from tasks.optim import OPTIMIZERS, effective_steps
from tests.kit import make_client


def client_class(name: str):
    """The update method ``name``'s client runs (the registry's), as ``make_client`` takes it."""
    return METHODS[name].update


def _data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 60, generator=g), torch.randint(0, 10, (n,), generator=g)


# ------------------------------------------------------------------------------ K_eff
@pytest.mark.parametrize("K, beta, want", [
    (1, 0.0, 1.0),
    (8, 0.0, 8.0),
    (1, 0.9, 1.0),  # one step: the buffer is just g
    # sum_{s=1..8} (1 - 0.9^s)/0.1 = 1 + 1.9 + 2.71 + 3.439 + 4.0951 + 4.68559 + 5.217031 + 5.6953279
    (8, 0.9, 28.7420489),
])
def test_effective_steps_hand_computation(K, beta, want):
    assert effective_steps(K, beta) == pytest.approx(want, rel=1e-12)


def test_effective_steps_is_the_displacement_of_heavy_ball_sgd():
    """K steps of torch SGD(momentum=beta) on a constant gradient g move w by lr * K_eff * g."""
    for K, beta in [(1, 0.9), (8, 0.9), (8, 0.0), (13, 0.5)]:
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1, momentum=beta)
        for _ in range(K):
            w.grad = torch.ones(1)
            opt.step()
        assert -w.item() == pytest.approx(0.1 * effective_steps(K, beta), rel=1e-5)


def test_scaffold_ci_divides_by_lr_times_k_eff_under_momentum():
    x, y = _data(10)
    lr, beta = 0.2, 0.9
    client = make_client(client_class("scaffold"), {"learning-rate": lr, "momentum": beta, "batch-size": 4,
                                          "local-epochs": 2}, x, y)
    w0 = client.get_parameters({})
    c = [np.full(a.shape, 0.01, np.float32) for a in w0]
    out, _, metrics = client.fit([a.copy() for a in w0] + c, {"server-round": 1})
    K = metrics["num_steps"]
    assert K == 6
    k_eff = effective_steps(K, beta)
    for d, a0, a, cc in zip(out[2:], w0, out[:2], c):
        np.testing.assert_allclose(d, -cc + (a0 - a) / (lr * k_eff), rtol=1e-4, atol=1e-6)
    for ci, d in zip(client.load_state(scaffold.UPDATE.state["ci"].record), out[2:]):  # c_i started at 0
        np.testing.assert_allclose(ci, d, rtol=1e-6)


# ------------------------------------------------------------------- Adam and AdamW
@pytest.mark.parametrize("name, torch_cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_adam_steps_match_torch(name, torch_cls):
    """Full-batch steps through the client's loop equal torch's optimiser on the same gradients.
    The initial weights are seeded: Adam's step m/sqrt(v) turns a float32 rounding of a gradient
    near zero into a step of about lr, so an unlucky draw of the weights (the model of whichever
    test built it first) moved a few entries past the tolerance (1.8e-3 relative)."""
    x, y = _data()
    lr, wd, epochs = 0.05, 0.1, 4
    over = {"model": "mlp", "optimizer": name, "learning-rate": lr, "weight-decay": wd,
            "batch-size": 64, "local-epochs": epochs}
    client = make_client(client_class("fedavg"), over, x, y)
    torch.manual_seed(0)  # w0 drawn here, not the process's cached model (whichever test built it first)
    w0 = [t.detach().numpy().copy() for t in build_model("mlp", input_shape("synthetic")).state_dict().values()]
    got, _, metrics = client.fit([a.copy() for a in w0], {"server-round": 1})
    assert metrics["num_steps"] == epochs

    model = build_model("mlp", input_shape("synthetic"))
    with torch.no_grad():
        for p, a in zip(model.parameters(), w0):
            p.copy_(torch.as_tensor(a))
    opt = torch_cls(model.parameters(), lr=lr, weight_decay=wd)
    for _ in range(epochs):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for a, p in zip(got, model.parameters()):
        np.testing.assert_allclose(a, p.detach().numpy(), rtol=1e-5, atol=1e-6)
    # and it is not SGD: the same run with SGD ends elsewhere
    sgd, _, _ = make_client(client_class("fedavg"), {**over, "optimizer": "sgd"}, x, y).fit(
        [a.copy() for a in w0], {"server-round": 1})
    assert not np.allclose(sgd[0], got[0], atol=1e-4)


def test_adam_and_adamw_differ_with_weight_decay():
    x, y = _data()
    over = {"model": "mlp", "learning-rate": 0.05, "weight-decay": 0.5, "batch-size": 64, "local-epochs": 3}
    w0 = get_weights(build_model("mlp", input_shape("synthetic"), seed=1))
    a, _, _ = make_client(client_class("fedavg"), {**over, "optimizer": "adam"}, x, y).fit([v.copy() for v in w0], {})
    b, _, _ = make_client(client_class("fedavg"), {**over, "optimizer": "adamw"}, x, y).fit([v.copy() for v in w0], {})
    assert not np.allclose(a[0], b[0], atol=1e-5)


def test_optimizer_state_is_fresh_each_round():
    """Two rounds from the same weights give the same result: no Adam moments carried over."""
    x, y = _data()
    client = make_client(client_class("fedavg"), {"model": "mlp", "optimizer": "adam", "learning-rate": 0.05,
                                        "batch-size": 64, "local-epochs": 2}, x, y)
    w0 = client.get_parameters({})
    first, _, _ = client.fit([a.copy() for a in w0], {"server-round": 1})
    second, _, _ = client.fit([a.copy() for a in w0], {"server-round": 1})
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------- who accepts Adam
REFUSE = {
    "scaffold": "option II control variates",
    "fedpvr": "option II control variates",
    "fedgam-cv": "option II control variates",
    "fednova": "normaliser",
}


@pytest.mark.parametrize("method", sorted(REFUSE))
@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_methods_that_need_sgd_refuse_adam(method, optimizer):
    with pytest.raises(ConfigError) as err:
        resolve({"strategy": method, "optimizer": optimizer})
    msg = str(err.value)
    assert f"'optimizer' = {optimizer!r}" in msg and f"strategy {method!r}" in msg
    assert REFUSE[method] in msg and "valid choices: sgd" in msg
    resolve({"strategy": method, "optimizer": "sgd", "momentum": 0.9})  # SGD is fine


def test_momentum_with_adam_is_refused():
    with pytest.raises(ConfigError) as err:
        validate_config({"optimizer": "adam", "momentum": 0.9})
    msg = str(err.value)
    assert "'momentum' = 0.9" in msg and "beta1 = 0.9" in msg and "momentum = 0" in msg


def test_schema_choices_are_the_built_optimizers():
    assert GENERAL_KEYS["optimizer"].choices == OPTIMIZERS


def test_unknown_optimizer_lists_the_choices():
    with pytest.raises(ConfigError) as err:
        validate_config({"optimizer": "rmsprop"})
    assert "'rmsprop'" in str(err.value) and "sgd, adam, adamw" in str(err.value)


ADAM_OK = sorted(set(METHODS) - set(REFUSE) - {"fedbn"})  # fedbn: image model only, below


@pytest.mark.parametrize("method", ADAM_OK)
def test_every_other_method_trains_with_adam(method):
    """Two rounds of each method's client with Adam: finite weights that moved."""
    x, y = _data()
    cfg = {"strategy": method, "model": "mlp", "optimizer": "adam", "learning-rate": 0.01,
           "batch-size": 4, "local-epochs": 1}
    if method == "ri-fedavg":
        cfg.update({"ri-directions": 2, "ri-points": 4})  # a cheap index; its math has its own tests
    if method == "fedprox":
        cfg["proximal-mu"] = 0.1
    client = make_client(client_class(method), cfg, x, y)
    w = client.get_parameters({})
    for t in (1, 2):
        config = {"server-round": t}
        out, _, metrics = client.fit([a.copy() for a in w], config)
        assert all(np.isfinite(a).all() for a in out)
        assert any(not np.array_equal(a, b) for a, b in zip(out, w))
        w = out[:len(w)]  # the weights: a reply may carry more (SCAFFOLD's delta c, CCVR's statistics)
    assert np.isfinite(metrics["train_loss"])


def test_fedbn_trains_with_adam():
    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 10, (8,))
    client = make_client(client_class("fedbn"), {"strategy": "fedbn", "dataset": "mnist", "model": "cnn-bn",
                                                  "optimizer": "adam", "batch-size": 4}, x, y)
    w = client.get_parameters({})
    out, _, _ = client.fit([a.copy() for a in w], {"server-round": 1})
    assert all(np.isfinite(a).all() for a in out) and not np.array_equal(out[0], w[0])
