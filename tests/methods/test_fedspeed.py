"""FedSpeed (Sun et al., ICLR 2023): the local step (SAM gradient, prox-correction, merge, clip),
h_i, and the server's H and model against the research note's hand computation (float64); its
exact identity with FedSMOO (``smoo-s = none``) and its reductions to FedDyn (rho = 0) and FedSAM
(c = 0); state across rounds, the cohort path and a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import feddyn, fedsam, fedsmoo, fedspeed
from strategies.fedspeed import FedSpeedStrategy
from tests.kit import FakeManager, assert_cohort_matches, assert_same_rounds, crash_and_resume, fit_res, make_client
from tests.kit_training import linear_round, values, weight

W_T, H, C = (0.2, -0.1), (0.05, -0.02), 0.1
KEYS = {"fedspeed-rho": 0.1, "fedspeed-prox": C, "fedspeed-merge": 1.0, "fedspeed-clip-norm": 0.0}
W_K = (0.589234029, -0.492159029)
H_NEW = (0.439234029, -0.412159029)


def _round(keys=KEYS, h=H, epochs=2):
    state = {"grad": weight([-keys["fedspeed-prox"] * v for v in h])}  # kept as FedDyn's g_k = -c h_i
    return linear_round(fedspeed.UPDATE, keys, W_T, state=state, epochs=epochs)


def test_client_round_matches_hand_computation():
    result = _round()
    assert values(result.params) == pytest.approx(W_K, abs=1e-9)
    assert [-g / C for g in values(result.state["grad"])] == pytest.approx(H_NEW, abs=1e-9)
    assert result.reply == {} and result.metrics["num_steps"] == 2


def test_merge_mixes_the_plain_and_the_perturbed_gradient_by_hand():
    result = _round(keys={**KEYS, "fedspeed-merge": 0.5})
    assert values(result.params) == pytest.approx((0.5750234387, -0.4779484387), abs=1e-9)
    assert [-g / C for g in values(result.state["grad"])] == pytest.approx((0.4250234387, -0.3979484387), abs=1e-9)


def speed_round64(merge: float, steps: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """The hand case written out in float64 (logits w x at x = 1, label 0, lr 0.5): each step
    g = softmax(w) - e_0, e = rho g / ||g||, gtil = the same at w + e, merged (1 - m) g + m gtil,
    then w <- w - lr (gtil + c (w - w_t + h_i)); (w_K, h_i + w_K - w_t)."""
    w_t, h, w = np.array(W_T), np.array(H), np.array(W_T)

    def grad(v):
        p = np.exp(v - v.max())
        return p / p.sum() - np.array([1.0, 0.0])

    for _ in range(steps):
        g = grad(w)
        gtil = grad(w + KEYS["fedspeed-rho"] * g / (np.linalg.norm(g) + 1e-12))
        gtil = (1 - merge) * g + merge * gtil
        w = w - 0.5 * (gtil + C * (w - w_t + h))
    return w, h + (w - w_t)


@pytest.mark.parametrize("merge", [1.0, 0.5, 0.3])
def test_merge_weight_is_that_of_the_perturbed_gradient_by_hand(merge):
    """m = 0.3 weighs the perturbed gradient 0.3 and the plain one 0.7, (1 - m) g + m gtil: at
    0.5 the two readings agree, so only an m != 1/2 tells (1 - m) g + m gtil from (1 - m) gtil + m g.
    The written-out round reproduces the note's numbers at m = 1 and 0.5."""
    w_k, h_new = speed_round64(merge)
    worked = {1.0: (W_K, H_NEW), 0.5: ((0.5750234387, -0.4779484387), (0.4250234387, -0.3979484387)),
              0.3: ((0.5693172322, -0.4722422322), (0.4193172322, -0.3922422322))}[merge]
    assert w_k == pytest.approx(worked[0], abs=1e-9) and h_new == pytest.approx(worked[1], abs=1e-9)
    result = _round(keys={**KEYS, "fedspeed-merge": merge})
    assert values(result.params) == pytest.approx(w_k, abs=1e-12)
    assert [-g / C for g in values(result.state["grad"])] == pytest.approx(h_new, abs=1e-12)


def test_clip_scales_the_step_down_never_up():
    d1 = np.array([-0.45543821, 0.45843821])  # step 1's d (note), norm 0.6462; c w added after the clip
    clip = 0.5
    result = _round(keys={**KEYS, "fedspeed-clip-norm": clip}, epochs=1)
    dclip = (d1 - C * np.array(W_T)) * clip / (np.linalg.norm(d1 - C * np.array(W_T)) + 1e-6) + C * np.array(W_T)
    assert values(result.params) == pytest.approx(np.array(W_T) - 0.5 * dclip, abs=1e-8)
    loose = _round(keys={**KEYS, "fedspeed-clip-norm": 10.0}, epochs=1)
    assert values(loose.params) == pytest.approx(np.array(W_T) - 0.5 * d1, abs=1e-8)


