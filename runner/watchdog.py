"""The watchdog of a launcher: stops what the launcher started once the launcher is gone.

``LocalSimulation.start()`` starts one before its SuperLink:

    python -m runner.watchdog --marker FLWR_HOME=<home> [--remove DIR ...]

in a session of its own (a terminal's Ctrl-C or hang-up reaches the launcher, not it), with
its stdin a pipe whose only writer is the launcher. The kernel closes that pipe when the
launcher ends, by any signal (``kill -9`` included), so the watchdog's read returns.

- The launcher closed down normally (``LocalSimulation.close()`` stopped everything itself
  and wrote ``done``): the watchdog exits and touches nothing.
- Otherwise (end of file without ``done``: the launcher died): every process whose
  environment has the marker is stopped (``stop_marked``: SIGTERM, SIGKILL 5 s later). All
  processes a launcher starts inherit its private ``FLWR_HOME`` (SuperLink, SuperExec, the
  ``flwr-simulation`` process, ``flwr run``, Ray's GCS, raylet and workers), also those that
  Flower starts in sessions of their own, which a process-group kill would miss. Then the
  ``--remove`` folders are deleted (Ray's private temp folder and the launcher's own
  FLWR_HOME), and the watchdog exits: within about 10 s of the launcher's death.

A descriptor the launcher hands over (``pass_fds``: the results folder's lock) stays open in
the watchdog until its work is done, so a second runner cannot take that folder while the
dead runner's processes may still write into it.

``run_simulation.py --parallel N`` runs N ``LocalSimulation`` workers, so N watchdogs watch one
runner, each for its own worker's ``FLWR_HOME`` and each holding the folder's lock: the folder
is free again only once every worker's processes are gone (tests/test_parallel.py).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys

from runner.processes import stop_marked

DONE = b"done"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stop a dead launcher's processes (see the module docstring)")
    parser.add_argument("--marker", required=True, metavar="NAME=VALUE", help="environment entry of its processes")
    parser.add_argument("--remove", action="append", default=[], metavar="DIR", help="temporary folder to remove")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    told = sys.stdin.buffer.read()  # returns when the launcher closes the pipe or dies
    if told.strip() == DONE:
        return 0
    name, value = args.marker.split("=", 1)
    left = stop_marked(name, value)
    for folder in args.remove:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
