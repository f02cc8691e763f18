"""FedLESAM (Fan et al., ICML 2024): the client's one-pass perturbed step against a hand
computation (float64, the one-weight model) in both readings, a zero direction as FedAvg bit for
bit, the state kept by the paper's reading, the cohort against the per-client path, FedCM's
server under FedLESAM's own keys, a bad key refused, and a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients import fedavg, fedlesam
from fl_app.registry import validate_config
from protocol.keys import ConfigError
from strategies.fedlesam import FedLESAMStrategy
from strategies.parts import ClientMomentum
from tests.kit import assert_cohort_matches, assert_same_rounds, crash_and_resume
from tests.kit_training import linear_round, values, weight

W_T, DELTA, OLD, RHO, LR = (0.2, -0.1), (0.3, -0.4), (0.5, 0.6), 0.7, 0.5


def softmax_grad(w):
    """The hand model's cross-entropy gradient softmax(w) - e_0."""
    e = np.exp(np.asarray(w) - max(w))
    return e / e.sum() - np.array([1.0, 0.0])


def hand_round(v):
    """Two SGD steps on grad f(w + eps), eps = rho v / (||v|| + 1e-12) fixed for the round."""
    eps = RHO * np.asarray(v) / (np.linalg.norm(v) + 1e-12)
    w = np.array(W_T)
    for _ in range(2):
        w = w - LR * softmax_grad(w + eps)
    return w


def keys(direction="server"):
    return {"fedlesam-rho": RHO, "fedlesam-direction": direction}


def test_server_direction_matches_hand_computation():
    result = linear_round(fedlesam.UPDATE, keys(), W_T, server={"delta": weight(DELTA)})
    assert values(result.params) == pytest.approx(hand_round(DELTA).tolist(), abs=1e-12)
    assert result.state == {} and result.reply == {}


def test_client_direction_is_old_global_minus_current_and_keeps_w_t():
    result = linear_round(fedlesam.UPDATE, keys("client"), W_T, state={"old": weight(OLD)},
                          server={"delta": weight(DELTA)})
    v = np.subtract(OLD, W_T)
    assert values(result.params) == pytest.approx(hand_round(v).tolist(), abs=1e-12)
    assert values(result.state["old"]) == list(W_T)  # the received model, not the trained one


def test_zero_direction_is_fedavg_bit_for_bit_and_the_perturbation_acts():
    plain = linear_round(fedavg.UPDATE, {}, W_T)
    for direction, state in (("server", None), ("client", None)):  # round 1 / a client's first round
        first = linear_round(fedlesam.UPDATE, keys(direction), W_T, state=state)
        assert torch.equal(first.params["weight"], plain.params["weight"])
    moved = linear_round(fedlesam.UPDATE, keys(), W_T, server={"delta": weight(DELTA)})
    assert np.abs(np.subtract(values(moved.params), values(plain.params))).max() > 1e-3


def test_server_is_fedcms_part_under_its_own_keys_and_bad_keys_refused():
    part = FedLESAMStrategy.SERVER.parts["momentum"]
    assert part == ClientMomentum("fedlesam-server-lr", record="fedlesam", metric="fedlesam_delta_norm")
    assert set(FedLESAMStrategy.CONFIG_KEYS) == {"fedlesam-server-lr"}
    base = {"strategy": "fedlesam", "dataset": "synthetic", "model": "logreg"}
    with pytest.raises(ConfigError, match="fedlesam-direction.*server.*client"):
        validate_config({**base, "fedlesam-direction": "local"})
    for name in ("fedlesam-rho", "fedlesam-server-lr"):
        with pytest.raises(ConfigError, match=name):
            validate_config({**base, name: 0.0})


@pytest.mark.parametrize("direction", ["server", "client"])
def test_cohort_equals_per_client(direction):
    def server(shapes):
        gen = torch.Generator().manual_seed(1)
        return {"delta": {n: 0.1 * torch.randn(s, generator=gen) for n, s in shapes.items()}}

    def states(shapes, k):  # client 1 is sampled for the first time
        gen = torch.Generator().manual_seed(2 + k)
        return {} if k == 1 else {"old": {n: torch.randn(s, generator=gen) for n, s in shapes.items()}}
    assert_cohort_matches(fedlesam.UPDATE, keys(direction), states=states, server=server)


@pytest.mark.parametrize("direction", ["server", "client"])
def test_resume_sends_the_same_direction(tmp_path, direction):
    full, resumed = crash_and_resume({"strategy": "fedlesam", "fedlesam-direction": direction}, tmp_path)
    assert_same_rounds(full, resumed, ("fedlesam_delta_norm",), start=2)
