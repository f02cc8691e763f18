"""FedPGVC as its authors' released code (``pgvc-variant = "authors"``): plain local training,
then layers 4-7 (Keras order) rescaled by (1 - eta rho_j), rho_j = loss of sample j times the
mean gradient of the j-th trainable tensor, the pairing of the code's ``zip(batch_loss,
batch_grad)`` (docs/methods.md, "fedpgvc"). The expected numbers come from scalar arithmetic
written out here (math.exp, the chain rule by hand), not from autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from clients import fedavg, fedpgvc
from clients.fedpgvc import authors_rescale, code_rhos
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from strategies.base import fedavg_kwargs
from strategies.fedpgvc import FedPGVCStrategy
from tasks.datasets import input_shape
from tasks.functional import module_state
from tasks.keras_layers import keras_layers, pgvc_code_layers
from tasks.models import Classifier, build_model, get_weights, set_weights
from tests.kit import make_client

# The tiny model's numbers: Linear layers A, B, C (1 -> 1), D (1 -> 2) and the head E (2 -> 2),
# E.w row-major (E.w[2k + m] = weight of input m in output k).
START = {"A.w": 0.5, "A.b": 0.1, "B.w": -1.0, "B.b": 0.2, "C.w": 0.8, "C.b": -0.3,
         "D.w": (1.5, -0.7), "D.b": (0.05, 0.3), "E.w": (1.0, -0.4, -0.5, 0.9), "E.b": (0.0, 0.2)}
XS = [-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
YS = [0, 1, 1, 0, 1, 0, 0, 1, 1, 0]


def tiny_model(w: dict) -> Classifier:
    """Keras order: Flatten, A, Flatten, B, Flatten (layer 4), C (5), D (6), E (7): eight
    layers, so the code's mask covers C, D and E; parameter tensors A.w, A.b, B.w, B.b, C.w,
    C.b (5), D.w (6), D.b (7), E.w, E.b."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(1, 1), nn.Flatten(), nn.Linear(1, 1), nn.Flatten(),
                         nn.Linear(1, 1), nn.Linear(1, 2))
    model = Classifier(body, nn.Linear(2, 2))
    with torch.no_grad():
        for layer, module in zip("ABCDE", layers(model)):
            module.weight.copy_(torch.tensor(w[f"{layer}.w"]).reshape(module.weight.shape))
            module.bias.copy_(torch.tensor(w[f"{layer}.b"]).reshape(module.bias.shape))
    return model


def layers(model: Classifier) -> tuple[nn.Linear, ...]:
    body = model.body
    return body[1], body[3], body[5], body[6], model.head


def scalars(model: Classifier) -> dict:
    """The model's numbers as START writes them (one-element tensors as floats)."""
    w = {}
    for layer, module in zip("ABCDE", layers(model)):
        for kind, t in (("w", module.weight), ("b", module.bias)):
            values = tuple(t.detach().flatten().tolist())
            w[f"{layer}.{kind}"] = values[0] if len(values) == 1 else values
    return w


def reply_scalars(arrays: list[np.ndarray]) -> dict:
    """The numbers of a client's reply (the tiny model's state arrays) as START writes them."""
    model = tiny_model(START)
    set_weights(model, arrays)
    return scalars(model)


