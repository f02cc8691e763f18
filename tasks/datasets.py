"""Loading the image datasets of ``tasks.catalogue``: where their local parquet files live,
the column check, and decoding to normalised tensors.

Source order: ``data-dir`` (run config) or ``$FL_DATA_DIR`` holding
``<name>/{train,test}.parquet`` in the Hugging Face hub schema; else the hub id. When
neither can be read, one ``DataUnavailableError`` says what was tried.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from tasks.catalogue import DATASETS, DatasetInfo, InputShape


class DataUnavailableError(RuntimeError):
    """Neither the local data directory nor the hub could provide the dataset."""


class HubUnavailableError(DataUnavailableError):
    """No data folder is set (neither ``data-dir`` nor ``$FL_DATA_DIR``) and the Hugging Face hub
    could not provide ``dataset`` (``hub_id``): ``reason`` is the hub's error in one line. The
    ServerApp names the real cause from these parts (``fl_app/server/data_source.py``)."""

    def __init__(self, dataset: str, hub_id: str, reason: str):
        self.dataset, self.hub_id, self.reason = dataset, hub_id, reason
        super().__init__(
            f"cannot load dataset {dataset!r}: no data folder is set (run-config 'data-dir' or env FL_DATA_DIR)"
            f" and the Hugging Face hub failed for {hub_id!r} ({reason}). Point data-dir or FL_DATA_DIR at a"
            f" folder holding {dataset}/train.parquet and {dataset}/test.parquet.")


class PartitionError(ValueError):
    """The requested partitioning cannot be made from the dataset."""


def resolve_data_dir(configured: str, fallback: str | None = None) -> str:
    """The run config's ``data-dir`` if set, else ``fallback`` (default: ``$FL_DATA_DIR``), as an
    absolute path ('' if none). A resumed comparison passes the ``$FL_DATA_DIR`` it recorded."""
    chosen = configured or (os.environ.get("FL_DATA_DIR", "") if fallback is None else fallback)
    return str(Path(chosen).expanduser().resolve()) if chosen else ""


def input_shape(dataset: str) -> InputShape:
    if dataset == "synthetic":
        from tasks.synthetic import SYNTHETIC_SHAPE

        return SYNTHETIC_SHAPE
    return DATASETS[dataset].shape


def local_parquet_files(name: str, data_dir: str) -> dict[str, str] | None:
    """``{"train": path, "test": path}`` of dataset ``name`` in ``data_dir``; None when no data
    folder is set (then the hub is the source). A folder that is set is used whole or refused:
    a missing split raises ``DataUnavailableError`` naming the file, never a silent fall back to
    the hub (which would train or test on other data than the user's)."""
    if not data_dir:
        return None
    files = {split: Path(data_dir) / name / f"{split}.parquet" for split in ("train", "test")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise DataUnavailableError(
            f"data folder {data_dir!r} has no {' and no '.join(missing)}; it must hold {name}/train.parquet"
            f" and {name}/test.parquet (or set neither data-dir nor $FL_DATA_DIR to load the Hugging Face hub"
            f" id {DATASETS[name].hub_id if name in DATASETS else name!r})")
    for split, path in files.items():
        if parquet_rows(path) == 0:
            raise DataUnavailableError(
                f"{path} is empty (a parquet file with 0 rows): the {split} split of {name!r} needs examples;"
                f" replace the file (data folder {data_dir!r})")
    return {k: str(v) for k, v in files.items()}


def parquet_rows(path: Path) -> int | None:
    """Rows of a parquet file from its footer (nothing decoded); None when the footer cannot
    be read (the readers that decode it then say why)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except Exception:  # ArrowInvalid, OSError, ...: reported by the readers
        return None


def check_columns(fds, info: DatasetInfo, where: str) -> None:
    cols = set(fds.load_split("test").column_names)
    missing = {info.image_column, info.label_column} - cols
    if missing:
        raise DataUnavailableError(
            f"{where}: missing column(s) {sorted(missing)} (found {sorted(cols)}); the "
            f"{info.hub_id} schema has {info.image_column!r} and {info.label_column!r}"
        )


def to_tensors(ds, info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode images once into a normalised float32 NCHW tensor."""
    images = np.stack([np.asarray(im, dtype=np.uint8) for im in ds[info.image_column]])
    return normalise(images, np.asarray(ds[info.label_column]), info)


def normalise(images: np.ndarray, labels: np.ndarray, info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 N x H x W (grey) or N x H x W x C images -> the dataset's normalised NCHW float32."""
    if images.ndim == 3:  # greyscale: N x H x W
        images = images[:, None]
    else:  # colour: N x H x W x C
        images = images.transpose(0, 3, 1, 2)
    x = torch.from_numpy(images).float().div_(255.0)
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    x = (x - mean) / std
    y = torch.as_tensor(labels, dtype=torch.long)
    return x.contiguous(), y
