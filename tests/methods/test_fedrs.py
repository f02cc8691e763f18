"""FedRS (clients/fedrs.py): the restricted softmax's round by hand in float64 (both scalings),
alpha = 1 is FedAvg bit for bit, the label counts come from the client's training split, and
the cohort path trains each client as its own round does.

The hand case (tests/kit_training.py, shared with tests/methods/test_fedlc.py): logits z = W x + b, W = 0 (3 x 2), b = (0, 0, 1);
one batch x1 = (1, 0), y1 = 0; x2 = (0, 1), y2 = 1; the client's counts n = (16, 1, 0); plain SGD
lr 0.1, two steps on the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.fedrs import restriction
from tests.kit import assert_cohort_equals_per_client, initial_weights, make_client
from tests.kit_training import adjusted_round64, fedrs_hand_round


def test_restriction_factors_by_hand():
    counts = torch.tensor([16.0, 1.0, 0.0])
    assert restriction(counts, 0.5, "hard").tolist() == [1.0, 1.0, 0.5]
    assert restriction(counts, 0.5, "count").tolist() == [1.0, 0.5 + 0.5 / 16, 0.5]
    assert restriction(counts, 1.0, "count").tolist() == [1.0, 1.0, 1.0]


def test_hard_restriction_round_by_hand():
    """alpha = 0.5, hard: s = (1, 1, 0.5). The missing class's bias falls half as fast as FedAvg's
    (0.9554 against 0.8880) and its weights move, damped."""
    result = fedrs_hand_round("fedrs", {"fedrs-alpha": 0.5, "fedrs-scaling": "hard"})
    W, b, losses = adjusted_round64(np.array([1.0, 1.0, 0.5]), np.zeros(3))
    np.testing.assert_allclose(b, [0.0445546, 0.0445546, 0.9554454], atol=1e-7)  # the worked numbers
    np.testing.assert_allclose(W, [[0.0719269, -0.0273723], [-0.0273723, 0.0719269], [-0.0222773, -0.0222773]],
                               atol=1e-7)
    np.testing.assert_allclose(losses, [1.294377, 1.246901], atol=1e-6)
    np.testing.assert_allclose(result.params["head.weight"].numpy(), W, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.params["head.bias"].numpy(), b, rtol=0, atol=1e-12)
    assert result.metrics["train_loss"] == pytest.approx(np.mean(losses), rel=1e-6)
    fedavg_b = adjusted_round64(np.ones(3), np.zeros(3))[1]
    assert abs(fedavg_b[2] - b[2]) > 0.05  # the restriction is visible


@pytest.mark.parametrize("alpha,bias,missing_row,losses", [
    (0.3, [0.0398648, 0.0398648, 0.9760811], [-0.0119594, -0.0119594], [1.208918, 1.169890]),
    (0.0, [0.0330533, 0.0330533, 1.0], [0.0, 0.0], [np.log(3), 1.065558]),
])
def test_hard_restriction_at_asymmetric_alpha_by_hand(alpha, bias, missing_row, losses):
    """alpha != 1 - alpha: s = (1, 1, alpha), the missing class scaled by alpha itself (at 0.5
    alpha and 1 - alpha agree, so the 0.5 case cannot tell them apart). At alpha = 0 the missing
    class's logit is 0: its row and bias do not move and the first loss is ln 3."""
    assert restriction(torch.tensor([16.0, 1.0, 0.0], dtype=torch.float64), alpha, "hard").tolist() == [1.0, 1.0, alpha]
    result = fedrs_hand_round("fedrs", {"fedrs-alpha": alpha, "fedrs-scaling": "hard"})
    W, b, hand_losses = adjusted_round64(np.array([1.0, 1.0, alpha]), np.zeros(3))
    np.testing.assert_allclose(b, bias, atol=1e-7)  # the worked numbers
    np.testing.assert_allclose(W[2], missing_row, atol=1e-7)
    np.testing.assert_allclose(hand_losses, losses, atol=1e-6)
    np.testing.assert_allclose(result.params["head.weight"].numpy(), W, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.params["head.bias"].numpy(), b, rtol=0, atol=1e-12)
    assert result.metrics["train_loss"] == pytest.approx(np.mean(hand_losses), rel=1e-6)


def test_count_restriction_round_by_hand():
    """FedRepo's factor: s = (1, 0.53125, 0.5); the rare observed class 1 is damped too."""
    result = fedrs_hand_round("fedrs", {"fedrs-alpha": 0.5, "fedrs-scaling": "count"})
    W, b, losses = adjusted_round64(np.array([1.0, 0.53125, 0.5]), np.zeros(3))
    np.testing.assert_allclose(b, [0.0443650, 0.0239311, 0.9552941], atol=1e-7)
    np.testing.assert_allclose(W[1], [-0.0145079, 0.0384390], atol=1e-7)
    np.testing.assert_allclose(losses, [1.294377, 1.261183], atol=1e-6)
    np.testing.assert_allclose(result.params["head.weight"].numpy(), W, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.params["head.bias"].numpy(), b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scaling", ["hard", "count"])
def test_alpha_one_is_fedavg_bit_for_bit(scaling):
    ours = fedrs_hand_round("fedrs", {"fedrs-alpha": 1.0, "fedrs-scaling": scaling})
    fedavg = fedrs_hand_round("fedavg", {})
    for name in fedavg.params:
        assert torch.equal(ours.params[name], fedavg.params[name])
    assert ours.metrics == fedavg.metrics


def test_counts_are_of_the_training_split_and_the_heads_classes():
    """``count_labels`` (FedRS's and FedLC's prepare step) counts the examples the client trains
    on: with a local test split held out, those of the training split only; one count per class
    of the head, zeros included. A label outside the head's classes is refused in one line."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 60, generator=gen), torch.randint(0, 4, (40,), generator=gen)
    client = make_client("fedrs", {"client-test-fraction": 0.25}, x, y)
    client.use_data((x[10:], y[10:]), (x[:10], y[:10]))
    job = client.prepare_round(initial_weights(client), {"server-round": 1})
    counts = job.state["label_counts"]
    assert counts.tolist() == torch.bincount(y[10:], minlength=10).tolist()
    assert len(counts) == 10 and counts[4:].sum() == 0 and counts.sum() == 30
    bad = make_client("fedrs", {}, x, torch.full((40,), 10))
    with pytest.raises(ValueError, match="fedrs: label 10 on a model with 10 classes"):
        bad.prepare_round(initial_weights(bad), {"server-round": 1})


@pytest.mark.parametrize("scaling", ["hard", "count"])
def test_cohort_trains_each_client_as_its_own_round(scaling):
    """Three clients with different missing classes (one with every class) in one vmap, each
    against its ``local_round``, momentum and weight decay on, batches of 8 with a short last."""
    gen = torch.Generator().manual_seed(1)
    label_sets = [[0, 1], [2, 3, 4, 5, 6], list(range(10))]
    clients = []
    for k, (n, labels) in enumerate(zip([20, 13, 24], label_sets)):
        y = torch.tensor(labels)[torch.randint(0, len(labels), (n,), generator=gen)]
        clients.append(make_client("fedrs", {"fedrs-alpha": 0.3, "fedrs-scaling": scaling, "model": "mlp",
                                              "batch-size": 8, "local-epochs": 2, "momentum": 0.9,
                                              "weight-decay": 5e-4, "learning-rate": 0.05},
                                    torch.randn(n, 60, generator=gen), y, partition=k, num_partitions=3))
    assert_cohort_equals_per_client(clients, initial_weights(clients[0]))
