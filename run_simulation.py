#!/usr/bin/env python
"""Compare methods on the same split, model and budget with Flower's simulation (`flwr run`).

The runner's entry point: ``python run_simulation.py --help`` prints its usage (the docstring of
``runner/cli.py``, which parses the arguments). The steps live in ``runner/``: the checks before
anything is launched (``runner/checks.py``), the sweep that launches the runs and writes the
comparison (``runner/sweep.py``). An explicit ``--data-dir`` that does not exist is refused
before torch and Flower are imported (``runner/early.py``).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from runner.early import refuse_missing_data_dir  # plain: no torch, no Flower

if __name__ == "__main__":
    refuse_missing_data_dir(sys.argv[1:])

from runner.cli import parse_args
from runner.quiet import quiet_libraries
from runner.sweep import run_comparison


def main(argv: list[str] | None = None) -> int:
    """parse -> validate -> plan -> launch -> report. Exit codes: 0 done, 1 a run failed,
    2 refused before anything was launched, 130 interrupted (Ctrl-C: one line, no traceback)."""
    # SIGTERM (a job scheduler, `timeout`) unwinds like Ctrl-C, so the private SuperLink and
    # everything it started are stopped; finished runs and checkpoints stay for --resume.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args = parse_args(argv)
    quiet_libraries(args.verbose)  # runner/quiet.py: hidden unless --verbose
    if args.list:
        from runner.listing import listing

        print(listing(args.list))
        return 0
    out = Path(args.out or f"results/compare-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    try:
        return run_comparison(args, out)
    except KeyboardInterrupt:  # every process of the runs is stopped by then (runner/parallel.py)
        kept = (f"the runs finished or checkpointed in {out} are kept: run_simulation.py --resume {out} continues"
                " them" if (out / "runner.json").exists() else "nothing was launched")
        print(f"\ninterrupted (Ctrl-C): {kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
