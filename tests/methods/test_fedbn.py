"""FedBN: the client's BN state is its own across rounds; non-BN entries are averaged."""


import numpy as np
import pytest
import torch
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from clients import fedavg, fedbn
from fl_app.config import ConfigError
from fl_app.registry import validate_config
from protocol.layout import bn_indices
from strategies.fedbn import FedBNStrategy
from tests.kit import fit_res, make_client


def test_fedbn_requires_a_bn_model():
    with pytest.raises(ConfigError, match="batch-norm"):
        FedBNStrategy.from_config(validate_config({"strategy": "fedbn", "dataset": "mnist", "model": "lenet"}))
    # "cnn" is refused with its BN twin named, never swapped silently (the config keeps "cnn")
    assert validate_config({"strategy": "fedbn", "dataset": "mnist", "model": "cnn"})["model"] == "cnn"
    with pytest.raises(ConfigError, match="set model = 'cnn-bn'"):
        FedBNStrategy.from_config(validate_config({"strategy": "fedbn", "dataset": "mnist", "model": "cnn"}))
    strategy = FedBNStrategy.from_config(validate_config({"strategy": "fedbn", "dataset": "mnist", "model": "cnn-bn"}))
    assert len(strategy.bn) == 10  # 2 BN layers x (weight, bias, mean, var, count)


def test_fedbn_client_keeps_its_bn_state():
    torch.manual_seed(0)
    x, y = torch.randn(6, 1, 28, 28), torch.arange(6)
    client = make_client(
        fedbn.UPDATE, {"strategy": "fedbn", "dataset": "mnist", "model": "cnn-bn", "batch-size": 6}, x, y
    )
    bn = bn_indices(client.model)
    w1 = client.get_parameters({})
    out1, _, _ = client.fit([a.copy() for a in w1], {"server-round": 1})
    assert [a.shape for a in out1] == [a.shape for a in w1]  # same count and shapes as sent
    # the server sends different values for every entry, BN included
    bn0 = bn_indices(client.model)
    w2 = [
        (a + 100 if i in bn0 else a + 0.01) if np.issubdtype(a.dtype, np.floating) else a + 1000
        for i, a in enumerate(out1)
    ]
    received, extras = client.split_received(w2)
    assert extras == {}  # FedBN receives nothing after the weights
    for i in range(len(w2)):
        np.testing.assert_array_equal(received[i], out1[i] if i in bn else w2[i])
    out2, _, _ = client.fit([a.copy() for a in w2], {"server-round": 2})
    assert [a.shape for a in out2] == [a.shape for a in w1]
    names = list(client.model.state_dict())
    for i in bn:
        if names[i].endswith("num_batches_tracked"):
            assert int(out2[i]) == 2  # one local step per round, counted locally; not 1001
        else:
            assert np.abs(out2[i] - out1[i]).max() < 1.0  # continued from the local BN, not +100
    non_bn = [i for i in range(len(w2)) if i not in bn]
    assert all(np.abs(out2[i] - w2[i]).max() < 1.0 for i in non_bn)  # started from the received


def test_fedbn_server_averages_non_bn_and_never_sends_client_bn():
    evaluated = []
    strategy = FedBNStrategy(bn=[1], evaluate_fn=lambda r, arrays, cfg: evaluated.append(arrays) or (0.0, {}))
    w_t = [np.zeros(3, np.float32), np.ones(2, np.float32)]
    a = [np.array([1, 2, 3], np.float32), np.array([5, 5], np.float32)]
    b = [np.array([4, 5, 6], np.float32), np.array([9, 9], np.float32)]
    strategy.global_weights = w_t
    params, _ = strategy.aggregate_fit(1, [(None, fit_res(a, 1)), (None, fit_res(b, 3))], [])
    new = parameters_to_ndarrays(params)
    np.testing.assert_allclose(new[0], (a[0] + 3 * b[0]) / 4)  # n_k-weighted mean
    np.testing.assert_array_equal(new[1], w_t[1])  # BN entries as sent, no client's values
    strategy.evaluate(1, ndarrays_to_parameters(new))
    np.testing.assert_allclose(evaluated[-1][1], (a[1] + 3 * b[1]) / 4)  # evaluation only


def test_a_batchnorm_client_whose_data_leaves_a_last_batch_of_one_trains():
    """7 samples at batch 6 leave a last batch of one sample, on which a BatchNorm layer cannot
    train (PyTorch raises 'Expected more than 1 value per channel'): that client failed every
    round (seen on MNIST Dir(0.5), 10 clients, lenet-bn). The batch is skipped: one step per
    epoch, over 6 samples; a model without BatchNorm still takes both steps."""
    torch.manual_seed(0)
    x, y = torch.randn(7, 1, 28, 28), torch.arange(7)
    client = make_client(fedbn.UPDATE, {"strategy": "fedbn", "dataset": "mnist", "model": "lenet-bn",
                                       "batch-size": 6, "local-epochs": 2}, x, y)
    _, n, metrics = client.fit(client.get_parameters({}), {"server-round": 1})
    assert n == 7 and metrics["num_steps"] == 2  # one batch of 6 per epoch
    plain = make_client(fedavg.UPDATE, {"dataset": "mnist", "model": "lenet", "batch-size": 6, "local-epochs": 2}, x, y)
    assert plain.fit(plain.get_parameters({}), {"server-round": 1})[2]["num_steps"] == 4
    from tasks.train import batches, min_train_batch

    conv_bn = make_client(fedbn.UPDATE, {"strategy": "fedbn", "dataset": "mnist", "model": "cnn-bn", "batch-size": 6,
                                        "local-epochs": 2}, x, y)
    assert conv_bn.fit(conv_bn.get_parameters({}), {"server-round": 1})[2]["num_steps"] == 4  # BatchNorm2d: no skip
    assert min_train_batch(conv_bn.model) == 1
    assert min_train_batch(client.model) == 2 and min_train_batch(plain.model) == 1
    # the skipped batch draws nothing: the generator's stream is the same with and without it
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert [len(b) for b, _ in batches(x, y, 6, g1, min_size=2)] == [6]
    assert [len(b) for b, _ in batches(x, y, 6, g2)] == [6, 1]
    assert torch.equal(torch.randperm(7, generator=g1), torch.randperm(7, generator=g2))