def hand_rhos(w: dict, xs: list[float], ys: list[int]) -> tuple[float, float, float]:
    """rho_5, rho_6, rho_7 by hand: the forward pass, the loss and the chain rule per sample."""
    losses, g_cb, g_dw, g_db = [], 0.0, [0.0, 0.0], [0.0, 0.0]
    for x, y in zip(xs, ys):
        a = w["A.w"] * x + w["A.b"]
        b = w["B.w"] * a + w["B.b"]
        c = w["C.w"] * b + w["C.b"]
        d = [w["D.w"][m] * c + w["D.b"][m] for m in range(2)]
        z = [w["E.w"][2 * k] * d[0] + w["E.w"][2 * k + 1] * d[1] + w["E.b"][k] for k in range(2)]
        top = max(z)
        total = math.exp(z[0] - top) + math.exp(z[1] - top)
        p = [math.exp(zk - top) / total for zk in z]
        losses.append(top + math.log(total) - z[y])
        dz = [p[k] - (1.0 if k == y else 0.0) for k in range(2)]  # dloss/dz
        dd = [w["E.w"][m] * dz[0] + w["E.w"][2 + m] * dz[1] for m in range(2)]  # dloss/dd
        g_cb += dd[0] * w["D.w"][0] + dd[1] * w["D.w"][1]  # dloss/dC.b = dloss/dc
        for m in range(2):
            g_dw[m] += dd[m] * c
            g_db[m] += dd[m]
    # the code's zip(batch_loss, batch_grad) and np.mean: sample j with the mean entry of
    # tensor j (C.b is tensor 5, D.w 6, D.b 7)
    return losses[5] * g_cb, losses[6] * (g_dw[0] + g_dw[1]) / 2, losses[7] * (g_db[0] + g_db[1]) / 2


def rescaled(w: dict, eta: float, rhos: tuple[float, float, float]) -> dict:
    """Layers C, D and E times (1 - eta rho_5), (1 - eta rho_6), (1 - eta rho_7); A, B as they are."""
    out = dict(w)
    for layer, rho in zip("CDE", rhos):
        for kind in ("w", "b"):
            v = w[f"{layer}.{kind}"]
            out[f"{layer}.{kind}"] = tuple(u * (1 - eta * rho) for u in v) if isinstance(v, tuple) else v * (1 - eta * rho)
    return out


def data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(XS).reshape(-1, 1), torch.tensor(YS)


def assert_scalars_close(got: dict, want: dict, rtol: float) -> None:
    for k in want:
        np.testing.assert_allclose(np.atleast_1d(got[k]), np.atleast_1d(want[k]), rtol=rtol, atol=0, err_msg=k)


def test_tiny_model_is_the_codes_eight_layers():
    model = tiny_model(START)
    assert len(keras_layers(model)) == 8
    assert pgvc_code_layers(model) == [(5, ["body.5.weight", "body.5.bias"]), (6, ["body.6.weight", "body.6.bias"]),
                                       (7, ["head.weight", "head.bias"])]


def test_rescale_after_training_matches_hand_computation_over_two_slices():
    eta = 0.1  # large, so that float32 resolves the rescale (the code's 0.001 gives about 1e-5)
    x, y = data()
    model = tiny_model(START)
    # two slices of five samples: samples 5-7 sit in the second
    params, rescale = authors_rescale(model, *module_state(model), x, y, eta, chunk=5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])

    rhos = hand_rhos(START, XS, YS)
    assert min(abs(eta * r) for r in rhos) > 50 * 1e-5  # every change is 50x the tolerance below
    want = rescaled(START, eta, rhos)
    assert_scalars_close(scalars(model), want, rtol=1e-5)
    assert rescale == pytest.approx(max(abs(eta * r) for r in rhos), rel=1e-5)
    # the code's pairing, not each layer's own tensor: the head's factor comes from D.b's
    # gradient; the head's own weight would give 0 (softmax CE: its gradient's rows sum to 0)
    own = code_rhos(tiny_model(START), *module_state(tiny_model(START)), x, y, [8], chunk=10)[8]  # sample 8 x mean grad of E.w
    assert own == pytest.approx(0.0, abs=1e-7) and abs(rhos[2]) > 1e-3


