"""Time a small real deployment (TLS SuperLink + SuperNodes on loopback) per isolation mode.

    python scripts/deploy_timing.py --isolation subprocess process --rounds 2 --nodes 2

Prints, per mode, the wall time of ``flwr run`` (submit to finish) and the per-round
``round_seconds`` from metrics.csv. Uses ``runner/deploy.py``; everything it starts is stopped
at the end. Numbers depend on the machine's load: compare modes measured back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.deploy import TLS, LocalDeployment  # noqa: E402
from runner.results.report import read_metrics  # noqa: E402


def time_mode(isolation: str, tls: TLS, args, work: Path) -> dict:
    extra_env = {"FL_DATA_DIR": str(Path(args.data_dir).resolve())}
    if args.poll_interval:
        extra_env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(args.poll_interval)
    deployment = LocalDeployment(tls=tls, isolation=isolation, home=work / f"home-{isolation}",
                                 extra_env=extra_env)
    started = time.monotonic()
    try:
        deployment.start_superlink()
        for k in range(args.nodes):
            if args.files:  # the same partition, exported by scripts/export_partitions.py
                deployment.add_supernode({"data-path": str(args.files / f"partition-{k}.parquet")})
            else:
                deployment.add_supernode({"partition-id": k, "num-partitions": args.partitions})
        ready = time.monotonic()
        rc = deployment.run({
            "strategy": args.strategy, "num-server-rounds": args.rounds, "fraction-fit": 1.0,
            "min-available-clients": args.nodes, "model": args.model, "dataset": "mnist",
            "checkpoint-every": 0, "results-dir": str(work / "results"), "run-name": isolation,
            "partitioner": "dirichlet", "alpha": 0.3, "seed": 0,
        }, timeout=args.timeout)
        done = time.monotonic()
    finally:
        survivors = deployment.close()
    rows = read_metrics(work / "results" / isolation)
    return {
        "isolation": isolation, "node_data": "data-path" if args.files else "partition-id", "rc": rc, "startup_s": round(ready - started, 1),
        "run_s": round(done - ready, 1), "round_s": [round(r["round_seconds"], 1) for r in rows],
        "final_accuracy": rows[-1]["test_accuracy"] if rows else None, "survivors": survivors,
        "load_avg_1min": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isolation", nargs="+", default=["subprocess", "process"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--strategy", default="fedavg")
    parser.add_argument("--model", default="cnn-small")
    parser.add_argument("--data-dir", default=os.environ.get("FL_DATA_DIR", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--poll-interval", type=float, default=0.0,
                        help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL in seconds (Flower's default: 1)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--data-path", action="store_true",
                        help="nodes read their partition from exported parquet files (data-path)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fl-drift-timing-"))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_certs.py"), "--out", str(work / "certs"),
                    "--host", "127.0.0.1"], check=True, capture_output=True)
    tls = TLS.in_dir(work / "certs")
    args.files = None
    if args.data_path:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "export_partitions.py"), "--dataset", "mnist",
                        "--num-partitions", str(args.partitions), "--ids", *map(str, range(args.nodes)),
                        "--data-dir", args.data_dir, "--out", str(work / "parts")], check=True, capture_output=True)
        args.files = work / "parts" / f"mnist-dirichlet-a0.3-seed0-{args.partitions}"
    for isolation in args.isolation:
        print(json.dumps(time_mode(isolation, tls, args, work)), flush=True)


if __name__ == "__main__":
    main()
