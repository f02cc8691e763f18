#!/usr/bin/env python
"""Timing data: parquet files with the Hugging Face hub's schema and the real datasets' shapes and
sizes, filled with generated images. Not a test; run by hand where the real files are absent (a
GPU machine that cannot reach the hub):

    python bench/fake_data.py --out /tmp/data --datasets mnist,cifar10
    FL_DATA_DIR=/tmp/data python bench/overhead.py --mode sim ...

What it guarantees: ``<out>/<name>/{train,test}.parquet`` with the column names, image size,
channels, PNG encoding, row counts and 10 balanced labels of the real dataset, so every loading,
partitioning and training step does the same work as on the real files. Each class is a fixed
random template plus per-image noise, so a model learns it (accuracy rises above chance) while
the numbers say nothing about the real dataset's accuracy. Seeded: the same files every time.
"""

from __future__ import annotations

import argparse
import io
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

# name -> (image column, height, width, channels, train rows, test rows): the hub datasets' shapes
SHAPES = {
    "mnist": ("image", 28, 28, 1, 60_000, 10_000),
    "fashion_mnist": ("image", 28, 28, 1, 60_000, 10_000),
    "cifar10": ("img", 32, 32, 3, 50_000, 10_000),
}
# the hub files' class names, written into the schema's "huggingface" features as the hub does
# (without them `datasets` reads the image column as a plain struct, not as images)
LABEL_NAMES = {
    "mnist": [str(i) for i in range(10)],
    "fashion_mnist": ["T - shirt / top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                      "Bag", "Ankle boot"],
    "cifar10": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
}
CLASSES = 10


def _png_chunk(args: tuple[int, int, int, int, int, int]) -> list[bytes]:
    """PNG bytes of ``count`` images of ``label`` (templates seeded by the shape, noise by ``seed``)."""
    from PIL import Image

    label, count, h, w, c, seed = args
    templates = np.random.default_rng([h, w, c]).uniform(0, 255, size=(CLASSES, h, w, c))
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 60, size=(count, h, w, c))
    images = np.clip(templates[label] + noise, 0, 255).astype(np.uint8)
    out = []
    for image in images:
        buf = io.BytesIO()
        Image.fromarray(image[..., 0] if c == 1 else image).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def write_split(path: Path, name: str, rows: int, seed: int, workers: int) -> None:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    column, h, w, c = SHAPES[name][:4]
    labels = np.arange(rows) % CLASSES
    np.random.default_rng(seed).shuffle(labels)
    jobs = [(label, int((labels == label).sum()), h, w, c, seed * 100 + label) for label in range(CLASSES)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        per_label = list(pool.map(_png_chunk, jobs))
    images: list[bytes] = [b""] * rows
    for label, chunk in enumerate(per_label):
        for i, data in zip(np.flatnonzero(labels == label), chunk):
            images[i] = data
    struct = pa.StructArray.from_arrays([pa.array(images, pa.binary()), pa.array([None] * rows, pa.string())],
                                        names=["bytes", "path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    features = {column: {"_type": "Image"}, "label": {"names": LABEL_NAMES[name], "_type": "ClassLabel"}}
    table = pa.table({column: struct, "label": pa.array(labels.astype(np.int64))})
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the data folder to write (FL_DATA_DIR)")
    p.add_argument("--datasets", default="mnist", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the real row counts (e.g. 0.01 to try it)")
    p.add_argument("--workers", type=int, default=8)
    args = p.parse_args(argv)
    for name in [n.strip() for n in args.datasets.split(",") if n.strip()]:
        if name not in SHAPES:
            p.error(f"--datasets {name!r}: valid names are {', '.join(SHAPES)}")
        train, test = SHAPES[name][4:]
        for seed, (split, rows) in enumerate((("train", train), ("test", test))):
            n = max(CLASSES, int(rows * args.scale))
            write_split(Path(args.out) / name / f"{split}.parquet", name, n, seed + 1, args.workers)
            print(f"{name}/{split}.parquet: {n} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
