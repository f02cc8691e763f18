"""Write partitions of a named dataset as parquet files, one per SuperNode's ``data-path``.

    python scripts/export_partitions.py --dataset mnist --num-partitions 20 --out parts \
        [--partitioner dirichlet --alpha 0.3 --seed 0 --data-dir /path/to/data] [--ids 0 1]

writes ``parts/mnist-dirichlet-a0.3-seed0-20/partition-<k>.parquet``: exactly the rows that
``partition-id=k num-partitions=20`` gives under the same run-config keys, in the dataset's
own schema. Copy one file to each device and start its SuperNode with
``--node-config 'data-path="/path/partition-k.parquet"'``: the device then needs only its
own file, not the whole dataset.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app.registry import validate_config  # noqa: E402
from tasks.partitioning import PartitionSpec, federated_dataset  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--num-partitions", type=int, required=True)
    parser.add_argument("--partitioner", default="dirichlet")
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--shards-per-client", type=int, default=2)
    parser.add_argument("--min-partition-size", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default="", help="folder with <dataset>/train.parquet (or $FL_DATA_DIR)")
    parser.add_argument("--ids", type=int, nargs="*", help="partition ids to write (default: all)")
    parser.add_argument("--out", default="partitions")
    args = parser.parse_args(argv)
    cfg = validate_config({
        "dataset": args.dataset, "model": "cnn", "partitioner": args.partitioner, "alpha": args.alpha,
        "shards-per-client": args.shards_per_client, "min-partition-size": args.min_partition_size,
        "seed": args.seed, "data-dir": args.data_dir,
    })
    if args.dataset == "synthetic":
        raise SystemExit("synthetic data has no image schema; use partition-id nodes for it")
    spec = PartitionSpec.from_config(cfg, args.num_partitions)
    folder = Path(args.out) / (
        f"{args.dataset}-{args.partitioner}-a{args.alpha}-seed{args.seed}-{args.num_partitions}"
    )
    folder.mkdir(parents=True, exist_ok=True)
    fds = federated_dataset(spec)
    for k in args.ids if args.ids else range(args.num_partitions):
        path = folder / f"partition-{k}.parquet"
        part = fds.load_partition(k, "train")
        part.to_parquet(str(path))
        print(f"{path}: {len(part)} examples")


if __name__ == "__main__":
    main()
