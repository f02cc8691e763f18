"""Noise-based feature skew (NIID-Bench's "noise-based feature imbalance"): client i of N
(partition id i - 1) sees its inputs with Gaussian noise of mean 0 and variance
``noise-sigma * i / N`` added, so the clients' feature distributions differ by a known amount
while their labels stay as the partitioner cut them. NIID-Bench pairs it with an IID split
(``partitioner = "iid"``); here it combines with any partitioner.

The noise is drawn in pixel units (pixels scaled to [0, 1], as NIID-Bench adds it to MNIST
after ``ToTensor``) and then carried into the normalised inputs (divided by the dataset's
per-channel std). It is drawn once per client from a generator seeded by the run's seed and
the partition id, so every process, node and execution path (per-client or cohort, which both
read ``tasks.partitioning.load_partition``) sees the same noisy inputs. The server's test and
validation splits are never touched; a client's local test split (``client-test-fraction``) is
its own data and gets the client's noise too.

``noise-reading`` chooses between the paper's words above (``"paper"``, the default, the noise
every kept result was run with) and what NIID-Bench's code does (``"code"``: its
``experiments.py`` with ``--noise_type level`` and ``utils.AddGaussianNoise``): partition p of
N gets noise of *standard deviation* ``noise-sigma * p / (N - 1)`` (partition 0 clean, the last
one ``noise-sigma``; with one client none), and the noise is drawn anew every time an example is
loaded, as a torchvision transform does. The code's noise is therefore added per training batch,
by the client's augmentation callable (``tasks.augment.Augment``, seeded by the run's seed, the
partition and the round, called by ``tasks.functional`` on the per-client and the cohort path
alike, after crop and flip as NIID-Bench's transform adds it after its random crop and flip), not
to the partition's tensors. A client's local test split, scored once per evaluation, gets one
draw of the code's noise here. (NIID-Bench's code also scores the global model on every party's
noisy copy of the test split; fl-drift's server scores the clean test split under both readings.)
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.catalogue import DatasetInfo
from tasks.partition_spec import PartitionSpec


def noise_variance(spec: PartitionSpec, partition_id: int) -> float:
    """The pixel-unit variance of client ``partition_id``'s noise: the paper's sigma *
    (partition_id + 1) / N, or under ``noise-reading = "code"`` (sigma * partition_id / (N - 1))^2."""
    if spec.noise_reading == "code":
        return noise_std(float(spec.noise_sigma), "code", partition_id, spec.num_partitions) ** 2
    return float(spec.noise_sigma) * (partition_id + 1) / spec.num_partitions


def noise_std(sigma: float, reading: str, partition_id: int, num_partitions: int) -> float:
    """The pixel-unit standard deviation of partition ``partition_id``'s noise of ``num_partitions``
    under ``reading``: ``"paper"`` sqrt(sigma * (partition_id + 1) / N), ``"code"`` sigma *
    partition_id / (N - 1) (0 for a single client)."""
    if reading == "code":
        return sigma * partition_id / (num_partitions - 1) if num_partitions > 1 else 0.0
    return (sigma * (partition_id + 1) / num_partitions) ** 0.5


def noised_per_batch(spec: PartitionSpec) -> bool:
    """Whether the noise is drawn per batch (``noise-reading = "code"``) rather than once into
    the partition's tensors."""
    return bool(spec.noise_sigma) and spec.noise_reading == "code"


def with_feature_noise(x: torch.Tensor, spec: PartitionSpec, partition_id: int, info: DatasetInfo,
                       stream: int = 0) -> torch.Tensor:
    """``x`` (normalised N x C x H x W inputs of client ``partition_id``) with its noise added;
    ``x`` itself when ``noise-sigma`` is 0. ``stream`` tells apart two tensors of one client
    (its training part and its local test split), so each gets noise of its own."""
    if not spec.noise_sigma or (noised_per_batch(spec) and stream == 0):
        return x  # off, or the code's reading: the training batches get theirs in tasks.augment
    seed = int(np.random.SeedSequence([spec.seed, partition_id, stream]).generate_state(1)[0])
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype) * noise_variance(spec, partition_id) ** 0.5
    std = torch.tensor(info.std, dtype=x.dtype).view(1, -1, 1, 1)
    return x + noise / std