def test_one_slice_and_two_slices_agree():
    x, y = data()
    model = tiny_model(START)
    one = code_rhos(model, *module_state(model), x, y, [5, 6, 7], chunk=len(x))
    two = code_rhos(model, *module_state(model), x, y, [5, 6, 7], chunk=3)  # slices of 3: sample 5 and 6-7 apart
    for j, r in zip((5, 6, 7), hand_rhos(START, XS, YS)):
        assert one[j] == pytest.approx(r, rel=1e-5)
        assert two[j] == pytest.approx(one[j], rel=1e-5)  # float32 sums in another order


def test_fit_is_fedavg_then_the_rescale():
    """Local training is FedAvg's (same steps, same optimiser); only the masked layers change,
    by the hand-computed factors at FedAvg's trained weights (eta = the round's lr)."""
    x, y = data()
    cfg = {"optimizer": "adam", "momentum": 0.0, "learning-rate": 0.05, "batch-size": 4, "local-epochs": 1}
    plain = make_client(fedavg.UPDATE, {"strategy": "fedavg", **cfg}, x, y)
    plain.model = tiny_model(START)
    pgvc = make_client(fedpgvc.UPDATE, {"strategy": "fedpgvc", "pgvc-variant": "authors", **cfg},
                       x, y)
    pgvc.model = tiny_model(START)
    start = get_weights(tiny_model(START))
    plain_reply, n, plain_metrics = plain.fit(start, {"server-round": 1})
    pgvc_reply, _, metrics = pgvc.fit(start, {"server-round": 1})
    assert n == len(x) and metrics["num_steps"] == plain_metrics["num_steps"] == 3
    assert metrics["train_loss"] == plain_metrics["train_loss"]

    trained = reply_scalars(plain_reply)
    assert abs(trained["C.w"] - START["C.w"]) > 1e-3  # training moved the weights
    want = rescaled(trained, 0.05, hand_rhos(trained, XS, YS))
    got = reply_scalars(pgvc_reply)
    for k in ("A.w", "A.b", "B.w", "B.b"):  # outside the mask: FedAvg's weights exactly
        assert got[k] == trained[k]
    assert_scalars_close(got, want, rtol=1e-5)


def test_lenet_rescales_its_three_linear_layers_with_the_codes_indices():
    model = build_model("lenet", input_shape("mnist"))
    assert [type(m).__name__ for _, m in keras_layers(model)] == [
        "Conv2d", "MaxPool2d", "Conv2d", "MaxPool2d", "Flatten", "Linear", "Linear", "Linear"]
    assert pgvc_code_layers(model) == [(5, ["body.9.weight", "body.9.bias"]),
                                       (6, ["body.12.weight", "body.12.bias"]),
                                       (7, ["head.weight", "head.bias"])]
    tensors = [n for n, _ in model.named_parameters()]
    assert (tensors[5], tensors[6], tensors[7]) == ("body.9.bias", "body.12.weight", "body.12.bias")


def strategy(model: str, variant: str):
    cfg = validate_config({"strategy": "fedpgvc", "dataset": "mnist", "model": model, "pgvc-variant": variant})
    return FedPGVCStrategy.from_config(cfg, **fedavg_kwargs(cfg, None, None))


def test_a_model_unlike_the_codes_is_refused_at_start():
    with pytest.raises(ConfigError, match=r"'model' = 'lenet-bn' is invalid with pgvc-variant.*valid choices: lenet$"):
        strategy("lenet-bn", "authors")
    strategy("lenet", "authors")
    strategy("lenet-bn", "text")  # the text reading needs two Linear layers only


def test_unknown_variant_is_refused():
    with pytest.raises(ConfigError, match="pgvc-variant"):
        validate_config({"strategy": "fedpgvc", "dataset": "mnist", "model": "lenet", "pgvc-variant": "code"})


def test_too_few_samples_for_the_codes_pairing_is_a_clear_error():
    x, y = data()
    with pytest.raises(ValueError, match="rho_7 needs the loss of sample 7; this client has 7 samples"):
        code_rhos(tiny_model(START), *module_state(tiny_model(START)), x[:7], y[:7], [5, 6, 7], chunk=4)
