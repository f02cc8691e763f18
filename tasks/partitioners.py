"""The flwr-datasets partitioner of each run-config ``partitioner`` (``tasks.catalogue.PARTITIONERS``
says which NIID-Bench setting each is), and the client sizes two of them are given.

Every partitioner but one (below) is flwr-datasets' own; fl-drift adds only what flwr-datasets
leaves to its caller, the sizes:

- ``quantity``: ``SizePartitioner`` cuts the shuffled training split into blocks of the sizes
  ``quantity_sizes`` draws from Dir(alpha), so each client's labels are an IID sample and only
  the sizes differ (NIID-Bench's quantity skew: ``np.random.dirichlet(np.repeat(beta, N))``,
  redrawn until the smallest client has ``min-partition-size`` examples, NIID-Bench's 10);
- ``inner-dirichlet``: ``InnerDirichletPartitioner`` fills clients of the sizes
  ``inner_dirichlet_sizes`` gives (equal, or lognormal with ``size-sigma`` as the FedDyn paper's
  unbalanced setting) with labels drawn from each client's Dir(alpha) prior.

One partitioner is fl-drift's own: ``dirichlet`` with ``dirichlet-balance = true`` is
``balanced_dirichlet_partitioner``, NIID-Bench's label-Dirichlet exactly as its code (and Flower's
``baselines/niid_bench``) cuts it, with the balancing rule the paper does not state: a client
that already holds at least N / n of the N examples gets no more of the later labels.
flwr-datasets' ``DirichletPartitioner(self_balancing=True)`` is not that rule: it stops a client
only once it holds *more* than N / n (``>``, NIID-Bench ``>=``), and it gives up after 10 draws
that leave a client below ``min_partition_size`` (NIID-Bench redraws until none is).
``dirichlet-balance = false`` (the default) keeps flwr-datasets' unbalanced
``DirichletPartitioner(self_balancing=False)``, the split every kept result was run on.
"""

from __future__ import annotations

import warnings

import numpy as np

from tasks.catalogue import DatasetInfo
from tasks.datasets import PartitionError
from tasks.partition_spec import PartitionSpec

SIZE_DRAWS = 1000  # Dirichlet size draws tried before a quantity split is refused
LABEL_DRAWS = 1000  # balanced Dirichlet label draws tried before the split is refused


def hide_unused_classes_warning() -> None:
    """Hide flwr-datasets' own multi-line warning when a pathological split leaves classes to no
    client: fl-drift says it in one line naming the classes (``tasks.partition_figure.unheld_labels``,
    in ``--check`` and at the run's start), and the library's text names a keyword argument
    fl-drift does not expose. Only that warning; registered where the partitioner is made (a
    filter set at import would be lost to a caller's ``catch_warnings``)."""
    warnings.filterwarnings("ignore", message=r"Classes: .* will NOT be used", category=UserWarning,
                            module=r"flwr_datasets\.partitioner\.pathological_partitioner")


