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
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.catalogue import DatasetInfo
from tasks.partition_spec import PartitionSpec


def noise_variance(spec: PartitionSpec, partition_id: int) -> float:
    """The pixel-unit variance of client ``partition_id``'s noise: sigma * (partition_id + 1) / N."""
    return float(spec.noise_sigma) * (partition_id + 1) / spec.num_partitions


def with_feature_noise(x: torch.Tensor, spec: PartitionSpec, partition_id: int, info: DatasetInfo,
                       stream: int = 0) -> torch.Tensor:
    """``x`` (normalised N x C x H x W inputs of client ``partition_id``) with its noise added;
    ``x`` itself when ``noise-sigma`` is 0. ``stream`` tells apart two tensors of one client
    (its training part and its local test split), so each gets noise of its own."""
    if not spec.noise_sigma:
        return x
    seed = int(np.random.SeedSequence([spec.seed, partition_id, stream]).generate_state(1)[0])
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype) * noise_variance(spec, partition_id) ** 0.5
    std = torch.tensor(info.std, dtype=x.dtype).view(1, -1, 1, 1)
    return x + noise / std
