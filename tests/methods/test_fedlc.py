"""FedLC (clients/fedlc.py): the calibrated round by hand in float64, a missing class leaves the
client's softmax (its head row untouched, never NaN), tau = 0 is FedAvg bit for bit, and the
cohort path trains each client as its own round does. The hand case is tests/methods/test_fedrs.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.fedlc import calibration
from tests.kit import assert_cohort_equals_per_client, initial_weights, make_client
from tests.kit_training import adjusted_round64, fedrs_hand_round


def test_offsets_by_hand():
    """delta_c = tau n_c^(-1/4): 16 -> tau / 2, 1 -> tau, 0 -> +inf (never 0^(-1/4) * 0)."""
    assert calibration(torch.tensor([16.0, 1.0, 0.0]), 1.0).tolist() == [0.5, 1.0, float("inf")]
    assert calibration(torch.tensor([81.0, 0.0]), 0.3).tolist() == pytest.approx([0.1, float("inf")])


@pytest.mark.parametrize("tau, final_b, first_loss", [
    (1.0, [-0.0236180, 0.0236180, 1.0], 0.724077),
    (0.1, [-0.00240508, 0.00240508, 1.0], 0.693460),
])
def test_calibrated_round_by_hand(tau, final_b, first_loss):
    """Offsets (0.5, 1, inf) tau: the majority class's bias goes DOWN (FedAvg's goes up, to
    0.0560), the missing class's bias and head row stay where they were."""
    result = fedrs_hand_round("fedlc", {"fedlc-tau": tau})
    W, b, losses = adjusted_round64(np.ones(3), tau * np.array([0.5, 1.0, np.inf]))
    np.testing.assert_allclose(b, final_b, atol=1e-7)  # the worked numbers
    assert losses[0] == pytest.approx(first_loss, abs=1e-6)
    if tau == 1.0:
        np.testing.assert_allclose(W, [[0.0375985, -0.0612165], [-0.0375985, 0.0612165], [0.0, 0.0]], atol=1e-7)
        assert losses[1] == pytest.approx(0.695033, abs=1e-6)
    np.testing.assert_allclose(result.params["head.weight"].numpy(), W, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.params["head.bias"].numpy(), b, rtol=0, atol=1e-12)
    assert result.metrics["train_loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    assert result.params["head.bias"][2] == 1.0 and not result.params["head.weight"][2].any()
    assert result.params["head.bias"][0] < 0  # the calibration is visible: FedAvg's b_0 is +0.056


def test_tau_zero_is_fedavg_bit_for_bit():
    ours, fedavg = fedrs_hand_round("fedlc", {"fedlc-tau": 0.0}), fedrs_hand_round("fedavg", {})
    for name in fedavg.params:
        assert torch.equal(ours.params[name], fedavg.params[name])
    assert ours.metrics == fedavg.metrics


def test_cohort_trains_each_client_as_its_own_round():
    """Three clients, two of them missing classes (infinite offsets inside the vmap), each
    against its ``local_round``; momentum and weight decay on, a short last batch."""
    gen = torch.Generator().manual_seed(2)
    label_sets = [[3, 7], [0, 1, 2, 4, 5], list(range(10))]
    clients = []
    for k, (n, labels) in enumerate(zip([20, 13, 24], label_sets)):
        y = torch.tensor(labels)[torch.randint(0, len(labels), (n,), generator=gen)]
        clients.append(make_client("fedlc", {"fedlc-tau": 0.5, "model": "mlp", "batch-size": 8, "local-epochs": 2,
                                              "momentum": 0.9, "weight-decay": 5e-4, "learning-rate": 0.05},
                                    torch.randn(n, 60, generator=gen), y, partition=k, num_partitions=3))
    assert_cohort_equals_per_client(clients, initial_weights(clients[0]))
