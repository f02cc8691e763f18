"""Every registered method's round on real data: two clients of a seeded MNIST sample
on ``cnn-small``, 10 SGD steps of 8 images each, through the cohort path (both clients in one
``torch.func.vmap``, ``fl_app.node.cohort_client.train_cohort``) against each client's own
``local_round`` (the per-client path): the same steps, weights, client state and reply (the
arrays sent back beyond the weights) within ``REL``, the fit metrics within ``REL`` too. The
synthetic-data checks (tests/test_functional*.py, tests/training/test_cohort.py) run ``logreg``/``mlp``
or random images; this one runs the convolution, the dead ReLU units and the skewed features of
real digits, where FedDecorr's batched and per-client paths part.

Tolerance ``REL`` = 2e-5 of each array's largest magnitude, in float32. vmap's batched kernels
sum in another order, so the paths differ by float rounding only. Measured on this case (2-core
CPU): weights at most 6.7e-7 relative (FedPGVC; 2.2-3.3e-7 for the others), state and reply at
most 5.8e-6 (SCAFFOLD's and FedPVR's c_i, a difference (w_t - w) / (K lr) that cancels about
one digit), metrics at most 1.6e-7. 2e-5 is about 3x the worst; a difference in what the paths
compute (a client fed another batch, a state or a mask misapplied) moves them by 1e-3 or more.
The case is not arbitrary for FedSMOO: on 2 x 5 steps of 8 images its state (``mu``) parted by
4.1e-4 and its weights by 3.2e-5, on 2 x 20 steps of 16 by 1.9e-4 and 4.4e-6, while float64
agrees to 3e-15 (measured; not examined further here).

FedDecorr runs in float64 (held to 1e-9; measured 2e-12), not float32: its decorrelation term's
own dynamics, not either path, amplify rounding. In float32 the paths part by 4e-3 relative
here (0.1-1 after 20 steps of 64 images); in exact arithmetic (float64) a relative 1e-12 change
of the starting weights grows to 2e-5 over 20 steps (FedAvg: 1.5e-12), and in float32 one ulp
of the input moves a client's own per-client round by 0.1-0.3 (FedAvg: 2.4e-7), as much as the
cohort's summation order does. See clients/feddecorr.py, "Precision". In float64 both paths
still run every line of the method, so a real difference between them would show.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_app.registry import method_names
from tests.kit import assert_cohort_equals_per_client, initial_weights, make_client

BATCH, STEPS, CLIENTS = 8, 10, 2
REL = 2e-5  # float32 (module docstring)
REL_FLOAT64 = 1e-9
FLOAT64 = {"feddecorr"}  # methods whose float32 rounds amplify rounding (module docstring)
KEYS = {
    "dp-fedavg": {"dp-mode": "server"},  # client-side clipping is a client mod, refused on a cohort node
    "ri-fedavg": {"ri-directions": 2, "ri-points": 3, "ri-samples": 16},  # its prepare step, kept cheap
}


@pytest.fixture(scope="module")
def digits(mnist_sample) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIENTS x STEPS x BATCH training images of the seeded MNIST sample, normalised as a
    client loads them (skips without the offline data)."""
    return training_tensors(mnist_sample(CLIENTS * STEPS * BATCH, 10))


def training_tensors(folder, shuffled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The training images and labels of the MNIST sample in ``folder``, normalised as a client
    loads them; ``shuffled``: in a seeded random order (the sample is sorted by label)."""
    import pyarrow.parquet as pq

    from tasks.datasets import DATASETS, decode_images, normalise

    table = pq.read_table(folder / "mnist" / "train.parquet")
    if shuffled:
        table = table.take(np.random.default_rng(0).permutation(table.num_rows))
    info = DATASETS["mnist"]
    images = decode_images(table.column(info.image_column).to_pylist(), None, info)
    return normalise(images, np.array(table.column(info.label_column)), info)


@pytest.mark.parametrize("method", method_names())
def test_cohort_equals_per_client_on_mnist(method, digits):
    x, y = digits
    per = STEPS * BATCH
    keys = {"dataset": "mnist", "model": "cnn-small", "batch-size": BATCH, "learning-rate": 0.05,
            **KEYS.get(method, {})}
    clients = [make_client(method, keys, x[k * per:(k + 1) * per], y[k * per:(k + 1) * per], partition=k,
                            num_partitions=CLIENTS) for k in range(CLIENTS)]
    wide = method in FLOAT64
    assert_cohort_equals_per_client(clients, initial_weights(clients[0]), rel=REL_FLOAT64 if wide else REL,
                                    float64=wide)


def unbatched_methods() -> list[str]:
    """The methods whose update a cohort node trains one client at a time (``unbatched``)."""
    from fl_app.registry import get_method

    return [m for m in method_names() if get_method(m).update.unbatched]


def test_fedDecorr_is_declared_unbatched():
    assert "feddecorr" in unbatched_methods()


@pytest.mark.parametrize("method", unbatched_methods())
def test_a_cohort_node_trains_an_unbatched_method_exactly_as_its_per_client_round(method, mnist_sample):
    """An ``unbatched`` update (FedDecorr's) on a 2-round run's setting: real MNIST, float32,
    ``cnn-small``, one cohort node hosting 4 clients (40 steps of 8 images each). The cohort node
    (``fl_app.node.cohort_client.train``) runs at 2 torch threads, as one cohort node on this
    2-core machine does, while a per-client Ray actor runs at its CPU share, 1 thread: with
    ``client-threads`` = 1 (what the runner sets, ``runner/launch.py``) each client's round is its
    per-client round at 1 thread bit for bit, weights and metrics. Without it (0: the node's 2
    threads) the thread count's summation order alone moves FedDecorr's rounds by 0.02-1.1
    relative (measured), which the last assertion checks, so that this case can tell the two."""
    from fl_app.node.cohort_client import train
    from tasks.functional import local_round

    clients_n, steps, batch = 4, 40, 8
    per = steps * batch
    x, y = training_tensors(mnist_sample(clients_n * per, 10), shuffled=True)
    keys = {"dataset": "mnist", "model": "cnn-small", "batch-size": batch, "learning-rate": 0.05}
    clients = [make_client(method, keys, x[k * per:(k + 1) * per], y[k * per:(k + 1) * per], partition=k,
                            num_partitions=clients_n) for k in range(clients_n)]
    weights, config = initial_weights(clients[0]), {"server-round": 3}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [local_round(c.prepare_round(weights, config)) for c in clients]
        torch.set_num_threads(2)
        node = train([c.prepare_round(weights, config) for c in clients], client_threads=1)
        assert torch.get_num_threads() == 2  # the node's own threads restored
        node_threads = train([c.prepare_round(weights, config) for c in clients], client_threads=0)
    finally:
        torch.set_num_threads(before)
    for k, (a, b) in enumerate(zip(alone, node)):
        for name, value in a.params.items():
            assert torch.equal(b.params[name], value), f"client {k} {name}"
        assert b.metrics == a.metrics
    moved = max(float((b.params[n] - a.params[n]).abs().max() / a.params[n].abs().max())
                for a, b in zip(alone, node_threads) for n in a.params)
    assert moved > 1e-3