def make_partitioner(spec: PartitionSpec, info: DatasetInfo, rows: int):
    """The flwr-datasets partitioner that cuts the ``rows``-row training split as ``spec`` asks
    (labels read from ``info.label_column``; natural ids from ``info.natural_id_column``)."""
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        InnerDirichletPartitioner,
        NaturalIdPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
        SizePartitioner,
    )

    n, label, seed = spec.num_partitions, info.label_column, spec.seed
    if spec.partitioner == "dirichlet" and spec.dirichlet_balance:
        return balanced_dirichlet_partitioner(n, label, float(spec.alpha), spec.min_partition_size, seed)
    if spec.partitioner == "dirichlet":
        return DirichletPartitioner(num_partitions=n, partition_by=label, alpha=spec.alpha,
                                    min_partition_size=spec.min_partition_size, self_balancing=False, seed=seed)
    if spec.partitioner == "shard":
        return ShardPartitioner(num_partitions=n, partition_by=label,
                                num_shards_per_partition=spec.shards_per_client, seed=seed)
    if spec.partitioner == "iid":
        return IidPartitioner(num_partitions=n)
    if spec.partitioner == "pathological":
        hide_unused_classes_warning()
        # "first-deterministic": client i gets class i mod C, then k - 1 more at random: NIID-Bench's #C = k
        return PathologicalPartitioner(num_partitions=n, partition_by=label,
                                       num_classes_per_partition=spec.classes_per_client,
                                       class_assignment_mode="first-deterministic", seed=seed)
    if spec.partitioner == "quantity":
        return SizePartitioner(quantity_sizes(spec, rows))
    if spec.partitioner == "inner-dirichlet":
        return InnerDirichletPartitioner(partition_sizes=inner_dirichlet_sizes(spec, rows), partition_by=label,
                                         alpha=float(spec.alpha), seed=seed)
    if spec.partitioner == "natural":
        if info.natural_id_column is None:
            raise PartitionError(f"partitioner 'natural' needs a dataset with natural ids; {spec.dataset!r} has none")
        return NaturalIdPartitioner(partition_by=info.natural_id_column)
    raise PartitionError(f"unknown partitioner {spec.partitioner!r}")


def quantity_sizes(spec: PartitionSpec, rows: int) -> list[int]:
    """Client sizes of NIID-Bench's quantity skew: shares q ~ Dir(alpha, ..., alpha) of the
    ``rows`` rows (the last client takes the rounding remainder, so the sizes add up to
    ``rows``), redrawn until every client has at least ``min-partition-size`` examples (and one);
    seeded by the run's seed. ``PartitionError`` when ``SIZE_DRAWS`` draws all fall short."""
    rng = np.random.default_rng(spec.seed)
    least = max(1, spec.min_partition_size)
    for _ in range(SIZE_DRAWS):
        cuts = (np.cumsum(rng.dirichlet(np.full(spec.num_partitions, float(spec.alpha)))) * rows).astype(int)[:-1]
        sizes = np.diff(np.concatenate([[0], cuts, [rows]]))
        if sizes.min() >= least:
            return [int(s) for s in sizes]
    raise PartitionError(
        f"quantity: {SIZE_DRAWS} draws of {spec.num_partitions} client sizes from Dir(alpha = {spec.alpha}) over"
        f" {rows} examples all left a client below min-partition-size = {least}; raise alpha, lower"
        " min-partition-size or use fewer clients")


