"""The watchdog of a launcher: stops what the launcher started once the launcher is gone.

``LocalSimulation.start()`` starts one before its SuperLink:

    python -m runner.watchdog --make FLWR_HOME=fl-drift-flwr- --make RAY_TMPDIR=fl-ray-
    python -m runner.watchdog --marker FLWR_HOME=<home> [--marker NAME=VALUE ...] [--remove DIR ...]

in a session of its own (a terminal's Ctrl-C or hang-up reaches the launcher, not it), with
its stdin a pipe whose only writer is the launcher. The kernel closes that pipe when the
launcher ends, by any signal (``kill -9`` included), so the watchdog's read returns.

The watchdog makes the launcher's temporary folders itself (``--make NAME=PREFIX``: it prints
``NAME=<folder>`` for the launcher to read, and takes that entry as a marker and the folder as
one to remove): no instant exists at which the launcher can die leaving a folder that no
watchdog removes (a runner killed between making its FLWR_HOME and starting its watchdog
would leave an empty ``fl-drift-flwr-*``).

- The launcher closed down normally (``LocalSimulation.close()`` stopped everything itself
  and wrote ``done``): the watchdog exits and touches nothing.
- Otherwise (end of file without ``done``: the launcher died): every process whose
  environment has a marker, and every process in a session that such a process leads, is
  stopped (``stop_marked``: SIGTERM, SIGKILL 5 s later). All processes a launcher starts
  inherit its private ``FLWR_HOME`` and Ray's private ``RAY_TMPDIR`` (SuperLink, SuperExec,
  the ``flwr-simulation`` process, ``flwr run``, Ray's GCS, raylet, dashboard, agents and
  workers), also those that Flower starts in sessions of their own, which a process-group
  kill would miss. Ray's renamed agents and idle workers (``ray::DashboardAgent``,
  ``ray::RuntimeEnvAgent``, ``ray::IDLE``) may show neither marker in /proc (their
  environment block is partly zeroed), but they run in the session of the SuperExec that
  started the simulation, which carries the marker. The sessions of the launcher and its
  ancestors (taken when the watchdog starts) are never ended. Then the folders are deleted
  (Ray's private temp folder and the launcher's own FLWR_HOME), and the watchdog exits:
  within about 10 s of the launcher's death.

A descriptor the launcher hands over (``pass_fds``: the results folder's lock) stays open in
the watchdog until its work is done, so a second runner cannot take that folder while the
dead runner's processes may still write into it.

``run_simulation.py --parallel N`` runs N ``LocalSimulation`` workers, so N watchdogs watch one
runner, each for its own worker's ``FLWR_HOME`` and each holding the folder's lock: the folder
is free again only once every worker's processes are gone (tests/runner/test_parallel.py).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile

from runner.processes import Marker, spared_sessions, stop_marked

DONE = b"done"


def entry(text: str) -> Marker:
    name, sep, value = text.partition("=")
    if not (sep and name and value):
        raise argparse.ArgumentTypeError(f"NAME=VALUE expected, not {text!r}")
    return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stop a dead launcher's processes (see the module docstring)")
    parser.add_argument("--marker", action="append", default=[], type=entry, metavar="NAME=VALUE",
                        help="environment entry of its processes")
    parser.add_argument("--make", action="append", default=[], type=entry, metavar="NAME=PREFIX",
                        help="make a temporary folder (tempfile.mkdtemp(prefix=PREFIX)), print NAME=<folder>,"
                             " and take NAME=<folder> as a marker and the folder as one to remove")
    parser.add_argument("--remove", action="append", default=[], metavar="DIR", help="temporary folder to remove")
    args = parser.parse_args(argv)
    if not args.marker and not args.make:
        parser.error("a --marker or a --make is needed")
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    spare = spared_sessions()  # the launcher's and its ancestors' sessions, taken while it runs
    markers, remove = list(args.marker), list(args.remove)
    try:
        for name, prefix in args.make:
            folder = tempfile.mkdtemp(prefix=prefix)
            markers.append((name, folder))
            remove.append(folder)
            print(f"{name}={folder}", flush=True)
        told = sys.stdin.buffer.read()  # returns when the launcher closes the pipe or dies
    except BrokenPipeError:  # the launcher died before it read the folders
        told = b""
    if told.strip() == DONE:
        return 0
    left = stop_marked(markers, spare=spare)
    for folder in remove:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
