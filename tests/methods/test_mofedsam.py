"""MoFedSAM (Qu et al., ICML 2022): the client's mixed SAM step against a hand computation
(float64, the one-weight model), α = 1 as FedSAM bit for bit, each term active, the cohort
against the per-client path, FedCM's server under MoFedSAM's own keys, and a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients import fedsam, mofedsam
from strategies.mofedsam import MoFedSAMStrategy
from strategies.parts import ClientMomentum
from tests.kit import assert_cohort_matches, assert_same_rounds, crash_and_resume
from tests.kit_training import linear_round, values, weight

W_T, DELTA, ALPHA, RHO, LR = (0.2, -0.1), (0.3, -0.4), 0.25, 0.7, 0.5


def softmax_grad(w):
    """The hand model's cross-entropy gradient softmax(w) - e_0."""
    e = np.exp(np.asarray(w) - max(w))
    return e / e.sum() - np.array([1.0, 0.0])


def sam_grad(w):
    g = softmax_grad(w)
    return softmax_grad(w + RHO * g / (np.linalg.norm(g) + 1e-12))


def keys(alpha=ALPHA):
    return {"mofedsam-alpha": alpha, "mofedsam-rho": RHO}


def test_client_steps_match_hand_computation():
    w0, delta = np.array(W_T), np.array(DELTA)
    w1 = w0 - LR * (ALPHA * sam_grad(w0) + (1 - ALPHA) * delta)
    w2 = w1 - LR * (ALPHA * sam_grad(w1) + (1 - ALPHA) * delta)
    result = linear_round(mofedsam.UPDATE, keys(), W_T, server={"delta": weight(DELTA)})
    assert values(result.params) == pytest.approx(w2.tolist(), abs=1e-12)
    assert result.state == {} and result.reply == {}


def test_each_term_acts_and_alpha_one_is_fedsam_bit_for_bit():
    sam = linear_round(fedsam.UPDATE, {"sam-rho": RHO}, W_T)
    one = linear_round(mofedsam.UPDATE, keys(1.0), W_T, server={"delta": weight(DELTA)})
    assert torch.equal(one.params["weight"], sam.params["weight"])
    mixed = linear_round(mofedsam.UPDATE, keys(), W_T, server={"delta": weight(DELTA)})
    unperturbed = linear_round(mofedsam.UPDATE, {**keys(), "mofedsam-rho": 1e-9}, W_T, server={"delta": weight(DELTA)})
    for a, b in ((sam, mixed), (unperturbed, mixed)):  # the momentum term acts; so does the perturbation
        assert np.abs(np.subtract(values(a.params), values(b.params))).max() > 1e-3


def test_server_is_fedcms_part_under_its_own_keys():
    part = MoFedSAMStrategy.SERVER.parts["momentum"]
    assert part == ClientMomentum("mofedsam-server-lr", record="mofedsam", metric="mofedsam_delta_norm")
    assert set(MoFedSAMStrategy.CONFIG_KEYS) == {"mofedsam-server-lr"}


def test_cohort_equals_per_client():
    def server(shapes):
        gen = torch.Generator().manual_seed(1)
        return {"delta": {n: 0.1 * torch.randn(s, generator=gen) for n, s in shapes.items()}}
    assert_cohort_matches(mofedsam.UPDATE, keys(0.3), server=server)


def test_resume_sends_the_same_direction(tmp_path):
    full, resumed = crash_and_resume({"strategy": "mofedsam", "mofedsam-alpha": 0.5}, tmp_path)
    assert_same_rounds(full, resumed, ("mofedsam_delta_norm",), start=2)