def test_it_is_fedsmoo_without_s_bit_for_bit():
    mine = _round()
    smoo = linear_round(fedsmoo.UPDATE, {"smoo-rho": 0.1, "smoo-alpha": C, "smoo-s": "none", "smoo-clip-norm": 0.0},
                        W_T, state={"grad": weight([-C * v for v in H])})
    assert torch.equal(mine.params["weight"], smoo.params["weight"])
    assert torch.equal(mine.state["grad"]["weight"], smoo.state["grad"]["weight"])


def test_rho_zero_is_the_feddyn_client_and_prox_zero_the_fedsam_client():
    dyn = linear_round(feddyn.UPDATE, {"feddyn-alpha": C}, W_T)
    mine = _round(keys={**KEYS, "fedspeed-rho": 0.0}, h=(0.0, 0.0))
    assert torch.equal(mine.params["weight"], dyn.params["weight"])
    sam = linear_round(fedsam.UPDATE, {"sam-rho": 0.1}, W_T)
    mine = _round(keys={**KEYS, "fedspeed-prox": 0.0}, h=(0.0, 0.0))
    assert torch.equal(mine.params["weight"], sam.params["weight"])


def fedspeed_server(**kwargs) -> FedSpeedStrategy:
    """FedSpeed's server, prox coefficient C, for the one-entry (2, 1) model of these tests."""
    memory = FedSpeedStrategy.SERVER.parts["memory"].part([True], C)
    return FedSpeedStrategy(parts={"memory": memory}, num_state=1, **kwargs)


def test_server_h_and_model_by_hand():
    strategy = fedspeed_server(fraction_fit=0.25, min_fit_clients=1, min_available_clients=1, accept_failures=True)
    strategy.memory.H = [np.array(H).reshape(2, 1) / 4]  # the one client with history is the one that replies
    instructions = strategy.configure_fit(2, ndarrays_to_parameters([np.array(W_T).reshape(2, 1)]), FakeManager(4))
    assert len(parameters_to_ndarrays(instructions[0][1].parameters)) == 1  # the weights only
    params, metrics = strategy.aggregate_fit(2, [(instructions[0][0], fit_res([np.array(W_K).reshape(2, 1)], 5))], [])
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0].ravel(), (0.6990425362, -0.5951987862), atol=1e-9)
    assert metrics["fedspeed_H_norm"] == pytest.approx(np.hypot(*H_NEW) / 4, rel=1e-8)
    restored = fedspeed_server()
    restored.set_state(strategy.get_state())
    np.testing.assert_array_equal(restored.memory.H[0], strategy.memory.H[0])


def test_h_carried_across_rounds_through_context_state():
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(9, 60, generator=gen), torch.randint(0, 10, (9,), generator=gen)
    overrides = {"strategy": "fedspeed", "learning-rate": 0.3, "batch-size": 4}
    client = make_client(fedspeed.UPDATE, overrides, x, y)
    w0 = client.get_parameters({})
    first, _, _ = client.fit([a.copy() for a in w0], {"server-round": 1})
    assert len(first) == len(w0) and "feddyn-grad" in client.context.state
    again = make_client(fedspeed.UPDATE, overrides, x, y, context=client.context)
    second, _, _ = again.fit([a.copy() for a in w0], {"server-round": 2})
    fresh, _, _ = make_client(fedspeed.UPDATE, overrides, x, y).fit([a.copy() for a in w0], {"server-round": 2})
    assert not np.allclose(second[0], fresh[0], atol=1e-6)  # round 2 used h_i


@pytest.mark.parametrize("merge,clip", [(1.0, 0.0), (0.5, 0.5)])
def test_cohort_equals_the_per_client_rounds(merge, clip):
    def states(shapes, k):
        gen = torch.Generator().manual_seed(40 + k)
        return {"grad": {n: 0.05 * torch.randn(s, generator=gen) for n, s in shapes.items()}}

    assert_cohort_matches(fedspeed.UPDATE, {**KEYS, "fedspeed-merge": merge, "fedspeed-clip-norm": clip}, states)


def test_resume_restores_client_and_server_state(tmp_path):
    """Rounds 3-4 of a run crashed after round 2 and resumed by a new server and new nodes equal
    an uninterrupted run's: H from the checkpoint, h_i from the clients' mirrors."""
    full, resumed = crash_and_resume({"strategy": "fedspeed"}, tmp_path)
    assert float(full[1]["fedspeed_H_norm"]) > 0
    assert_same_rounds(full, resumed, ("fedspeed_H_norm",), start=2)
