#!/usr/bin/env python
"""Seconds to load a dataset's client partitions in a fresh process, the way a client process
loads them (``tasks.partitioning.load_partition``), from the kept decoded arrays
(``tasks/decoded.py``) or through ``datasets`` (``FL_DRIFT_DECODED=0``). Not a test; run by hand:

    FL_DATA_DIR=/path/to/data python bench/load_partitions.py              # MNIST, 100 clients, both paths
    FL_DATA_DIR=/path/to/data python bench/load_partitions.py --set dataset=cifar10 --paths decoded

Each path runs in its own child process (nothing imported or cached before it), after one
untimed ``check_data`` in the parent (as the runner's preflight does: it remembers the
partitioning and keeps the decoded arrays, so neither path pays that once-per-file work).
A child prints the seconds of its first partition (the partitioning built or read: the
``datasets`` path builds flwr-datasets' FederatedDataset) and of all partitions, and the
1-minute load before it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(cfg: dict, clients: int) -> dict:
    t0 = time.perf_counter()
    from tasks.partitioning import PartitionSpec, load_partition

    imported = time.perf_counter()
    spec = PartitionSpec.from_config(cfg, clients)
    firsts, rows = [], 0
    for pid in range(clients):
        x, _ = load_partition(spec, pid)
        rows += len(x)
        firsts.append(time.perf_counter())
    return {"import_s": imported - t0, "first_s": firsts[0] - imported, "all_s": firsts[-1] - imported,
            "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--paths", default="datasets,decoded", help="comma-separated: datasets, decoded")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from fl_app.registry import parse_override, validate_config

    cfg = validate_config({"dataset": "mnist", "data-dir": os.environ.get("FL_DATA_DIR", ""),
                           **dict(parse_override(t) for t in args.overrides)})
    if args.child:
        print(json.dumps(child(cfg, args.clients)))
        return 0
    from tasks.partitioning import PartitionSpec, check_data

    check_data(PartitionSpec.from_config(cfg, args.clients))
    for path in args.paths.split(","):
        env = {**os.environ, "FL_DRIFT_DECODED": "1" if path == "decoded" else "0"}
        load = float(Path("/proc/loadavg").read_text().split()[0])
        out = subprocess.run([sys.executable, __file__, "--child", "1", "--clients", str(args.clients),
                              *[f"--set={t}" for t in args.overrides]], env=env, capture_output=True, text=True)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{path}: first partition {r['first_s']:.2f} s, all {args.clients}"
              f" partitions {r['all_s']:.2f} s ({r['rows']:,} images, {1e6 * r['all_s'] / r['rows']:.0f} us an"
              f" image), load before {load:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
