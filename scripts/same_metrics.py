"""Check that a refactoring changed no result: seeded runs before and after give the same
metrics.csv, every column but the timings.

    python scripts/same_metrics.py run OUT [--methods fedavg,feddyn,...] [--rounds 3]
                                           [--execution per-client|cohort] [--set KEY=VALUE ...]
    python scripts/same_metrics.py compare OUT_BEFORE OUT_AFTER

``run`` runs each method once through ``flwr run`` on a private SuperLink (the app in the
current directory, synthetic data and logreg unless the method needs more, 4 SuperNodes, half
of them per round, seed 0) into OUT/<method>/; with ``--execution cohort`` the same 4 clients are
virtual clients of one cohort node (the cohort path); ``--set`` adds run-config keys to every
run (``checkpoint-every=0``: unmirrored client state). ``compare`` exits non-zero and names the first
difference when two such folders differ in any metrics.csv cell except the timing columns
(``*seconds*``) and ``ray_node``. Cells are compared as text, so equal means to the last digit.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app.registry import method_names  # noqa: E402
from runner.launch import LocalSimulation  # noqa: E402

NEEDS = {  # methods whose client needs something the synthetic/logreg default lacks
    "fedbn": {"dataset": "mnist", "model": "cnn-bn", "batch-size": 64, "num-server-rounds": 2},
    "moon": {"model": "mlp"},
    "fedpgvc": {"model": "mlp"},
    "dp-fedavg": {"dp-noise-seeded": True},  # its Gaussian noise from the run's seed, not the OS: comparable
}


def ignored(column: str) -> bool:
    return "seconds" in column or column == "ray_node"


def run(out: Path, methods: list[str], rounds: int, execution: str = "per-client", extra: dict | None = None) -> int:
    """Run each method; 1 if any run wrote no metrics.csv (``flwr run`` can exit 0 when the
    ServerApp refused to start, e.g. MNIST for FedBN without FL_DATA_DIR), else 0."""
    home = os.environ.get("FLWR_HOME")
    status = 0
    with LocalSimulation(home=Path(home) if home else None) as sim:
        for method in methods:
            cfg = {"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": rounds,
                   "fraction-fit": 0.5, "learning-rate": 0.05, "seed": 0, "results-dir": str(out.resolve()),
                   "run-name": method, **NEEDS.get(method, {}), **(extra or {})}
            if execution == "cohort":
                cfg.update({"execution": "cohort", "num-virtual-clients": 4})
            code = sim.run(cfg, num_supernodes=4)
            written = (out / method / "metrics.csv").is_file()
            print(f"{method}: exit {code}" + ("" if written else ", no metrics.csv: the run did not start or finish"
                                              " (FL_DATA_DIR set? FLWR_HOME=DIR keeps the SuperLink log)"), flush=True)
            status |= not written
    return status


def rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return [{k: v for k, v in row.items() if not ignored(k)} for row in csv.DictReader(f)]


def compare(before: Path, after: Path) -> int:
    """Compare every run of ``before`` with its namesake in ``after``; 1 if any differs."""
    names = sorted(p.name for p in before.iterdir() if (p / "metrics.csv").is_file())
    if not names:
        print(f"no runs under {before}")
        return 1
    status = 0
    for name in names:
        if not (after / name / "metrics.csv").is_file():
            print(f"{name}: no metrics.csv in {after / name}")
            status = 1
            continue
        a, b = rows(before / name / "metrics.csv"), rows(after / name / "metrics.csv")
        if len(a) != len(b):
            print(f"{name}: {len(a)} rows before, {len(b)} after")
            status = 1
            continue
        differ = sorted({k for ra, rb in zip(a, b) for k in set(ra) | set(rb) if ra.get(k) != rb.get(k)})
        if differ:
            print(f"{name}: columns that differ: {', '.join(differ)}")
            status = 1
        else:
            print(f"{name}: {len(a)} rows, {len(a[0]) if a else 0} columns compared: identical")
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--methods", default=",".join(method_names()))
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--execution", choices=("per-client", "cohort"), default="per-client")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a run-config key for every run (a number or true/false parsed as such)")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "compare":
        return compare(args.before, args.after)
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    return run(args.out, args.methods.split(","), args.rounds, args.execution, parsed_settings(args.set))


def parsed_settings(items: list[str]) -> dict:
    """``KEY=VALUE`` items as run-config entries: an int, float or true/false as such, else text."""
    settings = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        value: object = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    pass
        settings[key] = value
    return settings


if __name__ == "__main__":
    sys.exit(main())
