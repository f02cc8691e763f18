"""An image that cannot be decoded and a partition too small for its local test split
(``client-test-fraction``) are refused by ``--check`` and before launch, in one line naming the
file and row, or the partition, its size and the keys, not inside the clients in 160-270 lines
of Ray and Flower tracebacks. Small generated parquet files (the hub's schema),
no simulation."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

import run_simulation
from tasks.datasets import DataUnavailableError, PartitionError, decode_images
from tasks.decoded import check_images, decoded_split, kept_path
from tasks.partitioning import PartitionSpec, check_data, local_split_sizes


def png(shape=(28, 28), seed: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def mnist_folder(folder: Path, rows: int = 30, bad: dict | None = None, split: str = "train") -> Path:
    """``folder``/mnist/{train,test}.parquet of ``rows`` random 28 x 28 PNGs (the hub's schema: an
    ``image`` struct of ``bytes`` and ``path``, and ``label``); ``bad``: {row: bytes} put in ``split``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "mnist").mkdir(parents=True)
    for name in ("train", "test"):
        cells = [{"bytes": png(seed=i), "path": None} for i in range(rows)]
        for row, data in (bad or {}).items() if name == split else ():
            cells[row] = {"bytes": data, "path": None}
        pq.write_table(pa.table({"image": cells, "label": [i % 10 for i in range(rows)]}),
                       folder / "mnist" / f"{name}.parquet")
    return folder


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def spec_of(data: Path, n: int = 4, **keys) -> PartitionSpec:
    return PartitionSpec(dataset="mnist", num_partitions=n, partitioner=keys.pop("partitioner", "iid"),
                         data_dir=str(data), **keys)


# ---- (a) an image that cannot be decoded ------------------------------------------------------------

def test_a_corrupt_image_is_refused_by_check_and_before_launch(tmp_path, capsys):
    data = mnist_folder(tmp_path / "data", bad={12: b"not a png at all"})
    argv = ["--dataset", "mnist", "--set", "model=cnn-small", "--set", "partitioner=iid", "--data-dir", str(data),
            "--clients", "4", "--out", str(tmp_path / "o")]
    for check in (["--check"], []):  # --check, and a launch (refused before anything starts)
        assert run_simulation.main([*argv, *check]) == 2
        err = one_line_error(capsys)
        assert (f"{data / 'mnist' / 'train.parquet'} row 12 (train split): image cannot be decoded"
                " (cannot identify image file)") in err, err
    assert not (tmp_path / "o" / "runs").exists()


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("damage, expected", [
    (lambda good: good[: len(good) // 2], "image cannot be decoded ("),  # a truncated PNG
    (lambda good: b"", "image cannot be decoded (cannot identify image file)"),
    (lambda good: png((32, 32, 3)), "image is 32x32x3, but mnist's images are 28x28 (grey)"),
], ids=["truncated", "empty", "wrong-shape"])
def test_the_data_check_names_the_file_row_and_split(tmp_path, split, damage, expected):
    data = mnist_folder(tmp_path / "data", bad={29: damage(png(seed=29))}, split=split)
    with pytest.raises(DataUnavailableError) as err:
        check_data(spec_of(data))
    text = str(err.value)
    assert f"{data / 'mnist' / split}.parquet row 29 ({split} split): {expected}" in text
    assert "\n" not in text and "BytesIO" not in text


def test_each_file_is_decoded_once_and_kept(tmp_path, monkeypatch):
    """The decoded array is kept in the cache folder, keyed by the file's path, size and mtime:
    a second check decodes nothing, a rewritten file is decoded again."""
    import PIL.Image

    monkeypatch.setenv("FL_DRIFT_CACHE", str(tmp_path / "cache"))
    data = mnist_folder(tmp_path / "data", rows=12)
    files = {split: str(data / "mnist" / f"{split}.parquet") for split in ("train", "test")}
    check_images("mnist", files)
    kept = decoded_split("mnist", files["train"], "train")
    import pyarrow.parquet as pq

    from tasks.catalogue import DATASETS

    cells = pq.read_table(files["train"]).column("image").to_pylist()
    assert kept.dtype == np.uint8 and np.array_equal(kept, decode_images(cells, None, DATASETS["mnist"]))

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again")

    with monkeypatch.context() as patched:
        patched.setattr(PIL.Image, "open", no_decoding)
        check_images("mnist", files)  # a hit: nothing decoded
        mnist_folder(tmp_path / "other", rows=13)
        os.replace(tmp_path / "other" / "mnist" / "train.parquet", files["train"])  # another file, same path
        with pytest.raises(DataUnavailableError, match="decoded again"):
            check_images("mnist", files)
    check_images("mnist", files)
    assert decoded_split("mnist", files["train"], "train").shape == (13, 28, 28)
    assert len(list(kept_path(files["train"], "image").parent.glob("*.npy"))) == 2  # the old train array replaced


# ---- (b) a partition too small for its local test split -----------------------------------------

def test_a_partition_too_small_for_its_local_test_split_is_refused_before_launch(tmp_path, capsys):
    """The report: quantity, min-partition-size 1, client-test-fraction 0.5. Dir(alpha = 1e9)
    sizes of 30 rows over 20 clients are 1 or 2 each, whatever the seed."""
    data = mnist_folder(tmp_path / "data", rows=30)
    argv = ["--dataset", "mnist", "--set", "model=cnn-small", "--data-dir", str(data), "--clients", "20",
            "--alpha", "1e9", "--set", "partitioner=quantity", "--set", "min-partition-size=1",
            "--set", "client-test-fraction=0.5", "--out", str(tmp_path / "o")]
    for check in (["--check"], []):
        assert run_simulation.main([*argv, *check]) == 2
        err = one_line_error(capsys)
        assert ("has 1 example(s): too few for a local test split (client-test-fraction = 0.5 holds out 1 and"
                " leaves 0 to train on)") in err, err
        assert "quantity partitions too small (alpha=1000000000.0, min-partition-size=1)" in err, err
    assert not (tmp_path / "o" / "runs").exists()


def test_the_local_split_check_counts_as_the_client_cuts(tmp_path):
    data = mnist_folder(tmp_path / "data", rows=30)
    check_data(spec_of(data, n=15), test_fraction=0.5)  # 2 each: 1 held out, 1 trained on
    with pytest.raises(PartitionError, match=r"^partition 0 has 2 example\(s\): .* = 0.6 holds out 2 and leaves 0"):
        check_data(spec_of(data, n=15), test_fraction=0.6)  # ceil(1.2) = 2 held out: the Dataset cut refuses it
    with pytest.raises(PartitionError, match=r"leaves 1 to train on, fewer than the smallest batch the model trains"
                                             r" on \(2\)\): 15 of 15 iid partitions too small"):
        check_data(spec_of(data, n=15), 2, 0.5)  # a BatchNorm1d model needs two
    assert [local_split_sizes(n, 0.25) for n in (1, 4, 5)] == [(0, 1), (3, 1), (3, 2)]
