"""The datasets fl-drift knows by name: hub id, column schema, input shape and normalisation.

Plain data, no torch: the runner reads it before the heavy imports (to refuse a bad
``--data-dir`` at once); ``tasks.datasets`` loads and decodes the data it describes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InputShape:
    channels: int  # 0 for flat feature vectors
    size: int  # image side, or the feature dimension for flat inputs
    classes: int


@dataclass(frozen=True)
class DatasetInfo:
    hub_id: str
    image_column: str
    label_column: str
    shape: InputShape
    mean: tuple[float, ...]
    std: tuple[float, ...]


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
}


# Every value of the run-config key ``dataset``: the image datasets above and the generated one
# (``tasks/synthetic.py``).
DATASET_NAMES: tuple[str, ...] = (*DATASETS, "synthetic")
