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


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler, ``timeout``), raised where Ctrl-C's KeyboardInterrupt would be, so
    that it unwinds the same way: the private SuperLink and everything it started are stopped, and
    finished runs and checkpoints stay for --resume."""


def terminated(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """parse -> validate -> plan -> launch -> report. Exit codes: 0 done, 1 a run failed,
    2 refused before anything was launched, 130 interrupted (Ctrl-C) and 143 (SIGTERM): one line
    saying what is kept, no traceback."""
    signal.signal(signal.SIGTERM, terminated)
    args = parse_args(argv)
    quiet_libraries(args.verbose)  # runner/quiet.py: hidden unless --verbose
    if args.list:
        from runner.listing import listing

        print(listing(args.list))
        return 0
    out = Path(args.out or f"results/compare-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    try:
        return run_comparison(args, out)
    except KeyboardInterrupt as exc:  # every process of the runs is stopped by then (runner/parallel.py)
        kept = (f"the runs finished or checkpointed in {out} are kept: run_simulation.py --resume {out} continues"
                " them" if (out / "runner.json").exists() else "nothing was launched")
        by = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        print(f"\ninterrupted ({by}): {kept}", file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
