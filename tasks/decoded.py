"""Every image of a local parquet split decoded once, checked, and kept in the cache folder as
one uint8 array (``decoded_split``), so a corrupt image is refused before launch
(``check_images``, called by ``tasks.partitioning.check_data``: the runner's preflight and
``--check``, and the server before round 1) in one line naming the file, the row and the split,
instead of failing every client that holds it after launch, in pages of Ray tracebacks.

Decoding is the clients' own (``tasks.datasets.decode_images``: PIL's ``Image.open`` of each
cell's bytes, as uint8), and every image must have the dataset's shape (28 x 28 for MNIST,
32 x 32 x 3 for CIFAR-10): one of another size or mode would fail a client's ``np.stack`` or
its model. It costs seconds (on the 2-core machine at load 2.5-4: MNIST's 60,000 training images 4-6 s,
its 10,000 test images 1 s, CIFAR-10's 50,000 training images 15 s; twice that at load 17), so
each file is decoded once: the array is kept in ``cache_dir()/decoded/<file>-<key>.npy`` (N x H
x W grey, N x H x W x C colour, uint8, rows in the file's order), ``key`` a digest of the file's
path, size and modification time (as the partition cache's, ``tasks/partition_cache.py``), its
image column and the Pillow version, ``file`` one of its path and column alone: a file's new
array replaces its old one (``kept_path``). A later check of the same file reads only the
array's header. A cache folder that cannot be written costs the next check the decoding again
(best effort).

Every process reads its data from the kept arrays (``tasks.partitioning.load_partition``,
``load_test``, ``load_validation_split``): the images memory-mapped (``np.load(mmap_mode="r")``:
the server, each Ray actor and each cohort node share the pages the kernel holds once), the
labels kept beside them (``decoded_labels``), and a partition is an index array into them:
``split_order`` maps a row of a split as flwr-datasets' ``FederatedDataset`` presents it (its
seeded shuffle, then ``PrepareSplits``' held-out test and validation cuts) to its row in the
file, and the partitioner's indices (remembered by ``tasks/partition_cache.py``) pick a
partition's rows of that split. The tensors are those of decoding through ``datasets``
(``tasks.datasets.to_tensors``) bit for bit (tests/data/test_decoded.py); ``FL_DRIFT_DECODED=0``
takes that path instead.

Local parquet files only: a hub dataset (no data folder set) is not checked here, its images
are decoded by the clients as before (the hub's copy may change under the same id, so nothing
of it is kept either).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
from pathlib import Path

import numpy as np

from tasks.catalogue import DATASETS
from tasks.datasets import DataUnavailableError, parquet_rows
from tasks.partition_cache import cache_dir

VALIDATION = "validation"  # the split held out of the training split (validation-fraction)


def validation_size(rows: int, fraction: float) -> int:
    """Examples of a ``rows``-row training split held out as the validation split:
    floor(fraction x rows), at least one when ``fraction`` > 0, none at 0 (the one rule: the
    partitioner's cut, ``tasks.partitioning.HoldOutValidation``, and the decoded rows use it)."""
    return max(1, int(fraction * rows)) if fraction > 0 else 0

BATCH_ROWS = 2048  # rows read from the parquet file at a time (bounded memory)


def check_images(dataset: str, files: dict[str, str]) -> None:
    """Every image of each local parquet file (``{split: path}``, ``local_parquet_files``) of
    ``dataset`` decodes to the dataset's shape, else ``DataUnavailableError`` of one line:
    '/data/mnist/train.parquet row 12345 (train split): image cannot be decoded (cannot
    identify image file)'. Rows count from 0. Decoded once per file (``decoded_split``)."""
    for split, path in files.items():
        decoded_split(dataset, path, split)


def image_shape(dataset: str) -> tuple[int, ...]:
    """One decoded image's shape: (H, W) grey, (H, W, C) colour."""
    shape = DATASETS[dataset].shape
    return (shape.size, shape.size) if shape.channels == 1 else (shape.size, shape.size, shape.channels)


def split_key(path: str, column: str) -> str:
    """The kept array's name: a digest of the file's path, size and modification time (a
    rewritten or replaced file is a miss), the image column and the Pillow version."""
    stat = os.stat(path)
    pinned = {"path": str(Path(path).resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
              "column": column, "pillow": _pillow_version()}
    return hashlib.sha1(json.dumps(pinned, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _pillow_version() -> str:
    from importlib.metadata import version

    return version("pillow")


def kept_path(path: str, column: str) -> Path:
    """Where the decoded array of ``path`` (as it is now) is kept: ``<file>-<key>.npy``, ``file``
    naming the file and column, ``key`` this version of it (``split_key``)."""
    owner = hashlib.sha1(f"{Path(path).resolve()}\0{column}".encode()).hexdigest()[:16]
    return cache_dir() / "decoded" / f"{owner}-{split_key(path, column)}.npy"


def decoded_split(dataset: str, path: str, split: str) -> np.ndarray:
    """Every image of the local parquet file ``path`` (the ``split`` split of ``dataset``) as one
    read-only uint8 array, rows in the file's order: the kept one when this file was decoded
    before (memory-mapped), else decoded now, checked and kept. ``DataUnavailableError`` naming
    the file, the row and the split for an image that cannot be decoded or has another shape."""
    info = DATASETS[dataset]
    rows, want = parquet_rows(Path(path)), image_shape(dataset)
    kept = kept_path(path, info.image_column)
    try:
        found = np.load(kept, mmap_mode="r")
        if found.dtype == np.uint8 and found.shape == (rows, *want):
            return found
    except (OSError, ValueError):
        pass
    return _decode_and_keep(dataset, path, split, rows, kept)


def _decode_and_keep(dataset: str, path: str, split: str, rows: int | None, kept: Path) -> np.ndarray:
    import pyarrow.parquet as pq

    column, want = DATASETS[dataset].image_column, image_shape(dataset)
    try:
        source = pq.ParquetFile(path)
        names = source.schema_arrow.names
    except Exception as exc:  # ArrowInvalid, OSError, ...
        raise DataUnavailableError(f"cannot read {path} as parquet: {type(exc).__name__}: {exc}") from exc
    if column not in names:
        raise DataUnavailableError(f"{path}: missing column {column!r} (found {sorted(names)}); the images of"
                                   f" {dataset!r} are in {column!r}")
    rows = source.metadata.num_rows if rows is None else rows
    tmp = kept.with_name(f"{kept.stem}.{os.getpid()}.tmp.npy")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(rows, *want))
    except OSError:  # a cache folder this process cannot write: decode, keep nothing
        tmp, out = None, np.empty((rows, *want), dtype=np.uint8)
    try:
        row = 0
        for batch in source.iter_batches(columns=[column], batch_size=BATCH_ROWS):
            for cell in batch.column(0).to_pylist():
                where = f"{path} row {row} ({split} split)"
                image = _decode_cell(cell, where)
                if image.shape != want:
                    raise DataUnavailableError(
                        f"{where}: image is {_dims(image.shape)}, but {dataset}'s images are {_dims(want)};"
                        " replace that row's image or the file")
                out[row] = image
                row += 1
        if tmp is None:
            return out
        out.flush()
        del out
        os.replace(tmp, kept)  # atomic: a reader never sees half an array
        tmp = None
        _forget_older(kept)
    except DataUnavailableError:
        raise
    except Exception as exc:  # pyarrow cannot read a page of the file
        raise DataUnavailableError(f"cannot read {path} as parquet: {type(exc).__name__}: {exc}") from exc
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return np.load(kept, mmap_mode="r")


def _forget_older(kept: Path) -> None:
    """Remove the arrays kept of earlier versions of ``kept``'s file, images and labels (best
    effort; a process still reading one keeps its pages)."""
    owner = kept.name.split("-")[0]
    for old in kept.parent.glob(f"{owner}-*.npy"):
        if not old.name.startswith(kept.stem) and ".tmp." not in old.name:
            old.unlink(missing_ok=True)


def decoding_enabled() -> bool:
    """Whether local parquet data is read from the kept arrays (default) rather than decoded
    through ``datasets`` (``FL_DRIFT_DECODED=0``: the reference path, for comparison)."""
    return os.environ.get("FL_DRIFT_DECODED", "1").strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=8)
def _split_arrays(dataset: str, path: str, split: str, version: str) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) of one file version, once per process: a cache folder that cannot be
    written would otherwise cost every partition the whole file's decoding."""
    return decoded_split(dataset, path, split), decoded_labels(dataset, path)


def split_arrays(dataset: str, path: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images as ``decoded_split`` keeps them, labels as ``decoded_labels``) of the local
    parquet file ``path``, rows in the file's order; read-only."""
    return _split_arrays(dataset, path, split, kept_path(path, DATASETS[dataset].image_column).name)


def labels_path(path: str, column: str) -> Path:
    """Where the labels of ``path`` (as it is now) are kept: beside its images, whose image
    ``column`` names them (``kept_path``)."""
    images = kept_path(path, column)
    return images.with_name(f"{images.stem}.labels.npy")


def decoded_labels(dataset: str, path: str) -> np.ndarray:
    """The label column of the local parquet file ``path`` as an int64 array, rows in the
    file's order, kept beside its images (``<file>-<key>.labels.npy``, the images' name: the
    same file version) and read back memory-mapped; read from the file (milliseconds) when it
    is not kept yet."""
    import pyarrow.parquet as pq

    info = DATASETS[dataset]
    kept = labels_path(path, info.image_column)
    rows = parquet_rows(Path(path))
    try:
        found = np.load(kept, mmap_mode="r")
        if found.dtype == np.int64 and found.shape == (rows,):
            return found
    except (OSError, ValueError):
        pass
    try:
        labels = np.asarray(pq.read_table(path, columns=[info.label_column]).column(0).to_numpy(), dtype=np.int64)
    except Exception as exc:  # ArrowInvalid, KeyError, OSError, ...
        raise DataUnavailableError(f"cannot read {path}'s labels ({info.label_column!r}): {type(exc).__name__}: "
                                   f"{exc}") from exc
    tmp = kept.with_name(f"{kept.stem}.{os.getpid()}.tmp.npy")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp, labels)
        os.replace(tmp, kept)  # atomic
    except OSError:  # a cache folder this process cannot write: the labels are read each time
        tmp.unlink(missing_ok=True)
    return labels


