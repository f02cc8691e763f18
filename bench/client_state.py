#!/usr/bin/env python
"""Peak memory of stateful methods against the number of clients, client state in memory
(Flower's node context, held by the simulation for every client it has sampled) or on disk
(``client-state = "disk"``). Not a test; run by hand, one simulation at a time:

    FL_DATA_DIR=/path/to/data python bench/client_state.py --out /tmp/cs          # the grid
    python bench/client_state.py --out /tmp/cs --table                            # the table

Each cell is one ``bench/overhead.py --mode sim`` run (MNIST in 2 label shards per client,
``cnn``, C = 0.1, 3 rounds by default), whose sampler sums the PSS of every process of the run (SuperLink, SuperExec, the
simulation, Ray's daemons and actors) once a second; the peak is reported. A finished cell
(its JSON exists) is not run again. ``--lock FILE`` wraps every run in ``flock FILE``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def cell(out: Path, method: str, clients: int, mode: str) -> Path:
    return out / f"{method}-{clients}-{mode}.json"


def holding_state(clients: int, fraction: float, rounds: int, seed: int = 0) -> int:
    """Clients sampled at least once in ``rounds`` rounds: those with state after the run."""
    from overhead import sampled_partitions

    return len({p for draw in range(rounds) for p in sampled_partitions(seed, draw, clients, fraction)})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--methods", default="scaffold,feddyn")
    p.add_argument("--clients", default="100,500,1000")
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="cnn")
    p.add_argument("--set", dest="overrides", action="append", default=None, metavar="KEY=VALUE",
                   help="run-config keys for every cell (default: partitioner='shard', i.e. 2 label shards per "
                        "client, which any of these client counts can cut; Dirichlet 0.3 cannot give 1000 MNIST "
                        "clients 10 samples each)")
    p.add_argument("--lock", help="run each simulation under flock LOCK (shared machines)")
    p.add_argument("--table", action="store_true", help="only print the table of the finished cells")
    return p.parse_args(argv)


def run_cells(args: argparse.Namespace, out: Path, methods: list[str], sizes: list[int]) -> None:
    """One bench/overhead.py simulation per (method, client count, state mode) not yet run."""
    for method in methods:
        for n in sizes:
            for mode in ("memory", "disk"):
                path = cell(out, method, n, mode)
                if path.exists():
                    continue
                command = [sys.executable, str(ROOT / "bench" / "overhead.py"), "--mode", "sim",
                           "--clients", str(n), "--fraction", str(args.fraction), "--rounds", str(args.rounds),
                           "--model", args.model, "--set", f"strategy='{method}'",
                           "--set", f"client-state='{mode}'", "--json", str(path)]
                for text in args.overrides or ["partitioner='shard'"]:
                    command[-2:-2] = ["--set", text]
                if args.lock:
                    command = ["flock", args.lock, *command]
                print(f"{method} {n} clients, state in {mode}", flush=True)
                subprocess.run(command, check=True)


def print_table(args: argparse.Namespace, out: Path, methods: list[str], sizes: list[int]) -> None:
    """The markdown table of the finished cells."""
    print(f"| method | clients | clients per round | clients holding state after {args.rounds} rounds "
          "| peak PSS, state in memory (MiB) | peak PSS, state on disk (MiB) | difference (MiB) "
          "| seconds (memory / disk) |")
    print("|---|---|---|---|---|---|---|---|")
    for method in methods:
        for n in sizes:
            runs = {}
            for mode in ("memory", "disk"):
                path = cell(out, method, n, mode)
                if path.exists():
                    runs[mode] = json.loads(path.read_text())["passes"][0]["sim"]
            if not runs:
                continue
            pss = {m: f"{r['peak_pss_mib']:.0f}" for m, r in runs.items()}
            secs = " / ".join(f"{runs[m]['wall_s']:.0f}" if m in runs else "-" for m in ("memory", "disk"))
            diff = (f"{runs['memory']['peak_pss_mib'] - runs['disk']['peak_pss_mib']:.0f}"
                    if len(runs) == 2 else "-")
            print(f"| {method} | {n} | {max(int(n * args.fraction), 1)} | {holding_state(n, args.fraction, args.rounds)} "
                  f"| {pss.get('memory', '-')} | {pss.get('disk', '-')} | {diff} | {secs} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    methods, sizes = args.methods.split(","), [int(n) for n in args.clients.split(",")]
    if not args.table:
        run_cells(args, out, methods, sizes)
    print_table(args, out, methods, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