def inner_dirichlet_sizes(spec: PartitionSpec, rows: int) -> list[int]:
    """Client sizes of the FedDyn paper's split: ``rows`` // N each when ``size-sigma`` is 0
    (balanced), else lognormal(log(rows / N), size-sigma) shares of the ``rows`` rows (its
    ``unbalanced_sgm``), seeded by the run's seed; the sizes add up to at most ``rows``. A draw
    that gives a client less than one example (or overflows: size-sigma 1e6 gave inf/inf, NaN,
    and every client 1 example) is a ``PartitionError`` naming the key and its value, not a
    client silently given one example."""
    n = spec.num_partitions
    if rows < n:
        raise PartitionError(f"inner-dirichlet: {rows} examples cannot fill {n} clients")
    if not spec.size_sigma:
        return [rows // n] * n
    rng = np.random.default_rng(spec.seed)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, in one line
        shares = rng.lognormal(mean=np.log(rows / n), sigma=spec.size_sigma, size=n)
        drawn = shares / shares.sum() * (rows - n)
    if not np.all(np.isfinite(drawn)) or drawn.min() < 1:
        smallest = "a non-finite size" if not np.all(np.isfinite(drawn)) else f"{drawn.min():.3g} examples"
        raise PartitionError(
            f"run-config key 'size-sigma' = {spec.size_sigma:g} is invalid for {n} inner-dirichlet clients of {rows}"
            f" examples: its lognormal size draw (seed {spec.seed}) gives a client {smallest}; lower size-sigma"
            " (FedDyn's unbalanced setting is 0.3) or use fewer clients")
    return [int(s) for s in drawn.astype(int)]


def balanced_dirichlet_indices(labels: np.ndarray, num_partitions: int, alpha: float, min_size: int,
                               rng: np.random.Generator) -> list[np.ndarray]:
    """NIID-Bench's label-Dirichlet split (``noniid-labeldir`` of its ``utils.partition_data``,
    the rule of Flower's ``baselines/niid_bench`` too) of the examples whose labels are
    ``labels``: row indices per client.

    For each label k in increasing order: its examples in random order; shares p ~ Dir(alpha, ...,
    alpha) over the n clients; every client that already holds N / n or more of the N examples
    gets share 0 (the balancing), the rest renormalised; the examples cut at
    floor(cumsum(p) x count) and handed out in client order. The whole draw is repeated until
    every client holds at least ``min_size`` examples (NIID-Bench's 10; at most ``LABEL_DRAWS``
    draws, then ``PartitionError``); each client's indices are shuffled at the end. So no client
    gains examples of a label once it holds N / n (but one: as in NIID-Bench's code, the
    renormalised shares can sum to 1 - 1e-16, the last cut then falls one short and a closed last
    client gets the label's last example), and the sizes stay near N / n (MNIST, 10 clients,
    alpha 0.5: about 2.8k to 8.7k, where the unbalanced split gives 1.3k to 11k)."""
    labels = np.asarray(labels)
    cap = len(labels) / num_partitions
    by_label = [np.flatnonzero(labels == k) for k in np.unique(labels)]
    least = max(1, min_size)
    for _ in range(LABEL_DRAWS):
        parts: list[list[int]] = [[] for _ in range(num_partitions)]
        for rows in by_label:
            rows = rows.copy()
            rng.shuffle(rows)
            shares = rng.dirichlet(np.full(num_partitions, alpha))
            shares = shares * np.array([len(part) < cap for part in parts])
            shares = shares / shares.sum()
            cuts = (np.cumsum(shares) * len(rows)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(rows, cuts)):
                part.extend(chunk.tolist())
        if min(len(part) for part in parts) >= least:
            out = [np.array(part, dtype=np.int64) for part in parts]
            for part in out:
                rng.shuffle(part)
            return out
    raise PartitionError(
        f"dirichlet (dirichlet-balance): {LABEL_DRAWS} draws from Dir(alpha = {alpha}) of {len(labels)} examples"
        f" over {num_partitions} clients all left a client below min-partition-size = {least}; raise alpha,"
        " lower min-partition-size or use fewer clients")


def balanced_dirichlet_partitioner(num_partitions: int, partition_by: str, alpha: float, min_partition_size: int,
                                   seed: int | None):
    """NIID-Bench's balanced label-Dirichlet as a flwr-datasets ``Partitioner``
    (``partitioner = "dirichlet"``, ``dirichlet-balance = true``): ``balanced_dirichlet_indices``
    of the label column ``partition_by``, cut once on first use from ``np.random.default_rng(seed)``."""
    from flwr_datasets.partitioner import Partitioner

    class BalancedDirichletPartitioner(Partitioner):
        def __init__(self) -> None:
            super().__init__()
            self._indices: list[np.ndarray] | None = None

        @property
        def num_partitions(self) -> int:
            return num_partitions

        @property
        def partition_id_to_indices(self) -> dict[int, np.ndarray]:
            """partition id -> row indices (``tasks.partition_cache`` keeps them), cut if needed."""
            if self._indices is None:
                labels = np.asarray(self.dataset.with_format("arrow")[partition_by])
                self._indices = balanced_dirichlet_indices(labels, num_partitions, alpha, min_partition_size,
                                                           np.random.default_rng(seed))
            return dict(enumerate(self._indices))

        def load_partition(self, partition_id: int):
            if not 0 <= partition_id < num_partitions:
                raise ValueError(f"partition {partition_id} is not one of {num_partitions}")
            return self.dataset.select(self.partition_id_to_indices[partition_id])

    return BalancedDirichletPartitioner()
