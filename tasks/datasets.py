"""Loading the image datasets of ``tasks.catalogue``: where their local parquet files live,
the column check, and decoding to normalised tensors.

Source order: ``data-dir`` (run config) or ``$FL_DATA_DIR`` holding
``<name>/{train,test}.parquet`` in the Hugging Face hub schema; else the hub id. When
neither can be read, one ``DataUnavailableError`` says what was tried.
"""

from __future__ import annotations

import dataclasses
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
    """The shape a model for ``dataset`` is built from, with the normalisation its inputs arrive
    with (``InputShape.pixel_mean`` / ``pixel_std``)."""
    if dataset == "synthetic":
        from tasks.synthetic import SYNTHETIC_SHAPE

        return SYNTHETIC_SHAPE
    info = DATASETS[dataset]
    return dataclasses.replace(info.shape, pixel_mean=info.mean, pixel_std=info.std)


def local_parquet_files(name: str, data_dir: str) -> dict[str, str] | None:
    """``{split: path}`` of dataset ``name`` in ``data_dir``, for every split the folder holds
    (``DatasetInfo.splits``: train and test, or train alone for a dataset whose test split is
    held out of it); None when no data folder is set (then the hub is the source). A folder
    that is set is used whole or refused: a missing split raises ``DataUnavailableError`` naming
    the file, never a silent fall back to the hub (which would train or test on other data than
    the user's)."""
    if not data_dir:
        return None
    info = DATASETS.get(name)
    splits = info.splits() if info is not None else ("train", "test")
    files = {split: Path(data_dir) / name / f"{split}.parquet" for split in splits}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        wanted = " and ".join(f"{name}/{split}.parquet" for split in splits)
        raise DataUnavailableError(
            f"data folder {data_dir!r} has no {' and no '.join(missing)}; it must hold {wanted}"
            f" (or set neither data-dir nor $FL_DATA_DIR to load the Hugging Face hub"
            f" id {info.hub_id if info is not None else name!r})")
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


def check_columns(files: dict[str, str], info: DatasetInfo, name: str) -> None:
    """Every local parquet file (``{split: path}``) has the columns dataset ``name`` reads (its
    image and label columns, and the natural-id column where the dataset names one), read from
    each file's footer (nothing decoded) before the ``datasets`` library reads them: a file with
    renamed columns is one ``DataUnavailableError`` line naming the columns needed and the ones
    found, not that library's schema cast dump. A footer that cannot be read is left to the
    readers, which report it."""
    import pyarrow.parquet as pq

    wanted = [c for c in (info.image_column, info.label_column, info.natural_id_column) if c]
    for path in files.values():
        try:
            found = pq.read_schema(path).names
        except Exception:  # ArrowInvalid, OSError, ...: reported by the readers
            continue
        missing = [c for c in wanted if c not in found]
        if missing:
            raise DataUnavailableError(
                f"{path}: missing column(s) {missing}: dataset {name!r} needs the columns"
                f" {', '.join(map(repr, wanted))} (the {info.hub_id} schema); found {', '.join(map(repr, found))}"
            )


def check_labels(name: str, files: dict[str, str]) -> None:
    """Every label of the local parquet ``files`` must be one of the dataset's classes (an
    integer in 0 .. classes - 1): a label 42 in MNIST would otherwise fail every client's
    training after launch (``Target 42 is out of bounds``) or, as a float, be cut to an integer
    silently. ``DataUnavailableError`` naming the file, the value and the valid range. Only the
    label column is read (milliseconds); a file or column that cannot be read is left to the
    readers that report it (``check_columns``)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import pyarrow.types as pat

    info = DATASETS[name]
    classes = info.shape.classes
    valid = f"valid labels: the integers 0 to {classes - 1} ({name} has {classes} classes)"
    for path in files.values():
        try:
            column = pq.read_table(path, columns=[info.label_column]).column(0)
        except Exception:  # ArrowInvalid, KeyError, OSError, ...: reported by the readers
            continue
        if not pat.is_integer(column.type):
            raise DataUnavailableError(f"{path}: label column {info.label_column!r} holds {column.type} values, not"
                                       f" integers; {valid}")
        if column.null_count:
            raise DataUnavailableError(f"{path}: {column.null_count} row(s) have no label; {valid}")
        bounds = pc.min_max(column).as_py()
        low, high = bounds["min"], bounds["max"]
        if low is not None and (low < 0 or high >= classes):
            raise DataUnavailableError(f"{path}: label {high if high >= classes else low} is outside {name}'s classes;"
                                       f" {valid}")


def to_tensors(ds, info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode a Hugging Face ``Dataset``'s images once into a normalised float32 NCHW tensor."""
    table = ds.with_format("arrow")[:]  # the selected rows (a partition's index mapping applied)
    images = decode_images(table.column(info.image_column).to_pylist(), ds, info)
    return normalise(images, table.column(info.label_column).to_numpy(), info)


def decode_images(cells: list, ds, info: DatasetInfo) -> np.ndarray:
    """The images of an image column's cells ({"bytes", "path"} as the hub's parquet stores them)
    as one uint8 array: each PNG/JPEG decoded by PIL straight from its bytes.

    The pixels are exactly those of ``ds[info.image_column]`` (``datasets``' Image feature opens
    the same bytes with the same ``PIL.Image.open``), 3-6x faster than going through it
    (MNIST 203 vs 1189 us an image, CIFAR-10 683 vs 2272, measured on the loaded 2-core CPU):
    ``datasets`` formats every row as a Python dict of a PIL image, the cost that dominated a GPU
    cohort round (docs/performance.md, "GPU: unmeasured"). Cells without bytes (images by path) go
    through the Image feature as before."""
    import io

    from PIL import Image

    if any(cell is None or cell.get("bytes") is None for cell in cells):
        return np.stack([np.asarray(im, dtype=np.uint8) for im in ds[info.image_column]])
    return np.stack([np.asarray(Image.open(io.BytesIO(cell["bytes"])), dtype=np.uint8) for cell in cells])


def normalise(images: np.ndarray, labels: np.ndarray, info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 N x H x W (grey) or N x H x W x C images -> the dataset's normalised NCHW float32
    (``normalise_tensors`` on the host)."""
    return normalise_tensors(torch.from_numpy(np.asarray(images)), torch.as_tensor(labels), info)


def normalise_tensors(images: torch.Tensor, labels: torch.Tensor,
                      info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 N x H x W (grey) or N x H x W x C image tensors, on any device -> the dataset's
    normalised NCHW float32 there, and the labels as int64: the one normalisation of every path
    (the host's ``normalise``, a GPU node's ``partitioning.partition_on_split``), elementwise
    float32 operations that give the same bits on any device."""
    if images.dim() == 3:  # greyscale: N x H x W
        images = images[:, None]
    else:  # colour: N x H x W x C
        images = images.permute(0, 3, 1, 2)
    x = images.to(torch.get_default_dtype()).div_(255.0)  # float32 unless a float64 check changed it
    mean = torch.tensor(info.mean, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, device=x.device).view(1, -1, 1, 1)
    x = (x - mean) / std
    y = labels.to(dtype=torch.long)
    return x.contiguous(), y
