"""A SuperNode's own training data (``--node-config data-path=...``): a parquet file or image
folder in the Hugging Face schema of one of the named datasets, read by ``load_local_file``."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
import torch

from tasks.catalogue import DATASETS, DatasetInfo
from tasks.datasets import DataUnavailableError, normalise


class LocalDataError(DataUnavailableError):
    """A SuperNode's own ``data-path`` is missing or does not hold the run's dataset schema."""


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def load_local_file(path: str, dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A node's own training data (``--node-config data-path=...``) as normalised (x, y) tensors.

    ``path`` is either a parquet file with the Hugging Face schema of ``dataset`` (e.g. MNIST:
    ``image`` {bytes, path} and ``label``; CIFAR-10: ``img`` and ``label``) or an image folder
    ``<path>/<label>/<image>`` whose sub-folder names are the integer labels. Images must have
    the dataset's size and channels; they get the same normalisation as the named dataset.
    Decoded once per process (cached by path and modification time). Every problem raises
    ``LocalDataError`` naming the path.
    """
    if dataset not in DATASETS:
        raise LocalDataError(
            f"data-path {path!r}: node-local data needs an image dataset "
            f"({', '.join(DATASETS)}), not {dataset!r}"
        )
    resolved = Path(path).expanduser()
    try:
        resolved = resolved.resolve(strict=True)
        stat = resolved.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError as exc:
        raise LocalDataError(f"data-path {path!r} does not exist or cannot be read ({exc})") from exc
    return _load_local_cached(str(resolved), dataset, stamp)


@functools.lru_cache(maxsize=8)
def _load_local_cached(path: str, dataset: str, _stamp: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    info = DATASETS[dataset]
    p = Path(path)
    if p.is_dir():
        images, labels = _read_image_folder(p, info)
    elif p.is_file():
        images, labels = _read_parquet(p, info)
    else:
        raise LocalDataError(f"data-path {path!r} is neither a parquet file nor an image folder")
    if len(labels) == 0:
        raise LocalDataError(f"data-path {path!r} is empty: it holds no examples")
    bad = (labels < 0) | (labels >= info.shape.classes)
    if bad.any():
        raise LocalDataError(
            f"data-path {path!r}: label {int(labels[bad][0])} is outside 0..{info.shape.classes - 1}"
            f" of dataset {dataset!r}"
        )
    return normalise(images, labels, info)


def _decode(data: bytes | str, info: DatasetInfo, where: str) -> np.ndarray:
    """One encoded image (bytes or a file path) -> uint8 H x W (grey) or H x W x C array."""
    from PIL import Image

    channels, size = info.shape.channels, info.shape.size
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as im:
            array = np.asarray(im.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, ...
        raise LocalDataError(f"{where}: cannot decode image ({type(exc).__name__}: {exc})") from exc
    if array.shape[:2] != (size, size):
        raise LocalDataError(
            f"{where}: image is {array.shape[1]}x{array.shape[0]}, the dataset needs {size}x{size}"
        )
    return array


def _read_parquet(path: Path, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # ArrowInvalid, OSError, ...
        raise LocalDataError(
            f"data-path {str(path)!r} is not a readable parquet file ({type(exc).__name__}: {exc})"
        ) from exc
    missing = {info.image_column, info.label_column} - set(table.column_names)
    if missing:
        raise LocalDataError(
            f"data-path {str(path)!r}: missing column(s) {sorted(missing)} (found "
            f"{sorted(table.column_names)}); the {info.hub_id} schema has "
            f"{info.image_column!r} and {info.label_column!r}"
        )
    if table.num_rows == 0:
        raise LocalDataError(f"data-path {str(path)!r} is empty (a parquet file with 0 rows): it holds no examples")
    images = []
    for i, cell in enumerate(table.column(info.image_column).to_pylist()):
        where = f"data-path {str(path)!r} row {i}"
        if isinstance(cell, dict):  # the Hugging Face Image feature: {bytes, path}
            data = cell.get("bytes") or (str(path.parent / cell["path"]) if cell.get("path") else None)
        else:
            data = cell
        if not isinstance(data, (bytes, str)):
            raise LocalDataError(f"{where}: column {info.image_column!r} holds no image bytes or path")
        images.append(_decode(data, info, where))
    labels = np.asarray(table.column(info.label_column).to_pylist())
    if not np.issubdtype(labels.dtype, np.integer):
        raise LocalDataError(f"data-path {str(path)!r}: column {info.label_column!r} must hold integers")
    return (np.stack(images) if images else np.zeros((0,), np.uint8)), labels


def _read_image_folder(path: Path, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for sub in sorted(path.iterdir()):
        if not sub.is_dir():
            continue
        if not sub.name.isdigit():
            raise LocalDataError(
                f"data-path {str(path)!r}: sub-folder {sub.name!r} is not an integer label; an image"
                " folder holds <label>/<image> with label 0, 1, ..."
            )
        for file in sorted(sub.iterdir()):
            if file.suffix.lower() in IMAGE_SUFFIXES:
                images.append(_decode(str(file), info, f"data-path image {str(file)!r}"))
                labels.append(int(sub.name))
    if not images:
        raise LocalDataError(
            f"data-path {str(path)!r}: no images found; an image folder holds <label>/<image>"
            f" files ({', '.join(IMAGE_SUFFIXES)})"
        )
    return np.stack(images), np.asarray(labels, dtype=np.int64)