def split_order(dataset: str, files: dict[str, str], seed: int, validation_fraction: float,
                split: str) -> tuple[str, np.ndarray]:
    """(the file, the file rows) of ``split`` as ``tasks.partitioning.federated_dataset``
    presents it: row i of that split is row ``rows[i]`` of ``file``. flwr-datasets shuffles
    every split with the run's seed (``Dataset.shuffle(seed)``: ``np.random.default_rng(seed)
    .permutation(n)``), then ``PrepareSplits`` cuts the shuffled training split: a held-out test
    split first (``DatasetInfo.held_out_test``), then the validation split
    (``validation-fraction``), the rest being the training split the partitioner cuts."""

    info = DATASETS[dataset]
    train = files["train"]
    n = parquet_rows(Path(train))
    if n is None:
        raise DataUnavailableError(f"cannot read {train} as parquet")
    order = np.random.default_rng(seed).permutation(n)
    held = validation_size(n, info.held_out_test)
    validation = validation_size(n - held, validation_fraction)
    if split == "train":
        return train, order[held + validation:]
    if split == VALIDATION:
        return train, order[held:held + validation]
    if split == "test" and held:
        return train, order[:held]
    if split == "test":
        test = files["test"]
        rows = parquet_rows(Path(test))
        if rows is None:
            raise DataUnavailableError(f"cannot read {test} as parquet")
        return test, np.random.default_rng(seed).permutation(rows)
    raise ValueError(f"unknown split {split!r}")


