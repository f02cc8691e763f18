"""The one line a run reports when it finds no data: the real cause named.

Without ``data-dir`` a run reads ``$FL_DATA_DIR`` from the environment of the process that runs
its ServerApp. Under ``flwr run`` that process descends from the local SuperLink that ``flwr
run`` starts on first use and leaves running for the next one (README: "the SuperLink keeps
running"); the SuperLink keeps the environment of the shell it was started from. So a
``FL_DATA_DIR`` exported after a first, failed ``flwr run`` is not seen by the second: the
SuperLink must be stopped first. When no data folder is set and the Hugging Face hub fails
too (``HubUnavailableError``), ``explained`` says which of the two facts the user can act on:

- the ServerApp runs on a local SuperLink on which an earlier fl-drift run ran, so one that an
  earlier ``flwr run`` started: that SuperLink's environment (no ``FL_DATA_DIR``) is named
  first, with how to stop it;
- a local SuperLink started for this run: no data folder is set and the hub is unreachable;
  set ``FL_DATA_DIR``, and stop the SuperLink before the next run, since it keeps its
  environment;
- no local SuperLink (a deployment, the runner's private SuperLink, a test): the error's own
  line (no data folder, the hub's error, what to set).

Which runs a SuperLink has served is not something Flower tells a ServerApp, so each ServerApp
on a local SuperLink notes it in ``RUNS_FILE``, beside the SuperLink's database and log: the
SuperLink's PID and start time, written by the first run on it and found by the next ones
(``this_superlink``, once per ServerApp process: Flower starts one for each run).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from fl_app.common.procfs import ancestors, command_line, started_at
from tasks.datasets import DataUnavailableError, HubUnavailableError

# ``flwr run`` keeps the SuperLink it starts on its own in $FLWR_HOME/local-superlink/ (its
# --database and --log-file); README's kill line finds it by that path.
LOCAL_SUPERLINK_FOLDER = "local-superlink"
RUNS_FILE = "fl-drift-superlink"  # in that folder: "<PID> <start time>" of the SuperLink an fl-drift run ran on


@dataclass(frozen=True)
class LocalSuperLink:
    """The SuperLink that ``flwr run`` started on its own, running this ServerApp."""

    pid: int
    age: float  # seconds from its start to the start of this ServerApp's process
    earlier: bool  # an earlier fl-drift run ran on it: an earlier ``flwr run`` started it


def local_superlink(pid: int | None = None) -> LocalSuperLink | None:
    """The local SuperLink among the ancestors of ``pid`` (this process by default): a
    ``flower-superlink`` whose files are in ``<FLWR_HOME>/local-superlink/``, with its age at
    ``pid``'s start and whether an earlier run noted it in ``RUNS_FILE`` (this call notes it
    for the next run). None elsewhere: a deployment's or the runner's SuperLink, none (tests),
    or no /proc to read."""
    pid = os.getpid() if pid is None else pid
    for ancestor in ancestors(pid):
        args = command_line(ancestor)
        folders = [Path(arg).parent for arg in args if f"{LOCAL_SUPERLINK_FOLDER}/" in arg]
        if folders and any(Path(arg).name == "flower-superlink" for arg in args[:2]):
            start, own = started_at(ancestor), started_at(pid)
            if start is None or own is None:
                return None
            earlier = noted_before(folders[0] / RUNS_FILE, f"{ancestor} {start:.2f}")
            return LocalSuperLink(ancestor, own - start, earlier)
    return None


def noted_before(runs_file: Path, superlink: str) -> bool:
    """Whether ``runs_file`` names ``superlink`` already; it does after this call (when the
    folder is writable: otherwise every run counts as the first)."""
    try:
        if runs_file.read_text() == superlink:
            return True
    except OSError:
        pass
    try:
        runs_file.write_text(superlink)
    except OSError:
        pass
    return False


@functools.cache
def this_superlink() -> LocalSuperLink | None:
    """``local_superlink()`` of this ServerApp's process, looked up once: the ServerApp asks
    when it starts (so the run is noted whether it fails or not) and ``loud`` when it reports."""
    return local_superlink()


def explained(exc: BaseException, superlink: LocalSuperLink | None) -> BaseException:
    """``exc``, or for a ``HubUnavailableError`` under a local SuperLink a
    ``DataUnavailableError`` whose one line names the real cause (see the module docstring):
    its message is what the run's log and ``flwr ls`` (status-details) show."""
    if not isinstance(exc, HubUnavailableError) or superlink is None:
        return exc
    folder = f"<a folder holding {exc.dataset}/train.parquet and {exc.dataset}/test.parquet>"
    stop = f"`kill {superlink.pid}`, README's kill line"
    if superlink.earlier:
        return DataUnavailableError(
            f"no data for {exc.dataset!r}: FL_DATA_DIR is not set in the environment of the local SuperLink that"
            f" runs this app (PID {superlink.pid}), which an earlier `flwr run` started {superlink.age:.0f} s before"
            f" this run; a SuperLink keeps the environment it was started with, so a FL_DATA_DIR exported since is"
            f" not seen: stop it ({stop}), export FL_DATA_DIR={folder} if it is not, and run again. The Hugging"
            f" Face hub failed too for {exc.hub_id!r} ({exc.reason}).")
    return DataUnavailableError(
        f"no data for {exc.dataset!r}: no data folder is set (env FL_DATA_DIR or run-config 'data-dir') and the"
        f" Hugging Face hub failed for {exc.hub_id!r} ({exc.reason}). Export FL_DATA_DIR={folder}, stop the local"
        f" SuperLink that this `flwr run` started ({stop}: it keeps the environment it was started with) and run"
        f" again.")
