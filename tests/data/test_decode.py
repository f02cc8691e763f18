"""Decoding a dataset's images (tasks/datasets.py ``to_tensors``): the fast path that decodes the
parquet cells' bytes with PIL directly gives exactly the pixels and labels that ``datasets``'
Image feature gives (the same bytes, the same ``PIL.Image.open``), on real MNIST and CIFAR-10
partitions (a partition is an index mapping over the shuffled split: the rows must follow it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_app.registry import validate_config
from tasks.catalogue import DATASETS
from tasks.datasets import normalise, to_tensors
from tasks.partitioning import PartitionSpec, federated_dataset


def through_image_feature(ds, info) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: every row formatted by ``datasets``' Image feature (a PIL image per row), as before."""
    from datasets import Image

    ds = ds.with_format(None).cast_column(info.image_column, Image())  # Python rows, whatever format it was in
    images = np.stack([np.asarray(im, dtype=np.uint8) for im in ds[info.image_column]])
    return normalise(images, np.asarray(ds[info.label_column]), info)


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_fast_decode_equals_the_image_feature(shared_data, dataset):
    if not (shared_data / dataset / "train.parquet").exists():
        pytest.skip(f"no {dataset} in {shared_data}")
    spec = PartitionSpec.from_config(validate_config({"dataset": dataset, "data-dir": str(shared_data), "seed": 3}), 50)
    fds = federated_dataset(spec)
    info = DATASETS[dataset]
    for partition in (0, 17):
        rows = fds.load_partition(partition, "train")
        x, y = to_tensors(rows, info)
        want_x, want_y = through_image_feature(rows, info)
        assert x.shape == want_x.shape and x.dtype == torch.float32
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
        assert y.dtype == torch.long and len(set(y.tolist())) > 1


def test_images_by_path_still_decode(tmp_path):
    """Cells that hold a path and no bytes take the Image feature's route."""
    from datasets import Dataset, Features, Image, Value
    from PIL import Image as PILImage

    paths = []
    for i in range(3):
        path = tmp_path / f"{i}.png"
        PILImage.fromarray(np.full((28, 28), 40 * i, dtype=np.uint8)).save(path)
        paths.append(str(path))
    ds = Dataset.from_dict({"image": paths, "label": [0, 1, 2]},
                           features=Features({"image": Image(), "label": Value("int64")}))
    x, y = to_tensors(ds, DATASETS["mnist"])
    want_x, want_y = through_image_feature(ds, DATASETS["mnist"])
    assert torch.equal(x, want_x) and torch.equal(y, want_y)