def _decode_cell(cell, where: str) -> np.ndarray:
    """One image cell ({"bytes", "path"} as the hub's parquet stores it) as the clients decode
    it (``tasks.datasets.decode_images``); a cell without bytes through ``datasets``' Image
    feature, as there."""
    from PIL import Image

    data = cell.get("bytes") if isinstance(cell, dict) else cell
    if cell is None or (data is None and not (isinstance(cell, dict) and cell.get("path"))):
        raise DataUnavailableError(f"{where}: has no image; replace that row's image or the file")
    try:
        if data is None:
            from datasets import Image as ImageFeature

            return np.asarray(ImageFeature().decode_example(cell), dtype=np.uint8)
        return np.asarray(Image.open(io.BytesIO(data)), dtype=np.uint8)
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, zlib.error, ...
        raise DataUnavailableError(f"{where}: image cannot be decoded ({_reason(exc)}); replace that row's"
                                   " image or the file") from exc


def _reason(exc: Exception) -> str:
    """PIL's message in one line, without the address of the in-memory file it was given."""
    text = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(exc))
    return " ".join(text.split()) or type(exc).__name__


def _dims(shape: tuple[int, ...]) -> str:
    """(28, 28) -> '28x28 (grey)'; (32, 32, 3) -> '32x32x3'."""
    return "x".join(map(str, shape)) + (" (grey)" if len(shape) == 2 else "")
