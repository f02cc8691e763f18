"""The datasets fl-drift knows by name: hub id, column schema, input shape and normalisation.

Plain data, no torch: the runner reads it before the heavy imports (to refuse a bad
``--data-dir`` at once); ``tasks.datasets`` loads and decodes the data it describes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InputShape:
    """What a model is sized from. ``pixel_mean`` / ``pixel_std``: the per-channel normalisation
    the inputs arrive with ((pixel - mean) / std, pixels in [0, 1]; ``tasks.datasets.input_shape``
    fills them from the dataset, empty: unknown), for a model that undoes it (``simple-cnn``)."""

    channels: int  # 0 for flat feature vectors
    size: int  # image side, or the feature dimension for flat inputs
    classes: int
    pixel_mean: tuple[float, ...] = ()
    pixel_std: tuple[float, ...] = ()


@dataclass(frozen=True)
class DatasetInfo:
    """``natural_id_column``: the column naming each example's natural owner (FEMNIST's writer),
    which partitioner ``natural`` cuts by; None when the dataset has none. ``held_out_test``: 0
    when the source has a test split; else the share of the training split held out as the test
    split (the hub's FEMNIST has only a training split), so the local folder needs only
    ``<name>/train.parquet``."""

    hub_id: str
    image_column: str
    label_column: str
    shape: InputShape
    mean: tuple[float, ...]
    std: tuple[float, ...]
    natural_id_column: str | None = None
    held_out_test: float = 0.0

    def splits(self) -> tuple[str, ...]:
        """The splits a local data folder holds as ``<split>.parquet``."""
        return ("train",) if self.held_out_test else ("train", "test")


DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo("ylecun/mnist", "image", "label", InputShape(1, 28, 10), (0.1307,), (0.3081,)),
    "fashion_mnist": DatasetInfo(
        "zalando-datasets/fashion_mnist", "image", "label", InputShape(1, 28, 10), (0.2860,), (0.3530,)
    ),
    "cifar10": DatasetInfo(
        "uoft-cs/cifar10", "img", "label", InputShape(3, 32, 10),
        (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
    ),
    "cifar100": DatasetInfo(
        "uoft-cs/cifar100", "img", "fine_label", InputShape(3, 32, 100),
        (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
    ),
    # LEAF's FEMNIST as Flower Labs put it on the hub: image (28 x 28 grey), writer_id (str),
    # hsf_id (int), character (62 classes); one training split, so 10% of it is held out as the
    # test split (LEAF holds out 10% too). Mean and std of the ink-on-white images as a public
    # FEMNIST pipeline normalises them (not measured here: the hub is out of reach).
    "femnist": DatasetInfo(
        "flwrlabs/femnist", "image", "character", InputShape(1, 28, 62), (0.9618,), (0.1644,),
        natural_id_column="writer_id", held_out_test=0.1,
    ),
}

# Every value of the run-config key ``partitioner``: how the training split is cut into the
# clients' partitions, each with the setting of the non-IID benchmark NIID-Bench (Li, Diao, Chen,
# He, ICDE 2022) it reproduces (``tasks/partitioners.py`` builds them; docs/configuration.md).
PARTITIONERS: dict[str, str] = {
    "dirichlet": "label skew, each client's label mix ~ Dir(alpha) (NIID-Bench: distribution-based label"
                 " imbalance p_k ~ Dir(beta))",
    "shard": "label skew, shards-per-client shards of the label-sorted split (FedAvg paper's pathological split)",
    "iid": "equal random shares (NIID-Bench: homogeneous partition)",
    "pathological": "label skew, classes-per-client distinct labels per client (NIID-Bench: quantity-based label"
                    " imbalance #C = k)",
    "quantity": "quantity skew, IID labels, client sizes ~ Dir(alpha) (NIID-Bench: quantity skew q ~ Dir(beta))",
    "inner-dirichlet": "label skew at given sizes, labels ~ Dir(alpha), sizes equal or lognormal(size-sigma)"
                       " (FedDyn paper's split)",
    "natural": "one client per natural owner, the dataset's natural-id column (NIID-Bench: real-world feature"
               " imbalance, FEMNIST writers)",
}


# Every value of the run-config key ``dataset``: the image datasets above and the generated one
# (``tasks/synthetic.py``).
DATASET_NAMES: tuple[str, ...] = (*DATASETS, "synthetic")
